"""Steps 5–6 as Prefect tasks: the PPO-clip updates of the policy and of the reward model
(`agent.update_data.train_model`; what each trains on: `agent.rm_roles.update_samples`)."""

from __future__ import annotations

from rlanything.agent.rm_roles import update_samples
from rlanything.agent.run_context import open_run
from rlanything.agent.update_data import steps_taken, train_model, update_metrics
from rlanything.metric_names import update_metric
from rlanything.storage import tracking
from rlanything.storage.artifacts import write_artifact
from rlanything.storage.checkpoints import folder_bytes
from rlanything.tasks.common import step_task


def _update(run_dir: str, iteration: int, kind: str):
    config, layout = open_run(run_dir)
    samples = update_samples(config, layout, iteration, kind)
    first_step = steps_taken(layout, kind, iteration)  # where the lr schedule stands, the same on a resume
    history = train_model(config, layout, iteration, kind, samples)
    path = write_artifact(history, layout, iteration, f"{kind}_update")  # last: marks the step done
    metrics = {update_metric(kind, "samples"): len(samples), update_metric(kind, "optimizer_steps"): len(history)}
    if replayed := sum(s.replayed for s in samples):  # rm.replay_iterations: earlier iterations' judgments
        metrics[update_metric(kind, "replayed_samples")] = replayed
    metrics[f"checkpoint/{kind}_bytes_written"] = folder_bytes(layout.checkpoint(kind, iteration))
    if history:
        summary, per_step = update_metrics(kind, history, first_step)
        metrics |= summary
        for step, values in per_step:  # MLflow charts every optimizer step at the run's step count
            tracking.log_metrics(config.mlflow_uri, layout.mlflow_run_id(), values, step=step)
    return [path], metrics  # checkpoints stay in the run folder: too big to copy per iteration


@step_task("policy_update")
def policy_update(run_dir: str, iteration: int):
    return _update(run_dir, iteration, "policy")


@step_task("rm_update")
def rm_update(run_dir: str, iteration: int):
    return _update(run_dir, iteration, "rm")
