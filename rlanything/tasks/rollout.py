"""Steps 1–2 as Prefect tasks: rollout (the policy plays each task G times,
`agent.play.play_iteration`) and verify (the outcome ±1 and the environment's step labels where
it knows them, `envs.verification.verify_all`)."""

from __future__ import annotations

import shutil

from rlanything import metric_names as names
from rlanything.agent.play import play_iteration
from rlanything.agent.run_context import open_run
from rlanything.algo.curriculum import success_rate
from rlanything.environment import runs_code
from rlanything.envs.verification import verify_all
from rlanything.seeding import derive_seed
from rlanything.storage.artifacts import read_artifact, write_artifact
from rlanything.storage.buffer import read_buffer, sample_batch
from rlanything.storage.parquet import write_bytes
from rlanything.tasks.common import step_task


@step_task("rollout")
def rollout(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    buffer = read_buffer(layout.tasks_snapshot(iteration))
    tasks = sample_batch(buffer, config.policy.tasks_per_iteration, derive_seed(config.run.seed, iteration, "sample"))
    shots_dir = layout.screenshots_dir(iteration)
    shutil.rmtree(shots_dir, ignore_errors=True)  # a re-run rollout must not mix in old pictures

    def save_screenshot(traj_id: int, step_idx: int | None, png: bytes) -> str:
        out = write_bytes(png, layout.screenshot(iteration, traj_id, step_idx))
        return str(out.relative_to(layout.iter_dir(iteration)))

    rows, episodes, metrics = play_iteration(
        config, layout, iteration, tasks, save_screenshot if config.env.screenshots else None
    )
    paths = [
        write_artifact(rows, layout, iteration, "rollouts"),
        write_artifact(episodes, layout, iteration, "episodes"),
    ]
    if shots_dir.exists():
        paths.append(shots_dir)  # logged to MLflow as iter_NNNN/screenshots/
    metrics["rollout/screenshots"] = len(list(shots_dir.glob("*.png"))) if shots_dir.exists() else 0
    return paths, metrics


@step_task("verify")
def verify(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    steps, episodes = read_artifact(layout, iteration, "rollouts"), read_artifact(layout, iteration, "episodes")
    specs = read_buffer(layout.tasks_snapshot(iteration)).set_index("task_id").spec
    rows, labels, label_errors, sandbox_runs = verify_all(config.env, episodes, steps, specs)
    paths = [write_artifact(labels, layout, iteration, "step_labels")]
    paths.append(write_artifact(rows, layout, iteration, "outcomes"))  # last: marks the step done
    scored = [r["outcome"] for r in rows if r["valid"] and not r["pending"]]
    metrics = {
        names.ACCURACY: success_rate(scored),
        names.MEAN_OUTCOME: sum(scored) / len(scored) if scored else 0.0,
        "verify/invalid_trajectories": sum(not r["valid"] for r in rows),
    }
    if runs_code(config.env.kind):
        metrics["verify/sandbox_weak_runs"] = sandbox_runs["weak"]  # without bubblewrap
    if label_errors:
        metrics["verify/step_label_errors"] = label_errors
    return paths, metrics
