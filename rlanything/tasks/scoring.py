"""Steps 3–4: rm_score (m judgments of every step) and advantages (policy and RM samples)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from rlanything.algo.advantages import rm_advantages, step_index_advantages
from rlanything.algo.curriculum import in_band, task_accuracy
from rlanything.algo.rewards import integrated_reward, rm_consistency_reward
from rlanything.envs import env_class
from rlanything.models.engine import PrefixCache, make_engine
from rlanything.models.judge import judge_steps
from rlanything.progress import progress
from rlanything.seeding import derive_seed
from rlanything.storage.parquet import read_table, write_table
from rlanything.storage.schemas import ADVANTAGES, EPISODES, JUDGMENTS, OUTCOMES, ROLLOUTS
from rlanything.tasks.common import FLIP_ADVANTAGE_ENV, model_path, open_run, step_task, weights_label


def steps_to_judge(steps: pd.DataFrame, episodes: pd.DataFrame, outcomes: pd.DataFrame) -> list[dict]:
    """Every step of every valid, non-pending trajectory, with the context the RM sees."""
    trainable = outcomes[outcomes.valid & ~outcomes.pending].traj_id
    first = episodes.set_index("traj_id").first_observation
    out = []
    for traj_id, traj in steps[steps.traj_id.isin(trainable)].sort_values("step_idx").groupby("traj_id"):
        history: list[tuple[str, str]] = []
        for row in traj.itertuples(index=False):
            out.append({
                "traj_id": traj_id, "task_id": row.task_id, "step_idx": row.step_idx, "task": first[traj_id],
                "history": list(history), "response": row.response, "observation": row.observation,
            })  # fmt: skip
            history.append((row.response, row.observation))
    return out


@step_task("rm_score")
def rm_score(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    steps = read_table(layout.artifact(iteration, "rollouts"), ROLLOUTS)
    episodes = read_table(layout.artifact(iteration, "episodes"), EPISODES)
    outcomes = read_table(layout.artifact(iteration, "outcomes"), OUTCOMES)
    todo = steps_to_judge(steps, episodes, outcomes)
    path = model_path(config, layout, "rm", iteration)
    with progress(f"iter {iteration}: rm_score", len(todo) * config.rm.judgments_per_step) as advance:
        engine, tokenizer = make_engine(config.rm, "rm", path, advance, layout.run_dir / "vllm-rm.log")
        cache = PrefixCache()
        rows = judge_steps(
            engine, tokenizer, todo, judgments_per_step=config.rm.judgments_per_step, verdict=config.rm.verdict,
            max_new_tokens=config.rm.max_new_tokens, temperature=config.rm.temperature, top_p=config.rm.top_p,
            seed=derive_seed(config.run.seed, iteration, "rm_score"), hint=env_class(config.env.kind).judge_hint,
            prefix_cache=cache,
        )  # fmt: skip
        weights = weights_label(layout, engine.weights)
        rows = [{**row, "weights": weights} for row in rows]
    out = write_table(rows, JUDGMENTS, layout.artifact(iteration, "judgments"))
    frame = pd.DataFrame(rows, columns=JUDGMENTS.names)
    metrics = {
        "rm/judgments": len(rows),
        "rm/parse_rate": float(frame.parsed.mean()) if rows else 0.0,
        "tokens/rm_response": int(frame.response_ids.map(len).sum()) if rows else 0,
        "tokens/rm_prompt": int(frame.prompt_ids.map(len).sum()) if rows else 0,
    }
    if cache.prompt_tokens:  # the transformers engine served them (vLLM reuses prefixes on its own)
        metrics["tokens/rm_prompt_reused"] = cache.reused_tokens  # KV of earlier steps' history
    return [out], metrics


def compute_samples(
    outcomes: pd.DataFrame, judgments: pd.DataFrame, *, m: int, lam: float, band: tuple, policy_band: tuple
) -> pd.DataFrame:
    """One row per policy sample (a step) and per RM sample (a judgment), with reward,
    advantage and whether it trains (design.md §1: rewards, advantages, accuracy bands)."""
    judged = judgments.sort_values(["traj_id", "step_idx", "judge_idx"])
    keys = judged.groupby(["traj_id", "step_idx"], sort=True)
    step_keys = np.array(list(keys.groups.keys()), dtype=np.int64).reshape(-1, 2)
    if not len(step_keys):
        return pd.DataFrame(columns=ADVANTAGES.names)
    score = judged.step_score.to_numpy(np.float64).reshape(-1, m)  # (N, m)
    parsed = judged.parsed.to_numpy(bool).reshape(-1, m)
    traj = outcomes.set_index("traj_id")
    outcome = traj.outcome.loc[step_keys[:, 0]].to_numpy(np.float64)
    task_ids = traj.task_id.loc[step_keys[:, 0]].to_numpy()
    accuracy = task_accuracy(outcomes.outcome.to_numpy(), outcomes.task_id.to_numpy())
    task_acc = np.array([accuracy[t] for t in task_ids])

    reward = integrated_reward(outcome, score, lam)  # (N,)
    advantage = step_index_advantages(reward, task_ids, step_keys[:, 1])
    policy_ok = in_band(task_acc, *policy_band)
    policy = pd.DataFrame({
        "kind": "policy", "traj_id": step_keys[:, 0], "task_id": task_ids, "step_idx": step_keys[:, 1],
        "judge_idx": -1, "reward": reward, "advantage": advantage, "kept": policy_ok & (advantage != 0),
        "drop_reason": np.where(~policy_ok, "out_of_band", np.where(advantage == 0, "zero_advantage", None)),
    })  # fmt: skip

    rm_reward = rm_consistency_reward(reward, score, parsed)  # (N, m)
    rm_adv, rm_valid = rm_advantages(rm_reward)
    rm_ok = in_band(task_acc, *band)
    rm = pd.DataFrame({
        "kind": "rm", "traj_id": np.repeat(step_keys[:, 0], m), "task_id": np.repeat(task_ids, m),
        "step_idx": np.repeat(step_keys[:, 1], m), "judge_idx": np.tile(np.arange(m), len(step_keys)),
        "reward": rm_reward.ravel(), "advantage": rm_adv.ravel(),
        "kept": np.repeat(rm_ok & rm_valid, m),
        "drop_reason": np.repeat(np.where(~rm_ok, "out_of_band", np.where(~rm_valid, "zero_std", None)), m),
    })  # fmt: skip
    return pd.concat([policy, rm], ignore_index=True)


@step_task("advantages")
def advantages(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    outcomes = read_table(layout.artifact(iteration, "outcomes"), OUTCOMES)
    judgments = read_table(layout.artifact(iteration, "judgments"), JUDGMENTS)
    trainable = outcomes[outcomes.valid & ~outcomes.pending]
    samples = compute_samples(
        trainable, judgments, m=config.rm.judgments_per_step, lam=config.algo.lam,
        band=config.algo.band, policy_band=config.algo.policy_band,
    )  # fmt: skip
    if os.environ.get(FLIP_ADVANTAGE_ENV) == "1":  # test-only fault: the learning test's negative control
        samples.loc[samples.kind == "policy", "advantage"] *= -1
    path = write_table(samples, ADVANTAGES, layout.artifact(iteration, "advantages"))
    pol, rm = samples[samples.kind == "policy"], samples[samples.kind == "rm"]
    judged = judgments[judgments.parsed].merge(outcomes[["traj_id", "outcome"]], on="traj_id")
    metrics = {
        "reward/policy_mean": float(pol.reward.mean()) if len(pol) else 0.0,
        "samples/policy_kept": int(pol.kept.sum()),
        "samples/rm_kept": int(rm.kept.sum()),
        "rm/agreement": float((judged.step_score == judged.outcome).mean()) if len(judged) else 0.0,
    }
    return [path], metrics
