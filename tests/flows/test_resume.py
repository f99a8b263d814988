"""Resume, proven the hard way: `kill -9` inside every step, an exception inside a step, and two
resumes at once, through the real CLI in subprocesses, a real Prefect server and MLflow (SQLite).

The subprocesses talk to the session's Prefect test server (PREFECT_API_URL), so none starts an
ephemeral server of its own; each runs in its own process group, which is SIGKILLed after it
ends so nothing it may have spawned survives. Faults come from the RLANYTHING_FAULT testing hook
(rlanything/tasks/common.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from cli_spares import start
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from rlanything.pipeline import STEPS
from rlanything.storage.layout import RunLayout

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")
# Where each killed process dies, all in iteration 1 (so weights come from iter_0000's
# checkpoints): `start` before the step does anything, `end` after it wrote its files but
# before it logged them and Prefect recorded its result.
KILLS = [
    ("rollout", "start"),
    ("verify", "end"),
    ("rm_score", "start"),
    ("advantages", "end"),
    ("policy_update", "start"),
    ("rm_update", "end"),
    ("adapt_tasks", "start"),
]


# ---------------------------------------------------------------- helpers


def cli_options(api_url: str, stdout=subprocess.PIPE, fault: str | None = None) -> dict:
    """Popen keywords of a CLI subprocess: the session's Prefect server, INFO logs, unbuffered
    output (every log line is out before a SIGKILL), its own process group."""
    env = {k: v for k, v in os.environ.items() if k != "RLANYTHING_FAULT"}
    env.update(
        PREFECT_API_URL=api_url,
        PREFECT_LOGGING_LEVEL="INFO",
        RLANYTHING_PROGRESS="0",
        COLUMNS="300",
        PYTHONUNBUFFERED="1",
    )
    if fault:
        env["RLANYTHING_FAULT"] = fault
    return dict(env=env, cwd=REPO, text=True, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True)


def cli(args: list[str], api_url: str, fault: str | None = None, again: bool = True) -> subprocess.Popen:
    """`rlanything ARGS` in a subprocess, in its own process group (by a spare: cli_spares;
    `again=False` where no later command runs in the same environment)."""
    return start(args, cli_options(api_url, fault=fault), again)


def finish(proc: subprocess.Popen, timeout: float = 420) -> str:
    """Wait for the process, then SIGKILL whatever is left of its process group (an orphaned
    ephemeral Prefect server would be). -> its output."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return out


def logged_states(out: str, iteration: int) -> dict[str, str]:
    """Step -> state from the iteration flow's log lines ("step rollout of iteration 1: Cached").
    A killed process cannot be asked later, and Prefect ships task-run states to the server as
    events, asynchronously: a SIGKILL can lose the last ones. The console log is written at once."""
    return dict(re.findall(rf"step (\w+) of iteration {iteration}: (\w+)", out))


def step_states(run_dir: Path, iteration: int, expected: dict[str, str], timeout: float = 60) -> dict[str, str]:
    """Step -> task-run state name in the latest flow run of `iteration`, from the Prefect API,
    polled until it equals `expected` (the server records states from events, a moment later)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"{run_dir}: iteration {iteration}"]))
            )
            latest = max(runs, key=lambda r: r.created)
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[latest.id])))
            states = {t.name.rsplit("-", 1)[0]: t.state.name for t in tasks}
            if states == expected or time.monotonic() > deadline:
                return states
            time.sleep(0.5)


def flow_run_count(run_dir: Path, iteration: int) -> int:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        name = FlowRunFilterName(any_=[f"{run_dir}: iteration {iteration}"])
        return len(client.read_flow_runs(flow_run_filter=FlowRunFilter(name=name)))


def parquet_files(run_dir: Path) -> list[Path]:
    return sorted(p.relative_to(run_dir) for p in run_dir.rglob("*.parquet") if ".prefect" not in p.parts)


def _tensor_diffs(ours: dict, theirs: dict) -> list[str]:
    """Names of the tensors that differ, with their largest absolute difference (for the message)."""
    if ours.keys() != theirs.keys():
        return [f"keys differ: {sorted(set(ours) ^ set(theirs))[:5]}"]
    out = []
    for k in ours:
        a, b = torch.as_tensor(ours[k]), torch.as_tensor(theirs[k])
        if not torch.equal(a, b):
            gap = (a.double() - b.double()).abs().max().item() if a.shape == b.shape else "shape"
            out.append(f"{k} (max |diff| {gap})")
    return out


def assert_same_files(run_dir: Path, reference: Path, where: str = "") -> int:
    """Every Parquet file, checkpoint tensor and AdamW state present in `run_dir` equals the
    reference run's. -> how many files were compared. A mismatch names every differing file
    and tensor with its largest difference (a flaky bit tells more than a first failure)."""
    compared, wrong = 0, []
    for rel in parquet_files(run_dir):
        ours, theirs = pq.read_table(run_dir / rel), pq.read_table(reference / rel)
        differing = [c for c in theirs.column_names if not ours[c].equals(theirs[c])]
        if not ours.schema.equals(theirs.schema) or differing:
            wrong.append(f"{rel}: columns {differing} differ")
        compared += 1
    for tensors in sorted((run_dir / "checkpoints").rglob("*.safetensors")):
        diffs = _tensor_diffs(load_file(tensors), load_file(reference / tensors.relative_to(run_dir)))
        wrong += [f"{tensors.relative_to(run_dir)}: {d}" for d in diffs[:8]]
        compared += 1
    flat = lambda s: {f"{i}.{k}": v for i, st in s["state"].items() for k, v in st.items()}  # noqa: E731
    for optim in sorted((run_dir / "checkpoints").rglob("optimizer.pt")):
        diffs = _tensor_diffs(flat(torch.load(optim)), flat(torch.load(reference / optim.relative_to(run_dir))))
        wrong += [f"{optim.relative_to(run_dir)}: {d}" for d in diffs[:8]]
        compared += 1
    assert not wrong, "\n".join([where, *wrong])
    return compared


def assert_complete_like(run_dir: Path, reference: Path) -> None:
    """The resumed run has exactly the reference's files, all equal."""
    assert parquet_files(run_dir) == parquet_files(reference)
    refs = sorted(p.relative_to(reference) for p in (reference / "checkpoints").rglob("*") if p.is_file())
    assert sorted(p.relative_to(run_dir) for p in (run_dir / "checkpoints").rglob("*") if p.is_file()) == refs
    assert_same_files(run_dir, reference)


def mlflow_status(run_dir: Path) -> str:
    """Status of the run's MLflow run, in the default store of its root folder."""
    client = MlflowClient(f"sqlite:///{run_dir.parent}/mlflow.db")
    return client.get_run((run_dir / "mlflow_run_id").read_text().strip()).info.status


def outputs_mtimes(layout: RunLayout, iteration: int, steps) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for s in steps for p in layout.step_outputs(iteration, s)}


# ---------------------------------------------------------------- tests


@pytest.mark.slow
def test_killed_in_every_step_then_resumed_equals_an_uninterrupted_run(small_run, small_overrides, prefect_api_url):
    """kill -9 in each of the seven steps in turn (`rlanything train`, then six `rlanything
    resume`s, each killed in the next step), then a last resume: finished steps come back Cached
    and are not re-executed, every file written along the way equals the uninterrupted run's,
    and so does the end result (Parquet rows and values, checkpoint tensors, AdamW state)."""
    reference = Path(small_run["run_dir"])
    root = reference.parent  # one MLflow store for all (a fresh SQLite store costs ~8 s to create)
    layout = RunLayout(root / "killed")
    run_dir = layout.run_dir
    sets = [a for o in [f"run.root={root}", "run.name=killed", *small_overrides] for a in ("--set", o)]
    previous = None  # the step the previous process died in
    for k, (step, phase) in enumerate(KILLS):
        args = ["train", "-c", TINY, *sets, "-n", "2"] if k == 0 else ["resume", str(run_dir)]
        cached = list(STEPS[: STEPS.index(previous)]) if previous else []
        before = outputs_mtimes(layout, 1, cached)
        proc = cli(args, prefect_api_url, fault=f"sigkill:{step}@1:{phase}")
        out = finish(proc)
        assert proc.returncode == -signal.SIGKILL, out[-3000:]
        expected = {s: "Cached" for s in cached} | ({previous: "Completed"} if previous else {})
        assert logged_states(out, 1) == expected, out[-3000:]  # the step killed last time ran again; none after
        assert f"step {step} of iteration 1" not in out  # died inside the step
        assert outputs_mtimes(layout, 1, cached) == before  # Cached steps wrote nothing
        # every file that exists is complete and right
        assert assert_same_files(run_dir, reference, f"after the kill in {step} ({phase})") > 0
        assert mlflow_status(run_dir) == "RUNNING"  # SIGKILL leaves it running
        previous = step

    # The last resume re-runs the same training flow, here in-process (the CLI resumes above
    # already went through `rlanything resume`).
    from rlanything.flows.training import train_flow

    train_flow(TINY, [f"run.root={root}", "run.name=killed", *small_overrides], 2)
    expected = {**{s: "Cached" for s in STEPS[:-1]}, "adapt_tasks": "Completed"}
    assert step_states(run_dir, 1, expected) == expected
    assert_complete_like(run_dir, reference)
    assert mlflow_status(run_dir) == "FINISHED"
    assert "adapt_tasks (Completed)" in (layout.iter_dir(1) / "summary.md").read_text()
    assert "rollout (Cached)" in (layout.iter_dir(1) / "summary.md").read_text()


def test_a_failing_step_fails_the_flow_and_the_resume_runs_only_the_rest(small_run, small_overrides, monkeypatch):
    """An exception in advantages: the flow run is Failed, MLflow says FAILED. The resume
    (the same flow again) takes rollout and verify from the cache, recomputes rm_score because
    its output file was deleted, and runs the rest; the result equals the uninterrupted run's."""
    from rlanything.flows.training import train_flow

    root = Path(small_run["run_dir"]).parent
    overrides = [f"run.root={root}", "run.name=raised", *small_overrides]
    layout = RunLayout(root / "raised")
    monkeypatch.setenv("RLANYTHING_FAULT", "raise:advantages")
    state = train_flow(TINY, overrides, 1, return_state=True)
    assert state.is_failed(), state
    with pytest.raises(Exception, match="injected fault 'raise:advantages' in step advantages of iteration 0"):
        state.result()
    expected = {"rollout": "Completed", "verify": "Completed", "rm_score": "Completed", "advantages": "Failed"}
    assert step_states(layout.run_dir, 0, expected) == expected
    assert mlflow_status(layout.run_dir) == "FAILED"
    assert not layout.iteration_done(0).exists()

    judgments = layout.artifact(0, "judgments")
    saved = pq.read_table(judgments)
    judgments.unlink()  # a finished step whose output is gone must run again
    monkeypatch.delenv("RLANYTHING_FAULT")
    kept = outputs_mtimes(layout, 0, ["rollout", "verify"])
    train_flow(TINY, overrides, 1)
    expected = {"rollout": "Cached", "verify": "Cached", **{s: "Completed" for s in STEPS[2:]}}
    assert step_states(layout.run_dir, 0, expected) == expected
    assert outputs_mtimes(layout, 0, ["rollout", "verify"]) == kept
    assert pq.read_table(judgments).equals(saved)
    # iteration 0 only: its 12 Parquet artifacts (progress.parquet among them), then 2 + 2 x 2 more files
    assert assert_same_files(layout.run_dir, Path(small_run["run_dir"])) == 12 + 2 + 2 * 2
    assert mlflow_status(layout.run_dir) == "FINISHED"
    assert layout.iteration_done(0).exists()


def test_two_resumes_at_once_one_runs_and_the_other_exits_with_a_message(
    small_run, small_overrides, prefect_api_url, monkeypatch
):
    """Resume A takes the run's lock (then is paused with SIGSTOP, so it surely holds it);
    resume B exits at once with code 3 naming A, creating no flow run; A then finishes."""
    from rlanything.flows.runlock import holder
    from rlanything.flows.training import train_flow

    root = Path(small_run["run_dir"]).parent
    overrides = [f"run.root={root}", "run.name=twice", *small_overrides]
    run_dir = root / "twice"
    monkeypatch.setenv("RLANYTHING_FAULT", "raise:adapt_tasks")  # little left for the resume to do
    assert train_flow(TINY, overrides, 1, return_state=True).is_failed()
    monkeypatch.delenv("RLANYTHING_FAULT")

    a = cli(["resume", str(run_dir)], prefect_api_url)
    try:
        deadline = time.monotonic() + 240
        while (holder(run_dir) or {}).get("pid") != a.pid:
            assert a.poll() is None, a.stdout.read()
            assert time.monotonic() < deadline, "resume A never took the lock"
            time.sleep(0.1)
        os.kill(a.pid, signal.SIGSTOP)
        try:
            b = cli(["resume", str(run_dir)], prefect_api_url)
            out_b = finish(b, timeout=120)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        assert b.returncode == 3, out_b
        assert f"is already being trained or resumed by another process (pid {a.pid}" in " ".join(out_b.split()), out_b
        out_a = finish(a)
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            finish(a, timeout=1)
    assert a.returncode == 0, out_a[-3000:]
    assert flow_run_count(run_dir, 0) == 2  # the failed one and A's: B created none
    expected = {**{s: "Cached" for s in STEPS[:-1]}, "adapt_tasks": "Completed"}
    assert logged_states(out_a, 0) == expected
    assert step_states(run_dir, 0, expected) == expected
    assert RunLayout(run_dir).iteration_done(0).exists()
    assert json.loads((run_dir / "iter_0000" / "summary.json").read_text())["iteration"] == 0
