"""The RM judges steps as a run is configured: `models.judge.judge_steps` with the config's RM
settings (`rm`) and the judge hint of the environment kind (`env.kind`).

Here, not in models/, because it joins the config, an environment class and an engine: models/
never imports the environments. Called by the rm_score step, the held-out evaluation
(agent/eval_judge.py) and benchmarks/rm_scoring.py --replay.
"""

from __future__ import annotations

from collections.abc import Callable

from rlanything.config import Config
from rlanything.envs import env_class
from rlanything.envs.base import optional
from rlanything.models.engines.generation import GenerationEngine, PrefixCache
from rlanything.models.judge import judge_steps


def judge_as_configured(
    engine: GenerationEngine,
    tokenizer,
    steps: list[dict],
    config: Config,
    seed: int,
    prefix_cache: PrefixCache | None = None,
) -> list[dict]:
    """`judge_steps` as a run judges: `config.rm`'s settings and the judge hint of `config.env`'s
    kind, its observations read through the kind's `judge_view` with `rm.compact_observations`
    (steps and rows as in `judge_steps`)."""
    rm = config.rm
    env = env_class(config.env.kind)
    if rm.compact_observations:
        steps = [compact(step, optional(env, "judge_view")) for step in steps]
    return judge_steps(
        engine,
        tokenizer,
        steps,
        judgments_per_step=rm.judgments_per_step,
        verdict=rm.verdict,
        max_new_tokens=rm.max_new_tokens,
        temperature=rm.temperature,
        top_p=rm.top_p,
        seed=seed,
        hint=env.judge_hint,
        prefix_cache=prefix_cache,
    )


def compact(step: dict, view: Callable[[str], str]) -> dict:
    """A `judge_steps` step with its task, earlier observations and next observation read
    through the environment's `judge_view` (`rm.compact_observations`)."""
    history = [(response, view(observation)) for response, observation in step["history"]]
    return {**step, "task": view(step["task"]), "history": history, "observation": view(step["observation"])}
