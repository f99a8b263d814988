r"""Greedy evaluation of a policy on held-out problems (`rlanything eval`).

One episode per held-out problem, decoded greedily (temperature 0: the argmax token at every
position, so an evaluation is a deterministic function of the weights and the problems), through
the same multi-turn loop as training rollouts (`play`). The verifier is asked when the episode
ends, in the process that played it; an episode that reached the step cap is a failure, one whose
environment crashed is recorded as invalid (`valid` False, its error kept) and left out of the
accuracy, as in training.

Per episode we record whether the answers came from a \boxed{}: `success` is the outcome with
the environment's answer fallback (`env.answer_fallback`: an unboxed response read as its last
number, first word or last code block), `strict_success` the same outcome only where no step needed the fallback, and `boxed`
whether every step's answer was boxed. With `answer_fallback: none` the two successes agree.

Held-out problems come from the environment's `heldout_specs` (see envs/heldout.py for how they
are kept apart from training); `heldout_problems` also drops any spec the run's buffer held.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rlanything.agent.rollout import play
from rlanything.algo.parsing import FALLBACKS
from rlanything.envs.base import Environment, make_env, replayable
from rlanything.envs.heldout import drop_trained, heldout_specs
from rlanything.models.generation import GenerationEngine


class ScoredEnv:
    """An environment that asks its verifier when the episode is closed (before closing it).

    Attributes the rollout loop looks for (system_prompt, last_screenshot, replayable, ...)
    are those of the wrapped environment. Non-replayable environments were already asked at the
    end of the live episode (`live_outcome`), so they are not asked twice."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.outcome_value: int | None = None
        self.outcome_error: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, spec):
        return self.env.reset(spec)

    def step(self, action):
        return self.env.step(action)

    def outcome(self) -> int:
        return self.env.outcome()

    def close(self) -> None:
        try:
            if replayable(self.env):
                self.outcome_value = int(self.env.outcome())
        except Exception as err:  # a crashing verifier is recorded, never a silent -1
            self.outcome_error = f"verifier: {type(err).__name__}: {err}"
        finally:
            self.env.close()


def heldout_problems(env_config, split: str, n: int, run_seed: int, trained: list[dict]) -> tuple[list[dict], int]:
    """The first `n` held-out specs of `split` that the run never met -> (specs, dropped).

    `trained`: every spec the run's buffer ever held (all versions; [] for a bare model);
    `run_seed`: the seed its initial buffer was drawn with. Twice as many candidates as needed
    are drawn, so a few collisions with model-written rewrites still leave `n`."""
    candidates = heldout_specs(env_config, split, 2 * n, run_seed)
    return drop_trained(candidates, trained, n)


def play_greedy(
    engine: GenerationEngine,
    tokenizer,
    env_config,
    specs: list[dict],
    split: str,
    *,
    max_new_tokens: int,
    seed: int = 0,
    make: Callable[[], Environment] | None = None,
) -> list[dict]:
    """Play each spec once, greedily -> one row per episode (see `episode_row`)."""
    return play_greedy_steps(
        engine, tokenizer, env_config, specs, split, max_new_tokens=max_new_tokens, seed=seed, make=make
    )[0]


def play_greedy_steps(
    engine: GenerationEngine,
    tokenizer,
    env_config,
    specs: list[dict],
    split: str,
    *,
    max_new_tokens: int,
    seed: int = 0,
    make: Callable[[], Environment] | None = None,
) -> tuple[list[dict], list[dict]]:
    """`play_greedy`, also returning `play`'s step rows (traj_id = problem_idx, step_idx, response,
    observation, ...): what the RM judges (agent/eval_judge.py)."""
    envs: list[ScoredEnv] = []

    def new_env() -> ScoredEnv:
        env = ScoredEnv((make or (lambda: make_env(env_config)))())
        envs.append(env)  # play creates them in task order, one per task (group size 1)
        return env

    tasks = [
        {"task_id": f"{split}-{k:05d}", "slot": k, "version": 0, "spec": spec, "pending": False}
        for k, spec in enumerate(specs)
    ]
    steps, trajectories = play(
        engine,
        tokenizer,
        new_env,
        tasks,
        group_size=1,
        max_steps=env_config.max_steps,
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        top_p=1.0,
        seed=seed,
        answer_fallback=env_config.answer_fallback,
    )
    by_traj: dict[int, list[dict]] = {}
    for row in steps:
        by_traj.setdefault(row["traj_id"], []).append(row)
    rows = []
    for k, traj in enumerate(sorted(trajectories, key=lambda t: t["traj_id"])):
        traj_steps = sorted(by_traj.get(k, []), key=lambda r: r["step_idx"])
        rows.append(episode_row(split, env_config.kind, k, specs[k], traj, traj_steps, envs[k]))
    return rows, steps


def episode_row(split: str, kind: str, index: int, spec: dict, traj: dict, steps: list[dict], env: ScoredEnv) -> dict:
    """One row of eval episodes.parquet (schema EVAL_EPISODES) from `play`'s records."""
    termination, error = traj["termination"], traj["error"]
    valid, outcome = termination != "env_error", -1
    if termination == "done":
        verdict = env.outcome_value if replayable(env.env) else traj["live_outcome"]
        if verdict is None:
            valid, error = False, env.outcome_error or "verifier: no outcome recorded"
        else:
            outcome = int(verdict)
    statuses = [s["action_status"] for s in steps]
    fallback_steps = sum(s in FALLBACKS for s in statuses)  # read by a fallback, not from a box
    success = valid and outcome == 1
    return {
        "split": split,
        "env_kind": kind,
        "problem_idx": index,
        "spec": json.dumps(spec, sort_keys=True),
        "first_observation": traj["first_observation"],
        "outcome": outcome,
        "valid": valid,
        "success": success,
        "strict_success": success and fallback_steps == 0,
        "boxed": bool(statuses) and all(s == "ok" for s in statuses),
        "fallback_steps": fallback_steps,
        "num_steps": len(steps),
        "termination": termination,
        "error": error,
        "prompt_tokens": sum(s["prompt_tokens"] for s in steps),
        "response_tokens": sum(s["response_tokens"] for s in steps),
        "truncated_steps": sum(s["finish_reason"] == "length" for s in steps),
        "actions": [s["action"] for s in steps],
        "last_response": steps[-1]["response"] if steps else "",
    }
