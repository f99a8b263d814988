"""Monte-Carlo values of the states an episode passed through: the policy plays on K times from
each (`algo.mc_progress` turns them into a step target grounded in the game).

A state is the point after an episode's first k actions, together with everything the policy had
seen there: its first k+1 observations and k responses. A continuation is a fresh environment
reset to the episode's spec with those k actions replayed in it (text games are deterministic:
the same actions reach the same state; a replay that disagrees with the recorded observations is
counted, `replay_mismatch`), then played on by `agent.play.play_on` until it ends or reaches the
episode limit. V(state) is the mean outcome (±1) of its valid continuations.

Cost: K continuations of up to max_steps − k turns per state, in one batched generation per turn.

`progress_rows` is what the rm_score step does with it under `algo.rm_target: progress`: value a
sample of the iteration's steps with the policy that played them (or, with `algo.progress_source:
siblings`, all of them from the iteration's own episodes, at no cost), for `algo.samples` to pay
the RM's judgments of those steps by the sign of their progress.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rlanything import memory
from rlanything.agent.play import Episode, env_call, play_on
from rlanything.agent.run_context import model_path, step_engine
from rlanything.algo.curriculum import tasks_in_bands
from rlanything.algo.mc_progress import branch_states, progress_targets, sibling_values
from rlanything.config import Config
from rlanything.environment import Environment
from rlanything.envs.base import make_env
from rlanything.models.engines.generation import GenerationEngine
from rlanything.models.precision import precision_of
from rlanything.seeding import derive_seed
from rlanything.storage.layout import RunLayout


@dataclass(frozen=True)
class BranchPoint:
    """A state to measure: the game `spec` after `actions`, seen as `observations` (one more than
    `responses`, the policy's answers that parsed to `actions`)."""

    spec: dict[str, Any]
    observations: tuple[str, ...]
    responses: tuple[str, ...]
    actions: tuple[str | None, ...]


def _replayed(point: BranchPoint, index: int, rollout: int, env: Environment) -> tuple[Episode, bool]:
    """A continuation standing at `point`: its environment replayed there -> (episode, whether
    the replay saw other observations than the recorded ones)."""
    task = {"task_id": f"branch-{index:05d}", "slot": index, "version": 0, "spec": point.spec, "pending": False}
    ep = Episode(traj_id=index, task=task, rollout_idx=rollout, env=env)
    seen = [env_call(ep, env.reset, point.spec)]
    for action in point.actions:
        if ep.termination is not None:
            break
        result = env_call(ep, env.step, action)
        seen.append(result.observation if result is not None else None)
        if result is not None and result.done:
            ep.termination = "done"  # the recorded episode went on: the replay disagrees
    ep.observations, ep.responses = list(point.observations), list(point.responses)
    return ep, seen != list(point.observations)


def state_values(
    engine: GenerationEngine,
    tokenizer,
    make_env: Callable[[], Environment],
    points: list[BranchPoint],
    *,
    k: int,
    max_steps: int,
    sampling: dict[str, Any],
    seed: int,
    answer_fallback: str = "none",
) -> tuple[np.ndarray, dict[str, int]]:
    """V of each point from `k` continuations -> (values (P,) float, NaN where no continuation
    was valid; counts: continuations, steps_played, response_tokens, env_errors, replay_mismatch).
    A continuation whose replay disagrees or whose environment fails is not counted in V."""
    episodes, mismatched = [], []
    for index, point in enumerate(points):
        for rollout in range(k):
            ep, bad = _replayed(point, index, rollout, make_env())
            episodes.append(ep)
            mismatched.append(bad)
    rows = play_on(
        engine, tokenizer, episodes, max_steps=max_steps, sampling=sampling, seed=seed, answer_fallback=answer_fallback
    )
    outcomes = np.full(len(episodes), np.nan)
    for i, ep in enumerate(episodes):
        if ep.termination != "env_error" and not mismatched[i]:
            won = env_call(ep, ep.env.outcome)
            outcomes[i] = np.nan if won is None else float(won)
        env_call(ep, ep.env.close)
    by_point = outcomes.reshape(len(points), k)
    valid = ~np.isnan(by_point)
    values = np.where(valid.any(axis=1), np.nansum(by_point, axis=1) / np.maximum(valid.sum(axis=1), 1), np.nan)
    counts = {
        "continuations": len(episodes),
        "steps_played": len(rows),
        "response_tokens": sum(row["response_tokens"] for row in rows),
        "env_errors": sum(ep.termination == "env_error" for ep in episodes),
        "replay_mismatch": sum(mismatched),
    }
    return values, counts


def trainable_steps(steps: pd.DataFrame, judged: pd.DataFrame, config: Config, can_train: set[tuple[int, int]]):
    """The judged trajectories' steps before their last, in tasks inside `algo.band`, among
    `can_train` (`agent.judging.can_train`: the only ones whose judgments can train the RM) ->
    those step rows."""
    tasks = tasks_in_bands(judged.outcome.to_numpy(), judged.task_id.to_numpy(), config.algo.band)
    last = judged.set_index("traj_id").num_steps - 1
    kept = judged[judged.task_id.isin(tasks)].traj_id
    pool = steps[steps.traj_id.isin(kept)]
    pool = pool[pool.step_idx < pool.traj_id.map(last)]
    # a boolean array, not a list: an empty list would select no columns instead of no rows
    pool = pool[np.array([(int(t), int(k)) in can_train for t, k in zip(pool.traj_id, pool.step_idx)], dtype=bool)]
    return pool.sort_values(["traj_id", "step_idx"])


def sampled_steps(
    steps: pd.DataFrame, judged: pd.DataFrame, config: Config, seed: int, can_train: set[tuple[int, int]]
) -> pd.DataFrame:
    """`algo.progress_steps` of the `trainable_steps`, drawn with `seed` -> those step rows."""
    pool = trainable_steps(steps, judged, config, can_train)
    return pool.sample(n=min(config.algo.progress_steps, len(pool)), random_state=seed).sort_values(
        ["traj_id", "step_idx"]
    )


def histories(steps: pd.DataFrame, episodes: pd.DataFrame, traj_ids) -> dict[int, tuple]:
    """Each trajectory's history for `algo.mc_progress.sibling_values`: (its task and first
    observation, then (action, observation) of each step in order)."""
    first = episodes.set_index("traj_id")
    ordered = steps[steps.traj_id.isin(set(traj_ids))].sort_values(["traj_id", "step_idx"])
    events = {
        int(t): [(a if isinstance(a, str) else None, o) for a, o in zip(g.action, g.observation)]
        for t, g in ordered.groupby("traj_id")
    }
    return {int(t): ((first.task_id[t], first.first_observation[t]), *events.get(int(t), ())) for t in traj_ids}


def _points(states: list[tuple[int, int]], steps: pd.DataFrame, episodes: pd.DataFrame, specs) -> list[BranchPoint]:
    """The BranchPoint of each (traj_id, k): the state after that trajectory's first k steps."""
    first = episodes.set_index("traj_id")
    points = []
    for traj_id, k in states:
        taken = steps[steps.traj_id == traj_id].sort_values("step_idx").head(k)
        points.append(
            BranchPoint(
                spec=specs[first.task_id[traj_id]],
                observations=(first.first_observation[traj_id], *taken.observation),
                responses=tuple(taken.response),
                actions=tuple(a if isinstance(a, str) else None for a in taken.action),
            )
        )
    return points


def progress_rows(
    config: Config,
    layout: RunLayout,
    iteration: int,
    frames: dict[str, pd.DataFrame],
    judged: pd.DataFrame,
    can_train: set[tuple[int, int]],
) -> tuple[list[dict], dict[str, float]]:
    """rm_score under `algo.rm_target: progress`, after judging: the values of the states around
    the judged steps in `can_train`, and their progress -> (PROGRESS rows, metrics).
    `algo.progress_source` continuations: a sample of those steps (`sampled_steps`), valued by
    playing on with this iteration's policy; siblings: all of them, valued from the iteration's
    own episodes of their task (`algo.mc_progress.sibling_values`)."""
    steps = frames["rollouts"]
    ends = {int(t): (int(n), float(o)) for t, n, o in zip(judged.traj_id, judged.num_steps, judged.outcome)}
    siblings = config.algo.progress_source == "siblings"
    if siblings:
        picked = trainable_steps(steps, judged, config, can_train)
    else:
        picked = sampled_steps(
            steps, judged, config, derive_seed(config.run.seed, iteration, "progress_sample"), can_train
        )
    if picked.empty:
        return [], {"progress/steps": 0}
    if siblings:
        value, metrics = _sibling_values(frames, picked)
    else:
        value, metrics = _continuation_values(config, layout, iteration, frames, picked, ends)
    traj, step = picked.traj_id.to_numpy(), picked.step_idx.to_numpy()
    gain = progress_targets(traj, step, value, ends)
    rows = [
        {
            "traj_id": t,
            "step_idx": k,
            "value_before": value.get((t, k)),
            "value_after": value.get((t, k + 1)),
            "progress": g,
        }
        for t, k, g in zip(traj.tolist(), step.tolist(), gain.tolist())
    ]
    metrics |= {"progress/steps": len(rows), "progress/nonzero_share": float(np.mean(np.nan_to_num(gain) != 0))}
    return rows, metrics


def _sibling_values(frames: dict[str, pd.DataFrame], picked: pd.DataFrame) -> tuple[dict, dict[str, float]]:
    """V of every state of the `picked` steps' tasks, from this iteration's valid episodes of
    those tasks (`algo.mc_progress.sibling_values`) -> ({(traj_id, k): V}, metrics)."""
    outcomes = frames["outcomes"]
    played = outcomes[outcomes.valid & ~outcomes.pending & outcomes.task_id.isin(set(picked.task_id))]
    events = histories(frames["rollouts"], frames["episodes"], played.traj_id.tolist())
    return sibling_values(events, dict(zip(played.traj_id, played.outcome))), {"progress/episodes": len(played)}


def _continuation_values(config, layout, iteration, frames, picked, ends) -> tuple[dict, dict[str, float]]:
    """V of the states before and after each `picked` step, from `algo.progress_k` continuations
    of this iteration's policy -> ({(traj_id, k): V}, metrics)."""
    steps, episodes = frames["rollouts"], frames["episodes"]
    states = branch_states(picked.traj_id.to_numpy(), picked.step_idx.to_numpy(), ends)
    specs = {task_id: json.loads(spec) for task_id, spec in frames["specs"].items()}
    path = model_path(config, layout, "policy", iteration)
    precision = precision_of(config, "policy", "generation", layout.run_dir)
    engine, tokenizer = step_engine(config, "policy", path, precision, None, layout.run_dir / "vllm-policy.log")
    policy = config.policy
    values, counts = state_values(
        engine,
        tokenizer,
        lambda: make_env(config.env),
        _points(states, steps, episodes, specs),
        k=config.algo.progress_k,
        max_steps=config.env.max_steps,
        sampling={"max_new_tokens": policy.max_new_tokens, "temperature": policy.temperature, "top_p": policy.top_p},
        seed=derive_seed(config.run.seed, iteration, "progress"),
        answer_fallback=config.env.answer_fallback,
    )
    del engine
    memory.release(collect=True)
    return dict(zip(states, values.tolist())), {f"progress/{name}": float(n) for name, n in counts.items()}
