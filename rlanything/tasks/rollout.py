"""Steps 1–2: rollout (the policy plays each task G times, `agent.play.play`) and verify
(the outcome ±1, `envs.verification.verify_episode`, and the environment's step labels where it
knows them, `envs.verification.label_episode`)."""

from __future__ import annotations

import collections
import logging
import shutil

import pandas as pd

from rlanything import metric_names as names
from rlanything import stopping
from rlanything.agent.play import play_as_configured
from rlanything.algo.curriculum import success_rate
from rlanything.algo.parsing import FALLBACKS
from rlanything.environment import runs_code
from rlanything.envs.verification import label_episode, verify_episode
from rlanything.models.engines.generation import PrefixCache
from rlanything.models.precision import precision_of
from rlanything.progress import progress
from rlanything.seeding import derive_seed
from rlanything.storage.artifacts import read_artifact, write_artifact
from rlanything.storage.buffer import read_buffer, sample_batch
from rlanything.storage.parquet import write_bytes
from rlanything.tasks.common import model_path, open_run, step_engine, step_task, weights_label


@step_task("rollout")
def rollout(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    buffer = read_buffer(layout.tasks_snapshot(iteration))
    tasks = sample_batch(buffer, config.policy.tasks_per_iteration, derive_seed(config.run.seed, iteration, "sample"))
    path = model_path(config, layout, "policy", iteration)
    total = len(tasks) * config.policy.group_size * config.env.max_steps
    shots_dir, shot_errors = layout.screenshots_dir(iteration), []
    shutil.rmtree(shots_dir, ignore_errors=True)  # a re-run rollout must not mix in old pictures

    def save_screenshot(traj_id: int, step_idx: int | None, png: bytes) -> str:
        out = write_bytes(png, layout.screenshot(iteration, traj_id, step_idx))
        return str(out.relative_to(layout.iter_dir(iteration)))

    with progress(f"iter {iteration}: rollout", total) as advance:
        precision = precision_of(config, "policy", "generation", layout.run_dir)
        engine, tokenizer = step_engine(config, "policy", path, precision, advance, layout.run_dir / "vllm-policy.log")
        cache = PrefixCache()
        rows, episodes = play_as_configured(
            engine,
            tokenizer,
            config,
            tasks,
            iteration,
            save_screenshot=save_screenshot if config.env.screenshots else None,
            screenshot_errors=shot_errors,
            prefix_cache=cache,
        )
        weights = weights_label(layout, engine.weights)  # which weights produced each sample
        rows = [{**row, "weights": weights} for row in rows]
    paths = [
        write_artifact(rows, layout, iteration, "rollouts"),
        write_artifact(episodes, layout, iteration, "episodes"),
    ]
    if shots_dir.exists():
        paths.append(shots_dir)  # logged to MLflow as iter_NNNN/screenshots/
    frame = pd.DataFrame(rows)
    metrics = {
        "rollout/trajectories": len(episodes),
        "rollout/steps": len(rows),
        "rollout/action_parse_rate": float((frame.action_status == "ok").mean()) if rows else 0.0,
        "rollout/last_number_rate": float((frame.action_status == "last_number").mean()) if rows else 0.0,
        "rollout/fallback_rate": float(frame.action_status.isin(FALLBACKS).mean()) if rows else 0.0,
        "rollout/truncated_frac": float((frame.finish_reason == "length").mean()) if rows else 0.0,
        "tokens/policy_prompt": int(frame.prompt_tokens.sum()) if rows else 0,
        "tokens/policy_response": int(frame.response_tokens.sum()) if rows else 0,
        "rollout/env_errors": sum(e["termination"] == "env_error" for e in episodes),
        "rollout/screenshots": len(list(shots_dir.glob("*.png"))) if shots_dir.exists() else 0,
        "rollout/screenshot_errors": len(shot_errors),
    }
    if cache.prompt_tokens:  # the transformers engine served them (vLLM reuses prefixes on its own)
        metrics["tokens/policy_prompt_reused"] = cache.reused_tokens  # KV kept from the turn before
    for line in shot_errors[:5]:
        logging.getLogger(__name__).warning("screenshot failed: %s", line)
    return paths, metrics


@step_task("verify")
def verify(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    steps, episodes = read_artifact(layout, iteration, "rollouts"), read_artifact(layout, iteration, "episodes")
    specs = read_buffer(layout.tasks_snapshot(iteration)).set_index("task_id").spec
    # a missing action reads back as NaN (pandas' string dtype); environments are promised None
    actions = (
        steps.sort_values("step_idx")
        .groupby("traj_id")
        .action.apply(lambda column: [a if isinstance(a, str) else None for a in column])
    )
    sandbox_runs = collections.Counter()  # programs the replays ran in the sandbox, by isolation
    rows = []
    for ep in episodes.itertuples(index=False):
        stopping.check()  # a replay can take long (a game, a sandboxed program)
        rows.append(
            verify_episode(config.env, ep._asdict(), specs[ep.task_id], actions.get(ep.traj_id, []), sandbox_runs)
        )
    labels, label_errors = [], 0
    for row in rows:
        stopping.check()
        try:
            labelled = label_episode(config.env, row, specs[row["task_id"]], actions.get(row["traj_id"], []))
        except Exception as err:  # labels only measure the RM: a failure costs this trajectory's labels
            label_errors += 1
            logging.getLogger(__name__).warning("step labels of trajectory %d: %r", row["traj_id"], err)
            continue
        if labelled is None:  # the environment labels no step
            break
        labels += labelled
    paths = [write_artifact(labels, layout, iteration, "step_labels")]
    paths.append(write_artifact(rows, layout, iteration, "outcomes"))  # last: marks the step done
    frame = pd.DataFrame(rows)
    scored = frame[frame.valid & ~frame.pending]
    metrics = {
        names.ACCURACY: success_rate(scored.outcome.to_numpy()),
        names.MEAN_OUTCOME: float(scored.outcome.mean()) if len(scored) else 0.0,
        "verify/invalid_trajectories": int((~frame.valid).sum()),
    }
    if runs_code(config.env.kind):
        metrics["verify/sandbox_weak_runs"] = sandbox_runs["weak"]  # without bubblewrap
    if label_errors:
        metrics["verify/step_label_errors"] = label_errors
    return paths, metrics
