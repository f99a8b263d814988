"""One step of an iteration as a flow of its own, so a deployment can place it on a work pool:
rollouts on inference machines, updates on training machines (README "Scheduling").

The iteration flow stays the orchestrator. For a step named in `run.step_deployments` it starts
`step_flow` through that deployment, waits for it, then calls the step task itself as usual;
the remote run wrote the step's result record to the run folder's `.prefect/results/`, so that
call returns `Cached` and the iteration reads exactly like a local one (resume, Retry and the
step-outputs check included). This needs the run folder at the same path on a filesystem every
worker sees (NFS or alike): the steps read and write local paths, not fsspec URLs.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.deployments import run_deployment
from prefect.states import Completed, State

from rlanything.pipeline import STEPS
from rlanything.storage.layout import RunLayout
from rlanything.tasks.adapt import adapt_tasks
from rlanything.tasks.cancellation import stoppable
from rlanything.tasks.common import step_key, step_options
from rlanything.tasks.rollout import rollout, verify
from rlanything.tasks.scoring import advantages, rm_score
from rlanything.tasks.update import policy_update, rm_update

_TASKS = {t.name: t for t in (rollout, verify, rm_score, advantages, policy_update, rm_update, adapt_tasks)}
STEP_TASKS = {name: _TASKS[name] for name in STEPS}  # in the order `pipeline.PIPELINE` declares


class RemoteStepError(RuntimeError):
    """A step's flow run on its work pool did not complete, or left no result record here."""


@flow(name="rlanything-step", flow_run_name="{run_dir}: iteration {iteration}, {step}")
@stoppable
def step_flow(run_dir: str, iteration: int, step: str, refresh: bool = False) -> State:
    """Run one step of one iteration here (a worker's machine). The flow run ends `Completed`
    with the step's own state name (`Completed`, or `Cached` if it had finished) as message."""
    layout = RunLayout(Path(run_dir))
    state = STEP_TASKS[step].with_options(**step_options(layout, refresh))(run_dir, iteration, return_state=True)
    state.result()  # raises if the step failed: this flow run fails
    return Completed(message=state.name)


def run_on_deployment(deployment: str, run_dir: str, iteration: int, step: str, refresh: bool) -> str:
    """Run `step` as a flow run of `deployment` ("rlanything-step/inference"), wait for it and
    return what the iteration's summary shows, e.g. "Completed on rlanything-step/inference"."""
    parameters = {"run_dir": run_dir, "iteration": iteration, "step": step, "refresh": refresh}
    flow_run = run_deployment(deployment, parameters=parameters, timeout=None, poll_interval=1)
    if not flow_run.state.is_completed():
        raise RemoteStepError(
            f"step {step} of iteration {iteration} on {deployment}: flow run {flow_run.name!r} "
            f"ended {flow_run.state.name}: {flow_run.state.message}"
        )
    record = RunLayout(Path(run_dir)).prefect_results / step_key(run_dir, iteration, step)
    if not record.exists():
        raise RemoteStepError(
            f"step {step} ran on {deployment} but its result record {record} is not here: "
            "the run folder must be at the same path on a filesystem every worker sees"
        )
    return f"{flow_run.state.message or flow_run.state.name} on {deployment}"
