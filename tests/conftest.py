"""Suite-wide settings: quiet Prefect, no progress bars, one Prefect test server per session."""

import os

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ["RLANYTHING_PROGRESS"] = "0"
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # as the CLI sets it: see rlanything/cli.py
# `precision: auto` reads the CPU's flags (models/precision.py): with none, every machine the
# suite runs on resolves it to fp32 alike, so figures compared across runs and machines hold.
# Tests of bf16 set a precision explicitly, or these flags.
os.environ["RLANYTHING_CPU_FLAGS"] = ""

import shutil  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# Folders of session-scoped fixtures start with this; every other folder a module's fixtures make
# is removed when the module ends (see _module_scratch_removed).
SESSION_SCRATCH = "session-"
_FAILED_MODULES = pytest.StashKey[set]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.session.stash.setdefault(_FAILED_MODULES, set()).add(item.path)
    return report


@pytest.fixture(scope="module", autouse=True)
def _module_scratch_removed(request, tmp_path_factory):
    """A whole suite's run folders (checkpoints, run stores) come to several GB, more than a CI
    machine's free disk may hold: the folders a module's fixtures made go when the module ends,
    unless one of its tests failed (then they stay, like a failed test's tmp_path)."""
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    if request.node.path in request.session.stash.get(_FAILED_MODULES, set()):
        return
    for path in set(base.iterdir()) - before:
        # pytest's "<name>current" entries are symlinks to the folders themselves
        if path.is_dir() and not path.is_symlink() and not path.name.startswith(SESSION_SCRATCH):
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def prefect_server():
    """A real (temporary, SQLite) Prefect server shared by every flow test: start it once."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from rlanything.models.loading import tiny_model_dir

    return tiny_model_dir()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from rlanything.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="session")
def prefect_api_url(prefect_server) -> str:
    """PREFECT_API_URL of the session's test server, for subprocesses (no ephemeral servers)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def small_overrides() -> list[str]:
    """configs/tiny.yaml at its smallest: 2 problems × 2 rollouts, rule-based rewrites."""
    return [
        "env.num_problems=2",
        "policy.tasks_per_iteration=2",
        "policy.group_size=2",
        "adapt.rewriter=rule",
        "adapt.critic=extractive",
    ]


@pytest.fixture(scope="session")
def small_run(prefect_server, tmp_path_factory, small_overrides) -> dict:
    """An uninterrupted two-iteration run of tiny.yaml + small_overrides, named "small": the
    reference of the resume tests, and the input of the reports and notebook tests."""
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp(SESSION_SCRATCH + "small-run")
    return train_flow(str(REPO / "configs" / "tiny.yaml"), [f"run.root={root}", "run.name=small", *small_overrides], 2)


@contextmanager
def _tokens_fed(model):
    """-> list of (rows, non-pad tokens) of every forward of `model` inside the block: what an
    engine really ran (a decode step feeds one token per row, a prefill its prompts). A forward
    over prefix trees (a 4D mask, models.training.packing) counts every column: the trees' nodes."""
    fed = []

    def count(module, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        real = ids.numel() if mask is None or mask.dim() == 4 else int(mask[:, -ids.shape[1] :].sum())
        fed.append((ids.shape[0], real))

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        yield fed
    finally:
        hook.remove()


@pytest.fixture
def tokens_fed():
    """`with tokens_fed(model) as fed:` counts the tokens each forward of `model` feeds."""
    return _tokens_fed
