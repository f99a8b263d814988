"""Steps 3–4 as Prefect tasks: rm_score (the RM judges every step m times, or writes unit tests)
and advantages (policy and RM samples). The work is the run's `rm.role` row of
`agent.rm_roles.RM_ROLES`."""

from __future__ import annotations

from rlanything.agent.rm_roles import advantage_samples, rm_score_outputs
from rlanything.agent.run_context import open_run
from rlanything.storage.artifacts import read_artifact, write_artifact
from rlanything.storage.buffer import read_buffer
from rlanything.tasks.common import step_task


@step_task("rm_score")
def rm_score(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    frames = {name: read_artifact(layout, iteration, name) for name in ("rollouts", "episodes", "outcomes")}
    frames["specs"] = read_buffer(layout.tasks_snapshot(iteration)).set_index("task_id").spec
    outputs, metrics = rm_score_outputs(config, layout, iteration, frames)
    return [write_artifact(rows, layout, iteration, name) for name, rows in outputs.items()], metrics


@step_task("advantages")
def advantages(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    names = ("outcomes", "judgments", "progress", "rollouts", "unit_tests", "pass_matrix", "step_labels")
    samples, metrics = advantage_samples(config, {n: read_artifact(layout, iteration, n) for n in names}, iteration)
    return [write_artifact(samples, layout, iteration, "advantages")], metrics
