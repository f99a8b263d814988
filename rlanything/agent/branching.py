"""Monte-Carlo values of the states an episode passed through: the policy plays on K times from
each (`algo.mc_progress` turns them into a step target grounded in the game).

A state is the point after an episode's first k actions, together with everything the policy had
seen there: its first k+1 observations and k responses. A continuation is a fresh environment
reset to the episode's spec with those k actions replayed in it (text games are deterministic:
the same actions reach the same state; a replay that disagrees with the recorded observations is
counted, `replay_mismatch`), then played on by `agent.play.play_on` until it ends or reaches the
episode limit. V(state) is the mean outcome (±1) of its valid continuations.

Cost: K continuations of up to max_steps − k turns per state, in one batched generation per turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlanything.agent.play import Episode, _env_call, play_on
from rlanything.environment import Environment
from rlanything.models.engines.generation import GenerationEngine


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
    seen = [_env_call(ep, env.reset, point.spec)]
    for action in point.actions:
        if ep.termination is not None:
            break
        result = _env_call(ep, env.step, action)
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
            won = _env_call(ep, ep.env.outcome)
            outcomes[i] = np.nan if won is None else float(won)
        _env_call(ep, ep.env.close)
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
