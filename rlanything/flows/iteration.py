"""One RLAnything iteration as a Prefect flow: the paper's seven steps, in order.

Each step is a Prefect task keyed on (run, config, iteration, step) with its result persisted
in the run folder (`.prefect/results/`), so re-running a failed or killed iteration (the same
flow, `rlanything resume`, or Retry in the UI) returns `Cached` for finished steps and runs the
rest. A step whose output files are missing is recomputed even if a record says it finished,
and so is every step after it. Model weights always load from the previous iteration's
checkpoint, and randomness derives from (seed, iteration, step): a resumed iteration writes
the same files an uninterrupted one would. A step named in `run.step_deployments` first runs
as a flow run on that deployment's work pool (`flows/steps.py`); the call here then finds its
record: `Cached`.
"""

from __future__ import annotations

import json

from prefect import flow, get_run_logger

from rlanything.agent.run_context import open_run, saved_models
from rlanything.flows.runlock import run_lock
from rlanything.flows.steps import run_on_deployment
from rlanything.reports.iteration_report import write_reports
from rlanything.storage import checkpoints, tracking
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import write_text
from rlanything.tasks.adapt import adapt_tasks
from rlanything.tasks.cancellation import stoppable
from rlanything.tasks.common import step_options
from rlanything.tasks.rollout import rollout, verify
from rlanything.tasks.scoring import advantages, rm_score
from rlanything.tasks.update import policy_update, rm_update


@flow(name="rlanything-iteration", flow_run_name="{run_dir}: iteration {iteration}")
@stoppable
def iteration_flow(run_dir: str, iteration: int) -> dict[str, float]:
    config, layout = open_run(run_dir)
    states: dict[str, str] = {}  # step -> final state name: Cached | Completed [on <deployment>]
    refresh = False  # once a step recomputes, every later step does too
    logger = get_run_logger()

    def step(task) -> dict:
        nonlocal refresh
        outputs = layout.step_outputs(iteration, task.name, saved_models(config))
        refresh = refresh or not all(p.exists() for p in outputs)
        remote = config.run.step_deployments.get(task.name)  # a deployment on a work pool, or None: here
        if remote:  # runs there first and writes its record to the shared run folder; then Cached here
            states[task.name] = run_on_deployment(remote, run_dir, iteration, task.name, refresh)
        state = task.with_options(**step_options(layout, refresh and not remote))(run_dir, iteration, return_state=True)
        states.setdefault(task.name, state.name)
        logger.info("step %s of iteration %d: %s", task.name, iteration, states[task.name])  # Cached = resumed
        return state.result()  # raises if the step failed: the flow fails, finished steps stay cached

    with run_lock(layout.run_dir):
        results = [
            step(rollout),  # 1. the policy plays each task G times, per-step records
            step(verify),  # 2. the environment's outcome ±1 per trajectory
            step(rm_score),  # 3. the generative RM judges every step m times
            step(advantages),  # 4. integrated rewards, step-index and consistency advantages
            step(policy_update),  # 5. PPO-clip + k3 KL on the policy
            step(rm_update),  # 6. the same loss on the RM's judgments
            step(adapt_tasks),  # 7. tasks outside the accuracy band are adapted
        ]
        metrics = {k: v for r in results for k, v in r["metrics"].items()}
        _record(layout, iteration, metrics, states)
        # Only now that the iteration is done: until then a resume reads the previous checkpoints.
        pruned = checkpoints.prune(layout, config.run.keep_checkpoints, iteration)
        tracking.log_metrics(config.mlflow_uri, layout.mlflow_run_id(), pruned.metrics(), step=iteration)
        logger.info(
            "checkpoints: removed %s (%d bytes); %d bytes on disk",
            [p.relative_to(layout.run_dir).as_posix() for p in pruned.removed] or "nothing",
            pruned.bytes_removed,
            pruned.bytes_on_disk,
        )
    return metrics | pruned.metrics()


def _record(layout: RunLayout, iteration: int, metrics: dict[str, float], states: dict[str, str]) -> None:
    """Log the iteration's metrics, its summary and the human-readable reports (plots,
    markdown, sample trajectories), then mark it done."""
    config, _ = open_run(str(layout.run_dir))
    run_id = layout.mlflow_run_id()
    tracking.log_metrics(config.mlflow_uri, run_id, metrics, step=iteration)
    summary = layout.iter_dir(iteration) / "summary.json"
    write_text(json.dumps({"iteration": iteration, **metrics}, indent=2, sort_keys=True), summary)
    views = write_reports(layout, iteration, states, config.algo.band, config.run.plots)
    tracking.log_artifacts(config.mlflow_uri, run_id, [summary, *views], f"iter_{iteration:04d}")
    fronts = [view for view in views[:2] if view.suffix == ".png"]  # the latest curves and tasks plots
    tracking.log_artifacts(config.mlflow_uri, run_id, fronts, None)  # on the run's front page
    write_text("done\n", layout.iteration_done(iteration))
