"""The RM judges steps as a run is configured (rm.role judge): which steps it judges and with what
context (`steps_to_judge`, `judged_outcomes`), `models.judge.judge_steps` with the config's RM
settings (`rm`) and the judge hint of the environment kind (`env.kind`), and the rm_score step's
work for this role (`score_steps`).

Here, not in models/, because it joins the config, an environment class and an engine: models/
never imports the environments. Called by the rm_score step, the held-out evaluation
(agent/eval_judge.py) and benchmarks/rm_scoring.py --replay.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from rlanything import metric_names as names
from rlanything.agent.branching import progress_rows
from rlanything.agent.run_context import model_path, step_engine, weights_label
from rlanything.algo.curriculum import tasks_in_bands
from rlanything.config import Config
from rlanything.envs import env_class
from rlanything.envs.base import optional
from rlanything.models.engines.generation import GenerationEngine, PrefixCache
from rlanything.models.judge import judge_steps
from rlanything.models.precision import precision_of
from rlanything.progress import progress
from rlanything.seeding import derive_seed
from rlanything.storage.layout import RunLayout
from rlanything.storage.schemas import JUDGMENTS


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


def steps_to_judge(
    steps: pd.DataFrame, episodes: pd.DataFrame, outcomes: pd.DataFrame, history_steps: int | None = None
) -> list[dict]:
    """Every step of every valid, non-pending trajectory, with the context the RM sees: the
    task and the `history_steps` latest earlier steps (None: all; `rm.history_steps`), the
    first of them numbered `shown_from`."""
    trainable = outcomes[outcomes.valid & ~outcomes.pending].traj_id
    first = episodes.set_index("traj_id").first_observation
    out = []
    for traj_id, traj in steps[steps.traj_id.isin(trainable)].sort_values("step_idx").groupby("traj_id"):
        history: list[tuple[str, str]] = []
        for row in traj.itertuples(index=False):
            start = 0 if history_steps is None else max(0, len(history) - history_steps)
            out.append(
                {
                    "traj_id": traj_id,
                    "task_id": row.task_id,
                    "step_idx": row.step_idx,
                    "task": first[traj_id],
                    "history": history[start:],
                    "shown_from": start,
                    "response": row.response,
                    "observation": row.observation,
                }
            )
            history.append((row.response, row.observation))
    return out


def judged_outcomes(trainable: pd.DataFrame, config) -> pd.DataFrame:
    """Of the trainable (valid, non-pending) trajectories, those whose steps the RM judges: all,
    or with `rm.judge_trainable_only` those of tasks in `algo.band` or `algo.policy_band` (the only
    ones whose samples can train; a task's accuracy over these trajectories, as step 4 computes it)."""
    if not config.rm.judge_trainable_only:
        return trainable
    bands = (config.algo.band, config.algo.policy_band)
    tasks = tasks_in_bands(trainable.outcome.to_numpy(), trainable.task_id.to_numpy(), *bands)
    return trainable[trainable.task_id.isin(tasks)]


def split_verdicts(judgments: pd.DataFrame) -> set[tuple[int, int]]:
    """The (traj_id, step_idx) of the steps whose m judgments are not all alike (verdict and
    whether it parsed): only those can train the RM, whatever it is paid for (alike judgments
    earn equal rewards: zero_std).

    >>> split_verdicts(pd.DataFrame({"traj_id": [0, 0, 1, 1], "step_idx": [0, 0, 0, 0],
    ...     "step_score": [1, -1, 1, 1], "parsed": [True] * 4}))
    {(0, 0)}
    """
    kinds = judgments.groupby(["traj_id", "step_idx"])[["step_score", "parsed"]].nunique().max(axis=1)
    return {(int(t), int(k)) for (t, k), n in kinds.items() if n > 1}


def can_train(judgments: pd.DataFrame, config: Config) -> set[tuple[int, int]]:
    """The judged steps whose judgments can train the RM: those whose verdicts are split under the
    paper's z-score over a step's m judgments, every one with `algo.rm_advantage: reward`."""
    if config.algo.rm_advantage == "zscore":
        return split_verdicts(judgments)
    return {(int(t), int(k)) for t, k in zip(judgments.traj_id, judgments.step_idx)}


def score_steps(config: Config, layout: RunLayout, iteration: int, frames: dict[str, pd.DataFrame]):
    """rm_score for rm.role judge: the RM judges every step of the judged trajectories m times.
    `frames`: the iteration's rollouts, episodes and outcomes -> ({artifact: rows} in the order
    they are written, the last marking the step done; metrics)."""
    steps, episodes, outcomes = frames["rollouts"], frames["episodes"], frames["outcomes"]
    trainable = outcomes[outcomes.valid & ~outcomes.pending]
    judged = judged_outcomes(trainable, config)
    m = config.rm.judgments_per_step
    todo = steps_to_judge(steps, episodes, judged, config.rm.history_steps) if m else []  # 0: no RM
    rows: list[dict] = []
    cache = PrefixCache()
    with progress(f"iter {iteration}: rm_score", len(todo) * m) as advance:
        if todo:  # with no RM in the loop (m = 0, the policy-only arm) nothing is loaded or judged
            path = model_path(config, layout, "rm", iteration)
            precision = precision_of(config, "rm", "generation", layout.run_dir)
            engine, tokenizer = step_engine(config, "rm", path, precision, advance, layout.run_dir / "vllm-rm.log")
            seed = derive_seed(config.run.seed, iteration, "rm_score")
            rows = judge_as_configured(engine, tokenizer, todo, config, seed, prefix_cache=cache)
            weights = weights_label(layout, engine.weights)
            rows = [{**row, "weights": weights} for row in rows]
            del engine
    frame = pd.DataFrame(rows, columns=JUDGMENTS.names)
    valued, metrics = [], {}
    if rows and config.algo.rm_target == "progress":  # what the judgments will be paid for
        valued, metrics = progress_rows(config, layout, iteration, frames, judged, can_train(frame, config))
    metrics |= {
        "rm/judgments": len(rows),
        "rm/trajectories_unjudged": len(trainable) - len(judged),
        "tokens/rm_response": int(frame.response_ids.map(len).sum()) if rows else 0,
        "tokens/rm_prompt": int(frame.prompt_ids.map(len).sum()) if rows else 0,
    }
    if rows:  # none with no RM in the loop: no rate rather than a made-up 0
        metrics[names.RM_PARSE_RATE] = float(frame.parsed.mean())
    if cache.prompt_tokens:  # the transformers engine served them (vLLM reuses prefixes on its own)
        metrics["tokens/rm_prompt_reused"] = cache.reused_tokens  # KV of earlier steps' history
    outputs = {"progress": valued, "unit_tests": [], "pass_matrix": [], "judgments": rows}  # role judge: no tests
    return outputs, metrics
