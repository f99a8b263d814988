"""Steps on separate work pools (issue 8): rollouts on "inference machines", updates on
"training machines", each a Prefect process worker polling its own pool, the run folder shared.

Here both pools' workers run on this machine, but every mapped step runs in a flow-run process
a worker started, never in the test's, and the iteration flow only finds its result record.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
POOLS = {"rlanything-inference": "inference", "rlanything-training": "training"}  # pool -> deployment in prefect.yaml
# One step per pool: generation on the inference pool, an update on the training pool. Every
# mapped step costs a flow-run process a worker starts (Python, Prefect, torch: 10-20 s on 2
# cores), and all steps take the same path there (flows/steps.py: step_flow runs the step's task,
# whose record the iteration then finds); prefect.yaml's example also maps verify, rm_score and
# rm_update.
PLACED = {"rollout": "inference", "policy_update": "training"}


@pytest.fixture
def workers(prefect_api_url, tmp_path):
    """prefect.yaml's step deployments on their process work pools, one worker per pool; the
    workers and every process they started are killed at teardown (flow-run processes get
    their own session, so a process-group kill would miss them)."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    with get_client(sync_client=True) as client:
        existing = {p.name for p in client.read_work_pools()}
        for pool in POOLS.keys() - existing:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    env = {**os.environ, "PREFECT_API_URL": prefect_api_url, "PREFECT_WORKER_QUERY_SECONDS": "1", "COLUMNS": "200"}
    names = [arg for name in POOLS.values() for arg in ("--name", name)]
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", *names],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    logs = {pool: tmp_path / f"worker-{pool}.log" for pool in POOLS}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool],
            env=env,
            cwd=tmp_path,
            stdout=logs[pool].open("w"),
            stderr=subprocess.STDOUT,
            preexec_fn=_sigint_default,
        )
        for pool in POOLS
    ]
    try:
        yield
    finally:
        alive = [p for proc in procs for p in [psutil.Process(proc.pid), *_children(proc.pid)]]
        for p in alive:
            _signal(p, "terminate")
        _, left = psutil.wait_procs(alive, timeout=15)
        for p in left:
            _signal(p, "kill")
        psutil.wait_procs(left, timeout=15)
        for proc in procs:
            proc.wait(timeout=15)
        for pool, log in logs.items():  # shown by pytest if the test failed
            print(f"---- worker of {pool}:\n{log.read_text()[-4000:]}")


def _sigint_default() -> None:
    """A worker stops on the SIGINT it sends itself on SIGTERM; a process started with SIGINT
    ignored (a background job of a script, nohup) passes that on, and its workers would stop only
    at the SIGKILL 15 s later."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _signal(process: psutil.Process, how: str) -> None:
    try:
        getattr(process, how)()
    except psutil.NoSuchProcess:
        pass


def test_steps_run_on_the_work_pools_their_deployments_name(workers, tmp_path, small_overrides):
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, FlowRunFilter

    from rlanything.flows.training import train_flow
    from rlanything.pipeline import STEPS
    from rlanything.storage.layout import RunLayout

    placed = "{" + ", ".join(f"{step}: rlanything-step/{name}" for step, name in PLACED.items()) + "}"
    overrides = [f"run.root={tmp_path / 'runs'}", "run.name=pools", f"run.step_deployments={placed}", *small_overrides]
    overrides.append("rm.judgments_per_step=1")  # a third of tiny.yaml's RM work; nothing here counts judgments
    summary = train_flow(str(REPO / "configs" / "tiny.yaml"), overrides, 1)

    layout = RunLayout(Path(summary["run_dir"]))  # the iteration finished with every step's files
    assert layout.iteration_done(0).exists()
    assert all(p.exists() for step in STEPS for p in layout.step_outputs(0, step))
    with get_client(sync_client=True) as client:
        remote = {}  # step -> its flow run on a work pool
        for pool, name in POOLS.items():
            deployment = client.read_deployment_by_name(f"rlanything-step/{name}")
            assert deployment.work_pool_name == pool
            for run in client.read_flow_runs(deployment_filter=DeploymentFilter(id={"any_": [deployment.id]})):
                if run.parameters["run_dir"] == summary["run_dir"]:
                    assert run.work_pool_name == pool and PLACED[run.parameters["step"]] == name
                    remote[run.parameters["step"]] = run
        assert remote.keys() == PLACED.keys()  # each mapped step ran once, on its pool
        for step, run in remote.items():
            assert run.state.name == "Completed" and run.state.message == "Completed", (step, run.state)
            assert run.infrastructure_pid and str(os.getpid()) not in run.infrastructure_pid.split(":")
        iteration_run = client.read_task_run(remote["rollout"].parent_task_run_id).flow_run_id
        local = {
            t.name.rsplit("-", 1)[0]: t.state.name
            for t in client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [iteration_run]}))
        }
    # here the mapped steps only found the record their flow run wrote; the others ran here
    assert {step: local[step] for step in STEPS} == {
        step: "Cached" if step in PLACED else "Completed" for step in STEPS
    }
    steps_line = (layout.iter_dir(0) / "summary.md").read_text()
    assert "rollout (Completed on rlanything-step/inference)" in steps_line
    assert "policy_update (Completed on rlanything-step/training)" in steps_line
    assert "advantages (Completed)" in steps_line


def test_step_deployments_name_steps_and_leave_the_digest_alone():
    from rlanything.config import ConfigError, load_config

    tiny = REPO / "configs" / "tiny.yaml"
    placed = load_config(tiny, ["run.step_deployments={rollout: rlanything-step/inference}"])
    assert placed.run.step_deployments == {"rollout": "rlanything-step/inference"}
    assert placed.digest() == load_config(tiny).digest()  # a run may move its steps and still resume
    with pytest.raises(ConfigError, match="run.step_deployments.rollouts"):
        load_config(tiny, ["run.step_deployments={rollouts: rlanything-step/inference}"])


def test_a_failed_remote_step_or_a_record_this_machine_cannot_see_fails_the_step(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from prefect.states import Completed, Failed

    from rlanything.config import load_config, save_config
    from rlanything.flows import steps

    run_dir = tmp_path / "run"
    save_config(load_config(REPO / "configs" / "tiny.yaml"), run_dir / "config.yaml")
    flow_run = SimpleNamespace(name="remote-run", state=Failed(message="CUDA out of memory"))
    monkeypatch.setattr(steps, "run_deployment", lambda *args, **kwargs: flow_run)
    with pytest.raises(steps.RemoteStepError, match="rollout of iteration 0 on rlanything-step/inference.*Failed"):
        steps.run_on_deployment("rlanything-step/inference", str(run_dir), 0, "rollout", False)
    flow_run.state = Completed(message="Completed")  # but its record went to another machine's disk
    with pytest.raises(steps.RemoteStepError, match="filesystem every worker sees"):
        steps.run_on_deployment("rlanything-step/inference", str(run_dir), 0, "rollout", False)
    record = run_dir / ".prefect" / "results" / steps.step_key(str(run_dir), 0, "rollout")
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    assert steps.run_on_deployment("rlanything-step/inference", str(run_dir), 0, "rollout", False) == (
        "Completed on rlanything-step/inference"
    )
