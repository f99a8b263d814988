"""The training flow: prepare the run folder, then one iteration flow after another.

A run is identified by its folder `<run.root>/<run.name>`. Starting a flow with the config of
an existing run continues it: finished iterations are skipped, a failed or killed one resumes at
its failed step. Starting it with a *different* config under the same name is refused. One
process at a time trains a run (`runlock`): a second one stops at once with `RunBusyError`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from rlanything import stopping
from rlanything.config import Config, ConfigError, flatten, load_config, save_config
from rlanything.envs import initial_specs
from rlanything.flows.evaluation import BASE, eval_dir, eval_flow
from rlanything.flows.iteration import iteration_flow
from rlanything.flows.runlock import run_lock
from rlanything.models.precision import as_params, describe, run_precision
from rlanything.storage import tracking
from rlanything.storage.buffer import initial_buffer, write_buffer
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import write_text
from rlanything.tasks.cancellation import is_stop, stoppable


def prepare_run(config: Config) -> RunLayout:
    """Create or re-open the run folder, its task buffer and its MLflow run."""
    layout = RunLayout(config.run_dir)
    if layout.config.exists():
        previous = load_config(layout.config)
        if previous.digest() != config.digest():
            raise ConfigError(
                f"run {config.run.name!r} already exists in {layout.run_dir} with a different config; "
                "choose another run.name (--set run.name=...) or resume it with `rlanything resume`"
            )
    save_config(config, layout.config)
    precision = run_precision(config, layout.run_dir)  # decided at the run's start, kept for its resumes
    get_run_logger().info("precision: %s", describe(precision))  # prepare_run runs inside a flow
    if not layout.tasks_snapshot(0).exists():
        specs = initial_specs(config.env, config.run.seed)
        write_buffer(initial_buffer(specs), layout.tasks_snapshot(0))
    root = Path(config.run.root).resolve()
    run_id = tracking.get_or_create_run(
        config.mlflow_uri, config.run.experiment, root / "mlartifacts", layout.run_dir, config.run.name
    )
    tracking.log_params(config.mlflow_uri, run_id, flatten(config.to_dict()) | as_params(precision))
    write_text(run_id + "\n", layout.mlflow_run_id_file)
    return layout


@flow(name="rlanything-train")
@stoppable
def train_flow(config_path: str, overrides: list[str] | None = None, iterations: int | None = None) -> dict[str, Any]:
    """Train for `iterations` (default: run.iterations) iterations; returns a summary."""
    config = load_config(config_path, overrides or [])
    if iterations is not None:
        config = config.model_copy(update={"run": config.run.model_copy(update={"iterations": iterations})})
    with run_lock(config.run_dir):  # before anything is written: a loser changes nothing
        layout = prepare_run(config)
        run_id = layout.mlflow_run_id()
        tracking.set_running(config.mlflow_uri, run_id)  # a resumed run was FAILED or KILLED, or RUNNING if killed
        metrics: dict[str, float] = {}
        killed = functools.partial(tracking.set_terminated, config.mlflow_uri, run_id, "KILLED")
        try:
            with stopping.on_forced_exit(killed):  # a second Ctrl-C ends the process before `except` runs
                if config.eval.every and not (eval_dir(layout.run_dir, BASE) / "summary.json").exists():
                    eval_flow(f"{layout.run_dir}@base")  # the curve's starting point
                for iteration in range(config.run.iterations):
                    stopping.check()
                    if not layout.iteration_done(iteration).exists():
                        metrics = iteration_flow(str(layout.run_dir), iteration)
                    if config.eval.every and (iteration + 1) % config.eval.every == 0:  # held-out accuracy
                        if not (eval_dir(layout.run_dir, iteration) / "summary.json").exists():
                            eval_flow(f"{layout.run_dir}@{iteration}")
        except BaseException as exc:
            tracking.set_terminated(config.mlflow_uri, run_id, "KILLED" if is_stop(exc) else "FAILED")
            raise
        tracking.set_terminated(config.mlflow_uri, run_id, "FINISHED")
    return {
        "run_dir": str(layout.run_dir),
        "mlflow_uri": config.mlflow_uri,
        "mlflow_run_id": run_id,
        "experiment": config.run.experiment,
        "iterations": config.run.iterations,
        "last_metrics": metrics,
    }
