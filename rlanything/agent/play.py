"""Multi-turn rollouts: play every task G times, one batched generation per step index.

Each step is recorded with the exact prompt tokens the policy saw and the tokens it produced
(with their log-probs), so a training sample is a row of this table, for single-turn and
multi-turn environments alike. An environment that raises ends its episode as `env_error`:
the trajectory is kept, counted and never trained on.

Environments with a screen (MiniWoB++, OSWorld) also leave a PNG per step through
`save_screenshot(traj_id, step_idx or None for the start screen, png) -> path`; a screenshot
that fails is counted in `screenshot_errors` and recorded as a missing path, never a lost
episode. Environments that cannot be replayed (`replayable = False`) get their verifier asked at
the end of the live episode (`live_outcome`), since verify cannot replay them.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from rlanything.agent.run_context import model_path, step_engine, weights_label
from rlanything.algo.parsing import FALLBACKS, parse_answer
from rlanything.envs import make_env
from rlanything.envs.base import Environment, example_of, replayable, screenshot
from rlanything.models.engines.generation import GenerationEngine, PrefixCache
from rlanything.models.precision import precision_of
from rlanything.models.prompts import policy_messages, render
from rlanything.progress import progress
from rlanything.seeding import derive_seed, step_seed
from rlanything.storage.layout import RunLayout


@dataclass
class Episode:
    traj_id: int
    task: dict[str, Any]  # task_id, slot, version, spec, pending
    rollout_idx: int
    env: Environment
    observations: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    termination: str | None = None  # done | max_steps | env_error
    error: str | None = None
    first_screenshot: str | None = None
    live_outcome: int | None = None


SaveScreenshot = Callable[[int, "int | None", bytes], str]


def _keep_screen(ep: Episode, save: SaveScreenshot | None, step_idx: int | None, errors: list[str]) -> str | None:
    """Save the environment's current screen, if it has one and the episode is still sound."""
    if save is None or ep.termination == "env_error":
        return None
    try:
        png = screenshot(ep.env)
        return save(ep.traj_id, step_idx, png) if png is not None else None
    except Exception as err:  # a lost picture is counted; the episode goes on
        errors.append(f"traj {ep.traj_id} step {step_idx}: {type(err).__name__}: {err}")
        return None


def env_call(ep: Episode, fn: Callable, *args) -> Any:
    """`fn(*args)` on the episode's environment -> its result, or None with the episode ended as
    `env_error` (the error kept) where the environment raised. Replays (agent/branching.py) use it
    too, so a crashed replay is counted as a crashed episode is."""
    try:
        return fn(*args)
    except Exception as err:  # an environment crash is data, not a crashed iteration
        ep.termination, ep.error = "env_error", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
        return None


def play_as_configured(
    engine: GenerationEngine, tokenizer, config, tasks: list[dict[str, Any]], iteration: int, **kwargs
):
    """`play` with a run's settings (`config`): the policy's sampling, the environment's turns and
    answer fallback, and iteration `iteration`'s rollout seed -> `play`'s (rows, episodes). The
    rollout step plays with it, and so does benchmarks/ray_sharding.py; `kwargs`: `play`'s
    save_screenshot, screenshot_errors, prefix_cache."""
    return play(
        engine,
        tokenizer,
        lambda: make_env(config.env),
        tasks,
        group_size=config.policy.group_size,
        max_steps=config.env.max_steps,
        max_new_tokens=config.policy.max_new_tokens,
        temperature=config.policy.temperature,
        top_p=config.policy.top_p,
        seed=derive_seed(config.run.seed, iteration, "rollout"),
        answer_fallback=config.env.answer_fallback,
        **kwargs,
    )


def play_iteration(config, layout: RunLayout, iteration: int, tasks: list[dict[str, Any]], save_screenshot=None):
    """Step 1: the policy of `iteration` (last iteration's checkpoint, or the base) plays `tasks`
    as the run is configured, on the run's engine -> (rows, episodes, metrics), every row naming
    the weights that produced it."""
    total = len(tasks) * config.policy.group_size * config.env.max_steps
    shot_errors: list[str] = []
    with progress(f"iter {iteration}: rollout", total) as advance:
        path = model_path(config, layout, "policy", iteration)
        precision = precision_of(config, "policy", "generation", layout.run_dir)
        engine, tokenizer = step_engine(config, "policy", path, precision, advance, layout.run_dir / "vllm-policy.log")
        cache = PrefixCache()
        rows, episodes = play_as_configured(
            engine,
            tokenizer,
            config,
            tasks,
            iteration,
            save_screenshot=save_screenshot,
            screenshot_errors=shot_errors,
            prefix_cache=cache,
        )
        weights = weights_label(layout, engine.weights)  # which weights produced each sample
    rows = [{**row, "weights": weights} for row in rows]
    metrics = rollout_metrics(rows, episodes, shot_errors)
    if cache.prompt_tokens:  # the transformers engine served them (vLLM reuses prefixes on its own)
        metrics["tokens/policy_prompt_reused"] = cache.reused_tokens  # KV kept from the turn before
    for line in shot_errors[:5]:
        logging.getLogger(__name__).warning("screenshot failed: %s", line)
    return rows, episodes, metrics


def rollout_metrics(rows: list[dict], episodes: list[dict], shot_errors: list[str]) -> dict[str, float]:
    """The rollout step's measures of its step `rows` and `episodes`."""
    frame = pd.DataFrame(rows)
    rate = lambda mask: float(mask.mean())  # noqa: E731
    return {
        "rollout/trajectories": len(episodes),
        "rollout/steps": len(rows),
        "rollout/action_parse_rate": rate(frame.action_status == "ok") if rows else 0.0,
        "rollout/last_number_rate": rate(frame.action_status == "last_number") if rows else 0.0,
        "rollout/fallback_rate": rate(frame.action_status.isin(FALLBACKS)) if rows else 0.0,
        "rollout/truncated_frac": rate(frame.finish_reason == "length") if rows else 0.0,
        "tokens/policy_prompt": int(frame.prompt_tokens.sum()) if rows else 0,
        "tokens/policy_response": int(frame.response_tokens.sum()) if rows else 0,
        "rollout/env_errors": sum(e["termination"] == "env_error" for e in episodes),
        "rollout/screenshot_errors": len(shot_errors),
    }


def play(
    engine: GenerationEngine,
    tokenizer,
    make_env: Callable[[], Environment],
    tasks: list[dict[str, Any]],
    *,
    group_size: int,
    max_steps: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    answer_fallback: str = "none",
    save_screenshot: SaveScreenshot | None = None,
    screenshot_errors: list[str] | None = None,
    prefix_cache: PrefixCache | None = None,
) -> tuple[list[dict], list[dict]]:
    """-> (step rows for rollouts.parquet, trajectory rows with termination info).

    `screenshot_errors`, when given, collects one line per screenshot that failed;
    `prefix_cache` (a fresh one when None) carries the episodes' KV from turn to turn."""
    shot_errors = screenshot_errors if screenshot_errors is not None else []
    episodes = _start_episodes(make_env, tasks, group_size, save_screenshot, shot_errors)
    rows = play_on(
        engine,
        tokenizer,
        episodes,
        max_steps=max_steps,
        sampling={"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p},
        seed=seed,
        answer_fallback=answer_fallback,
        save_screenshot=save_screenshot,
        screenshot_errors=shot_errors,
        prefix_cache=prefix_cache,
    )
    return rows, [_finish(ep) for ep in episodes]


def play_on(
    engine: GenerationEngine,
    tokenizer,
    episodes: list[Episode],
    *,
    max_steps: int,
    sampling: dict[str, Any],
    seed: int,
    answer_fallback: str = "none",
    save_screenshot: SaveScreenshot | None = None,
    screenshot_errors: list[str] | None = None,
    prefix_cache: PrefixCache | None = None,
) -> list[dict]:
    """Play `episodes` on from where each stands (`len(ep.responses)` steps taken) until each has
    ended or taken `max_steps` -> their step rows. One batched generation per turn, turn t with
    `step_seed(seed, t)` and `sampling` (max_new_tokens, temperature, top_p); fresh episodes
    (`play`) reach step t at turn t, episodes set up part-way (`agent.branching`) sooner."""
    shot_errors = screenshot_errors if screenshot_errors is not None else []
    rows: list[dict] = []
    prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()  # turn t's prompts extend turn t-1's
    for turn in range(max_steps):
        active = [ep for ep in episodes if ep.termination is None and len(ep.responses) < max_steps]
        if not active:
            break
        rendered = [_render_prompt(tokenizer, ep) for ep in active]
        gens = engine.generate(
            [ids for _, ids in rendered], **sampling, seed=step_seed(seed, turn), prefix_cache=prefix_cache
        )
        for ep, (prompt, prompt_ids), gen in zip(active, rendered, gens):
            step_idx = len(ep.responses)
            last = step_idx == max_steps - 1
            played = _act(ep, gen.text, step_idx, last, answer_fallback, save_screenshot, shot_errors)
            rows.append(_step_row(ep, step_idx, prompt, prompt_ids, gen, *played))
    return rows


def _start_episodes(
    make_env: Callable[[], Environment],
    tasks: list[dict[str, Any]],
    group_size: int,
    save: SaveScreenshot | None,
    errors: list[str],
) -> list[Episode]:
    """One episode per (task, rollout), every environment made first, then each reset to its
    task's spec (its first observation and start screen kept; a reset that raises is env_error)."""
    episodes = [
        Episode(t * group_size + r, task, r, make_env()) for t, task in enumerate(tasks) for r in range(group_size)
    ]
    for ep in episodes:
        first = env_call(ep, ep.env.reset, ep.task["spec"])
        if first is not None:
            ep.observations.append(first)
            ep.first_screenshot = _keep_screen(ep, save, None, errors)
    return episodes


def _render_prompt(tokenizer, ep: Episode) -> tuple[str, list[int]]:
    """The policy's prompt for the episode's next turn -> (text, token ids)."""
    return render(tokenizer, policy_messages(ep.env.system_prompt, ep.observations, ep.responses, example_of(ep.env)))


def _act(
    ep: Episode,
    response: str,
    step_idx: int,
    last_step: bool,
    answer_fallback: str,
    save: SaveScreenshot | None,
    errors: list[str],
) -> tuple[str | None, str, str, str | None]:
    """Play one policy response in its episode -> (action, action_status, observation, screenshot).

    The episode ends "done" when the environment says so (or failed: env_error), else
    "max_steps" on the last step; a finished episode of an environment that cannot be replayed
    gets its outcome asked now (`live_outcome`), after the step's screenshot."""
    action, status = parse_answer(response, fallback=answer_fallback)
    result = env_call(ep, ep.env.step, action)
    observation = result.observation if result is not None else ""
    done = result.done if result is not None else True
    ep.responses.append(response)
    ep.observations.append(observation)
    if ep.termination is None and done:
        ep.termination = "done"
    elif ep.termination is None and last_step:
        ep.termination = "max_steps"
    shot = _keep_screen(ep, save, step_idx, errors)
    if ep.termination == "done" and not replayable(ep.env):
        ep.live_outcome = env_call(ep, ep.env.outcome)
    return action, status, observation, shot


def _episode_ids(ep: Episode) -> dict[str, Any]:
    """The columns that name an episode, first in both a step row and a trajectory row."""
    return {
        "traj_id": ep.traj_id,
        "task_id": ep.task["task_id"],
        "slot": ep.task["slot"],
        "version": ep.task["version"],
        "rollout_idx": ep.rollout_idx,
    }


def _step_row(
    ep: Episode,
    step_idx: int,
    prompt: str,
    prompt_ids: list[int],
    gen,
    action: str | None,
    status: str,
    observation: str,
    shot: str | None,
) -> dict:
    """One row of rollouts.parquet: the exact tokens the policy saw and produced at this step."""
    return {
        **_episode_ids(ep),
        "step_idx": step_idx,
        "prompt": prompt,
        "response": gen.text,
        "action": action,
        "action_status": status,
        "observation": observation,
        "done": ep.termination is not None,
        "finish_reason": gen.finish_reason,
        "prompt_ids": prompt_ids,
        "response_ids": gen.token_ids,
        "logprobs": gen.logprobs,
        "prompt_tokens": len(prompt_ids),
        "response_tokens": len(gen.token_ids),
        "pending": ep.task["pending"],
        "screenshot": shot,
    }


def _finish(ep: Episode) -> dict:
    """Close the episode's environment, then its trajectory row (a close that raises is env_error)."""
    env_call(ep, ep.env.close)
    return {
        **_episode_ids(ep),
        "first_observation": ep.observations[0] if ep.observations else "",
        "num_steps": len(ep.responses),
        "termination": ep.termination or "max_steps",
        "error": ep.error,
        "pending": ep.task["pending"],
        "first_screenshot": ep.first_screenshot,
        "live_outcome": ep.live_outcome,
    }
