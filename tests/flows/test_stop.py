"""Stopping a run on purpose: Ctrl-C (SIGINT to the process group, as a terminal sends it) and
SIGTERM (as a process manager sends it) end `rlanything train`, `resume` and `eval` within
seconds, on a loaded machine, with one line that says how to continue and exit code 130 or 143;
Prefect shows the runs Cancelled, MLflow the run KILLED; no file is half-written, no process
outlives the command, and resuming writes exactly what an uninterrupted run writes.

The signals come from the RLANYTHING_FAULT testing hook (`sigint:STEP@ITERATION`: the process
signals its own group at the start of the step, which then runs on into its work until the stop
check ends it) or, for the temporary Prefect server case, from the test itself. Every CLI
subprocess carries a tag in its environment, inherited by everything it starts: a process with
that tag still alive after the command ended is a leftover.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from functools import partial
from pathlib import Path

import pytest
from cli_spares import TAG, start
from test_resume import (
    TINY,
    assert_complete_like,
    assert_same_files,
    cli_options,
    finish,
    logged_states,
    mlflow_status,
    step_states,
)

from rlanything.storage.layout import RunLayout

STOP_LIMIT_S = 15.0  # from the signal to the process gone, on 2 loaded cores


# ---------------------------------------------------------------- helpers


class Command:
    """`rlanything ARGS` in its own process group, its output lines timestamped as they arrive;
    two busy processes load both cores from the moment the signal is sent until it ends."""

    def __init__(
        self,
        args: list[str],
        api_url: str | None,
        fault: str | None = None,
        cwd: Path | None = None,
        sigint_ignored: bool = False,
        poll_s: int | None = None,
    ):
        self.tag = uuid.uuid4().hex
        options = cli_options(api_url or "", fault=fault)
        if api_url is None:  # Prefect starts its temporary server (the everyday case)
            options["env"] = {k: v for k, v in options["env"].items() if not k.startswith("PREFECT_API")}
            options["env"]["PYTHONPATH"] = str(Path(TINY).parents[1])
        options["env"][TAG] = self.tag
        if poll_s:  # how often serve's runner asks for new runs and cancels (Prefect's default: 10 s)
            options["env"]["PREFECT_RUNNER_POLL_FREQUENCY"] = str(poll_s)
        options["cwd"] = cwd or options["cwd"]
        if sigint_ignored:  # as a shell starts a background job: SIGINT (and SIGQUIT) ignored
            options["preexec_fn"] = partial(signal.signal, signal.SIGINT, signal.SIG_IGN)
        # by a spare when one fits: its own tag then; a folder or a poll of its own: no spare for the next
        self.proc = start(args, options, again=api_url is not None and cwd is None and not poll_s)
        self.tag = self.proc.tag
        self.lines: list[tuple[float, str]] = []
        self.signalled = threading.Event()
        self.load: list[subprocess.Popen] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))
            if line.startswith("injected fault") and "to the process group" in line:
                self.loaded()

    def loaded(self) -> None:
        """Mark the signal's time and load both cores (until `finish`)."""
        if not self.signalled.is_set():
            self.signalled_at = time.monotonic()
            self.signalled.set()
            burn = [sys.executable, "-c", "while True: pass"]
            self.load = [subprocess.Popen(burn) for _ in range(2)]

    def wait_for(self, pattern: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not any(re.search(pattern, line) for _, line in self.lines):
            assert self.proc.poll() is None, self.output()[-3000:]
            assert time.monotonic() < deadline, f"no {pattern!r} after {timeout} s:\n{self.output()[-3000:]}"
            time.sleep(0.1)

    def finish(self, timeout: float = 420) -> float:
        """Wait for the command to end; -> seconds from the signal to its end."""
        try:
            self.proc.wait(timeout=timeout)
            ended = time.monotonic()
        finally:
            for burner in self.load:
                burner.kill()
                burner.wait()
            if self.proc.poll() is None:
                self.proc.kill()
            self.reader.join(timeout=30)
        assert self.signalled.is_set(), self.output()[-3000:]
        return ended - self.signalled_at

    def output(self) -> str:
        return "".join(line for _, line in self.lines)

    def leftovers(self, within: float = 10.0) -> list[str]:
        """Processes still alive that inherited this command's tag, after up to `within` s."""
        deadline = time.monotonic() + within
        while (left := tagged(self.tag)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:  # do not leave them to the next test
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return [f"{pid}: {cmdline(pid)[:150]}" for pid in left]


def tagged(tag: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"{TAG}={tag}".encode() in environ.split(b"\0") and state not in "ZX":
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def latest_flow_run(flow_name: str | None = None, run_name: str | None = None):
    """The newest flow run of a flow (by flow name) or with a given run name, from the API."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])) if flow_name else None,
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_name])) if run_name else None,
        )
    return max(runs, key=lambda r: r.created)


def task_states(flow_run_id) -> dict[str, str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {t.name.rsplit("-", 1)[0]: t.state.name for t in tasks}


def temp_files(folder: Path) -> list[Path]:
    """What an interrupted atomic write would leave: `.NAME.<hex>.tmp` files, `.NAME.tmp-*` folders."""
    return [p for p in folder.rglob(".*") if p.name.endswith(".tmp") or ".tmp-" in p.name]


def assert_stopped(command: Command, signum: int, hint: str) -> float:
    """The command ended within STOP_LIMIT_S of the signal, with the line and the exit code of
    that signal, and left no process behind. -> the seconds it took."""
    seconds = command.finish()
    out = command.output()
    assert command.proc.returncode == 128 + signum, out[-3000:]
    assert f"stopped by signal; resume with: {hint}" in out, out[-3000:]
    assert seconds < STOP_LIMIT_S, f"{seconds:.1f} s from the signal to the exit:\n{out[-3000:]}"
    assert "Traceback" not in out and "Crash detected" not in out, out[-3000:]
    assert command.leftovers() == []
    return seconds


# ---------------------------------------------------------------- tests


# (fault, the signal, the steps of iteration 1 before the stopped one and their states)
STOPS = [
    ("sigint:rollout@1", signal.SIGINT, {}),
    ("sigint:rm_score@1", signal.SIGINT, {"rollout": "Completed", "verify": "Completed"}),
    (
        "sigterm:policy_update@1",
        signal.SIGTERM,
        {s: "Cached" for s in ("rollout", "verify")} | {"rm_score": "Completed", "advantages": "Completed"},
    ),  # fmt: skip
]


@pytest.mark.slow
def test_stopped_in_rollout_rm_score_and_policy_update_then_resumed_equals_an_uninterrupted_run(
    small_run, small_overrides, prefect_api_url
):
    """`rlanything train` stopped by SIGINT in rollout, then `resume` stopped by SIGINT in
    rm_score, then by SIGTERM in policy_update, all in iteration 1; a last resume completes."""
    reference = Path(small_run["run_dir"])
    root = reference.parent
    layout = RunLayout(root / "stopped")
    run_dir = layout.run_dir
    sets = [a for o in [f"run.root={root}", "run.name=stopped", *small_overrides] for a in ("--set", o)]
    for k, (fault, signum, before) in enumerate(STOPS):
        args = ["train", "-c", TINY, *sets, "-n", "2"] if k == 0 else ["resume", str(run_dir)]
        command = Command(args, prefect_api_url, fault=fault)
        seconds = assert_stopped(command, signum, f"rlanything resume {run_dir}")
        step = fault.split(":")[1].split("@")[0]
        print(f"{fault}: exited {seconds:.1f} s after the signal")
        assert logged_states(command.output(), 1) == before, command.output()[-3000:]
        # Prefect: the stopped step, its iteration and the training flow run are Cancelled
        expected = before | {step: "Cancelled"}
        assert step_states(run_dir, 1, expected) == expected
        assert latest_flow_run(run_name=f"{run_dir}: iteration 1").state.name == "Cancelled"
        assert latest_flow_run("rlanything-train").state.name == "Cancelled"
        assert mlflow_status(run_dir) == "KILLED"
        # nothing half-written: every file there equals the uninterrupted run's, no temp file
        assert assert_same_files(run_dir, reference, f"after the stop in {step}") > 0
        assert temp_files(run_dir) == []

    from rlanything.flows.training import train_flow

    train_flow(TINY, [f"run.root={root}", "run.name=stopped", *small_overrides], 2)
    expected = {s: "Cached" for s in ("rollout", "verify", "rm_score", "advantages")}
    expected |= {s: "Completed" for s in ("policy_update", "rm_update", "adapt_tasks")}
    assert step_states(run_dir, 1, expected) == expected
    assert_complete_like(run_dir, reference)
    assert mlflow_status(run_dir) == "FINISHED"


@pytest.mark.slow
def test_stopped_during_a_held_out_evaluation_then_run_again(tmp_path, prefect_api_url):
    """`rlanything eval` of a model, stopped by SIGINT while it plays the held-out problems: the
    evaluation's flow and task runs are Cancelled, no file is written; the same command again
    writes what an evaluation that never stopped writes."""
    import pyarrow.parquet as pq

    from rlanything.flows.evaluation import eval_flow

    sets = ["--set", "run.root=ROOT", "--set", "eval.rm=false", "--problems", "4", "--split", "in_domain"]
    args = lambda root: ["eval", "builtin:tiny-random", "-c", TINY, *[a.replace("ROOT", str(root)) for a in sets]]  # noqa: E731
    stopped_root, reference_root = tmp_path / "stopped", tmp_path / "reference"
    command = Command(args(stopped_root), prefect_api_url, fault="sigint:eval")
    assert_stopped(command, signal.SIGINT, "rlanything " + " ".join(args(stopped_root)))
    flow_run = latest_flow_run("rlanything-eval")
    assert flow_run.state.name == "Cancelled"
    assert task_states(flow_run.id) == {"eval in_domain": "Cancelled"}
    out = stopped_root / "eval" / "builtin_tiny-random"
    assert not out.exists() or [p for p in out.rglob("*") if p.is_file()] == []

    again = start(args(stopped_root), cli_options(prefect_api_url))
    out = finish(again)
    assert again.returncode == 0, out[-3000:]
    eval_flow("builtin:tiny-random", TINY, [f"run.root={reference_root}", "eval.rm=false"], "in_domain", 4)
    episodes = [pq.read_table(root / "eval" / "builtin_tiny-random" / "episodes.parquet") for root in (stopped_root, reference_root)]  # fmt: skip
    assert episodes[0].num_rows == 4 and episodes[0].equals(episodes[1])


@pytest.mark.slow
@pytest.mark.parametrize("server", ["alive", "killed first"])
def test_ctrl_c_with_the_temporary_prefect_server(tmp_path, server):
    """Without PREFECT_API_URL `rlanything train` runs Prefect's temporary server, out of the
    terminal's process group so that Ctrl-C leaves it to record the Cancelled states. With the
    server gone before the Ctrl-C (as happened when it shared the group: 214 s of retries),
    the command must not wait on it either."""
    sets = ["--set", f"run.root={tmp_path}", "--set", "env.num_problems=2", "--set", "policy.tasks_per_iteration=2"]
    command = Command(["train", "-c", TINY, *sets, "-n", "1"], None, cwd=tmp_path)
    try:
        command.wait_for(r"Beginning subflow run '.*: iteration 0'")
        time.sleep(1.0)  # into the rollout
        if server == "killed first":
            uvicorn = [p for p in tagged(command.tag) if "uvicorn" in cmdline(p)]
            assert len(uvicorn) == 1, [cmdline(p) for p in tagged(command.tag)]
            os.kill(uvicorn[0], signal.SIGKILL)
        command.loaded()
        os.killpg(command.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    except BaseException:
        command.proc.kill()
        command.leftovers(0)
        raise
    seconds = assert_stopped(command, signal.SIGINT, f"rlanything resume {tmp_path / 'tiny'}")
    print(f"Ctrl-C, temporary server {server}: exited {seconds:.1f} s after the signal")
    if server == "killed first":
        assert "Prefect did not answer" in command.output()
    assert mlflow_status(tmp_path / "tiny") == "KILLED"
    assert temp_files(tmp_path / "tiny") == []


@pytest.mark.slow
def test_cancel_in_the_prefect_ui_stops_a_deployment_run_the_same_way(tmp_path, small_overrides, prefect_api_url):
    """`rlanything serve` runs a training run of its deployment; Cancel in the Prefect UI (the
    API call the button makes: state Cancelling) stops it: the training flow, its iteration and
    the step in progress end Cancelled, the MLflow run KILLED, the flow run's process is gone."""
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    sets = [a for o in [f"run.root={tmp_path / 'runs'}", *small_overrides] for a in ("--set", o)]
    # the rollout holds until stopped: a step surely in progress when the cancel arrives (the
    # runner notices a cancel on its next poll, here up to 1 s later; a tiny iteration is short)
    args = ["serve", "-c", TINY, *sets, "--name", "stop-test", "--root", str(tmp_path)]
    # started as a shell's background job is (SIGINT ignored): serve must still end on SIGINT;
    # it did not before serve restored the handler (three full-suite runs started with `&` hung)
    serve = Command(args, prefect_api_url, fault="hold:rollout@0", sigint_ignored=True, poll_s=1)
    try:
        serve.wait_for(r"serving rlanything-train/stop-test")
        deadline = time.monotonic() + 120
        with get_client(sync_client=True) as client:
            while True:  # the deployment is registered once serve's runner started
                try:
                    client.read_deployment_by_name("rlanything-train/stop-test")
                    break
                except Exception:
                    assert time.monotonic() < deadline and serve.proc.poll() is None, serve.output()[-3000:]
                    time.sleep(0.5)
        before = set(tagged(serve.tag))  # serve and its helpers
        train = run_deployment("rlanything-train/stop-test", timeout=0)
        run_dir = tmp_path / "runs" / "tiny"
        iteration = wait_for_run(f"{run_dir}: iteration 0", serve)
        deadline = time.monotonic() + 120
        while task_states(iteration.id).get("rollout") != "Running":
            assert time.monotonic() < deadline and serve.proc.poll() is None, serve.output()[-3000:]
            time.sleep(0.5)
        # the flow run's process and what it started; not multiprocessing's resource tracker,
        # which serve's runner starts with its first flow run and keeps (checked with serve below)
        run_processes = {p for p in set(tagged(serve.tag)) - before if "resource_tracker" not in cmdline(p)}
        assert run_processes, [cmdline(p) for p in tagged(serve.tag)]
        cancelled_at = time.monotonic()
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(train.id, Cancelling(message="Cancel in the UI"))
            while not (state := client.read_flow_run(train.id).state).is_final():
                assert time.monotonic() - cancelled_at < 120, state
                time.sleep(0.5)
        print(f"Cancel from the UI: the training flow run {state.name} after {time.monotonic() - cancelled_at:.1f} s")
        assert state.name == "Cancelled"
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(iteration.id).state.name == "Cancelled"
        steps = task_states(iteration.id)
        assert "Cancelled" in steps.values() and not {"Crashed", "Running", "Pending"} & set(steps.values()), steps
        assert mlflow_status(run_dir) == "KILLED"
        deadline = time.monotonic() + 15
        while run_processes & set(tagged(serve.tag)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert run_processes & set(tagged(serve.tag)) == set(), [cmdline(p) for p in run_processes]
    finally:
        if serve.proc.poll() is None:
            serve.loaded()
            os.killpg(serve.proc.pid, signal.SIGINT)
        assert serve.finish(timeout=60) < STOP_LIMIT_S, serve.output()[-3000:]
    assert serve.leftovers() == []


def wait_for_run(name: str, command: Command, timeout: float = 300):
    """The flow run called `name`, once it runs."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            run = latest_flow_run(run_name=name)
            if run.state.is_running():
                return run
        except ValueError:  # none yet (max of nothing)
            pass
        assert command.proc.poll() is None and time.monotonic() < deadline, command.output()[-3000:]
        time.sleep(0.5)


@pytest.mark.slow
def test_ctrl_c_in_an_ablation_then_the_same_command_finishes_it(tmp_path, small_overrides, prefect_api_url):
    """`rlanything experiment ablation` stopped by SIGINT in its arm's rollout: the experiment
    flow, the arm's training flow and the step are Cancelled, the parent MLflow run and the
    arm's run KILLED, the line names the command to run again; the same command then finishes
    the experiment (the arm resumes, the comparison is written, both MLflow runs FINISHED)."""
    from mlflow.tracking import MlflowClient

    sets = [a for o in [f"run.root={tmp_path}", "eval.problems=2", *small_overrides] for a in ("--set", o)]
    args = ["experiment", "ablation", "-c", TINY, "--seeds", "1", "-n", "1", "--name", "abl", "--arms", "policy-only"]
    args += sets
    command = Command(args, prefect_api_url, fault="sigint:rollout@0")
    assert_stopped(command, signal.SIGINT, "rlanything " + " ".join(args))
    run_dir = tmp_path / "abl-policy-only-s0"
    assert latest_flow_run("rlanything-experiment").state.name == "Cancelled"
    assert latest_flow_run("rlanything-train").state.name == "Cancelled"
    assert step_states(run_dir, 0, {"rollout": "Cancelled"}) == {"rollout": "Cancelled"}
    parent_status = lambda: next(  # noqa: E731
        r.info.status
        for r in MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(
            [e.experiment_id for e in MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()]
        )
        if r.info.run_name == "ablation abl"
    )
    assert parent_status() == "KILLED" and mlflow_status(run_dir) == "KILLED"
    assert not (tmp_path / "experiments" / "abl" / "comparison.md").exists()
    assert temp_files(tmp_path) == []

    again = Command(args, prefect_api_url)
    again.wait_for(r"comparison, figures:", timeout=600)
    assert again.proc.wait(timeout=60) == 0, again.output()[-3000:]
    again.reader.join(timeout=30)
    assert "| policy only" in (tmp_path / "experiments" / "abl" / "comparison.md").read_text()
    assert parent_status() == "FINISHED" and mlflow_status(run_dir) == "FINISHED"
    assert RunLayout(run_dir).iteration_done(0).exists()
