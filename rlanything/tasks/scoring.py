"""Steps 3–4: rm_score (m judgments of every step) and advantages (policy and RM samples)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd

from rlanything import metric_names as names
from rlanything.agent.judging import judge_as_configured
from rlanything.algo.curriculum import tasks_in_bands
from rlanything.algo.rm_accuracy import guard, outcome_prediction, process_accuracy, process_auroc, verdict_shares
from rlanything.algo.samples import select_samples
from rlanything.models.engines.generation import PrefixCache
from rlanything.models.precision import precision_of
from rlanything.progress import progress
from rlanything.seeding import derive_seed
from rlanything.storage.artifacts import read_artifact, write_artifact
from rlanything.storage.schemas import ADVANTAGES, JUDGMENTS
from rlanything.tasks.common import model_path, open_run, step_engine, step_task, weights_label
from rlanything.tasks.unit_tests import score_with_unit_tests, unit_test_advantage_rows
from rlanything.tasks.unit_tests import solutions as unit_test_solutions


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


@step_task("rm_score")
def rm_score(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    if config.rm.role == "unit_tests":  # the coding setting: the RM writes tests, judges no step
        return score_with_unit_tests(config, layout, iteration)
    steps, episodes, outcomes = (read_artifact(layout, iteration, n) for n in ("rollouts", "episodes", "outcomes"))
    trainable = outcomes[outcomes.valid & ~outcomes.pending]
    judged = judged_outcomes(trainable, config)
    todo = (
        steps_to_judge(steps, episodes, judged, config.rm.history_steps) if config.rm.judgments_per_step else []
    )  # 0: no RM
    path = model_path(config, layout, "rm", iteration)
    rows: list[dict] = []
    cache = PrefixCache()
    with progress(f"iter {iteration}: rm_score", len(todo) * config.rm.judgments_per_step) as advance:
        if todo:  # with no RM in the loop (m = 0, the policy-only arm) nothing is loaded or judged
            precision = precision_of(config, "rm", "generation", layout.run_dir)
            engine, tokenizer = step_engine(config, "rm", path, precision, advance, layout.run_dir / "vllm-rm.log")
            seed = derive_seed(config.run.seed, iteration, "rm_score")
            rows = judge_as_configured(engine, tokenizer, todo, config, seed, prefix_cache=cache)
            weights = weights_label(layout, engine.weights)
            rows = [{**row, "weights": weights} for row in rows]
    empty = [write_artifact([], layout, iteration, name) for name in ("unit_tests", "pass_matrix")]  # role judge
    out = write_artifact(rows, layout, iteration, "judgments")  # last: marks the step done
    frame = pd.DataFrame(rows, columns=JUDGMENTS.names)
    metrics = {
        "rm/judgments": len(rows),
        "rm/trajectories_unjudged": len(trainable) - len(judged),
        "tokens/rm_response": int(frame.response_ids.map(len).sum()) if rows else 0,
        "tokens/rm_prompt": int(frame.prompt_ids.map(len).sum()) if rows else 0,
    }
    if rows:  # none with no RM in the loop: no rate rather than a made-up 0
        metrics[names.RM_PARSE_RATE] = float(frame.parsed.mean())
    if cache.prompt_tokens:  # the transformers engine served them (vLLM reuses prefixes on its own)
        metrics["tokens/rm_prompt_reused"] = cache.reused_tokens  # KV of earlier steps' history
    return [out, *empty], metrics


def compute_samples(
    outcomes: pd.DataFrame,
    judgments: pd.DataFrame,
    *,
    m: int,
    lam: float,
    band: tuple,
    policy_band: tuple,
    outcome_weight: float = 1.0,
    steps: pd.DataFrame | None = None,
    rm_balance: bool = False,
) -> pd.DataFrame:
    """advantages.parquet rows from the trainable trajectories' outcomes and their judgments:
    the frame glue around `algo.samples.select_samples` (policy rows first, then RM rows). With
    m = 0 (no RM in the loop) the policy samples are the trainable trajectories' `steps`."""
    cols = lambda frame, names: {n: frame[n].to_numpy() for n in names}  # noqa: E731
    if not m:
        steps = steps[steps.traj_id.isin(outcomes.traj_id)]
    policy, rm = select_samples(
        cols(judgments, ("traj_id", "step_idx", "judge_idx", "step_score", "parsed")),
        cols(outcomes, ("traj_id", "task_id", "outcome")),
        m=m,
        lam=lam,
        band=band,
        policy_band=policy_band,
        outcome_weight=outcome_weight,
        steps=None if m else cols(steps, ("traj_id", "step_idx")),
        rm_balance=rm_balance,
    )
    if not len(policy["traj_id"]):
        return pd.DataFrame(columns=ADVANTAGES.names)
    frames = [pd.DataFrame({"kind": "policy", **policy, "judge_idx": -1}), pd.DataFrame({"kind": "rm", **rm})]
    return pd.concat(frames, ignore_index=True)[ADVANTAGES.names]


def rm_outcome_metrics(judgments: pd.DataFrame, outcomes: pd.DataFrame) -> dict[str, float]:
    """`algo.rm_accuracy.outcome_prediction` of the judged trajectories (frame glue)."""
    judged = judgments[judgments.traj_id.isin(outcomes.traj_id)]
    return outcome_prediction(
        judged.traj_id.to_numpy(),
        judged.step_idx.to_numpy(),
        judged.step_score.to_numpy(),
        judged.parsed.to_numpy(),
        dict(zip(outcomes.traj_id, outcomes.outcome)),
    )


def rm_process_metrics(judgments: pd.DataFrame, labels: pd.DataFrame, outcomes: pd.DataFrame) -> dict[str, float]:
    """`algo.rm_accuracy.process_accuracy` of the judged steps against the environment's step
    labels, and `process_auroc` on the steps before each trajectory's last (a won game's last
    step shows the win message: eval's headline, agent/eval_judge.py) (frame glue); {} when no
    judged step has a label: nothing is logged."""
    keys = list(zip(labels.traj_id.tolist(), labels.step_idx.tolist()))
    columns = [judgments[c].to_numpy() for c in ("traj_id", "step_idx", "step_score", "parsed")]
    result = process_accuracy(*columns, dict(zip(keys, labels.label.tolist())))
    if not result["labelled_steps"]:
        return {}
    last = dict(zip(outcomes.traj_id, outcomes.num_steps - 1))
    early = {key: label for key, label in zip(keys, labels.label.tolist()) if last.get(key[0]) != key[1]}
    return {
        names.RM_PROCESS_ACCURACY: result["process_accuracy"],
        "rm/process_labels": result["labelled_steps"],
        "rm/process_auroc_before_last": process_auroc(*columns, early)["auroc"],
    }


def rm_verdict_metrics(judged: pd.DataFrame, rm: pd.DataFrame) -> dict[str, float]:
    """What the RM answers and what it is paid for it: the share of its parsed verdicts that say +1,
    overall and in won / lost episodes (`judged`: parsed judgments with their outcome), and the
    share of its samples (`rm`) with zero advantage because the step's m verdicts agreed: a judge
    that always says the same stops being trained (docs/method.md). NaN (not logged) where empty."""
    scores, parsed = judged.step_score.to_numpy(), judged.parsed.to_numpy()
    shares = verdict_shares(scores, parsed, judged.outcome.map({1: "won", -1: "lost"}).to_numpy())
    shares |= verdict_shares(scores, parsed, np.full(len(judged), "all"))
    return {
        "rm/plus_share": shares.get("all", (math.nan,))[0],
        "rm/plus_share_won": shares.get("won", (math.nan,))[0],
        "rm/plus_share_lost": shares.get("lost", (math.nan,))[0],
        "rm/zero_advantage_share": float((rm.drop_reason == "zero_std").mean()) if len(rm) else math.nan,
    }


def _no_rows(judgments: pd.DataFrame) -> float:
    return float("nan") if judgments.empty else 0.0


@step_task("advantages")
def advantages(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    outcomes, judgments = read_artifact(layout, iteration, "outcomes"), read_artifact(layout, iteration, "judgments")
    trainable = outcomes[outcomes.valid & ~outcomes.pending]
    prediction = rm_outcome_metrics(judgments, trainable)
    limits = config.algo.rm_guard
    decision = guard(
        prediction,
        config.algo.lam,
        max_score_gap=limits.max_score_gap,
        min_outcome_accuracy=limits.min_outcome_accuracy,
        min_outcome_auroc=limits.min_outcome_auroc,
        min_trajectories=limits.min_trajectories,
        fallback=limits.outcome_only_when_flagged,
    )
    if decision.alarm:
        logging.getLogger(__name__).warning(
            "iteration %d: reward model flagged (%s); λ = %s this iteration",
            iteration,
            "; ".join(decision.reasons),
            decision.lam,
        )
    if config.rm.role == "unit_tests":
        samples = unit_test_advantage_rows(
            unit_test_solutions(read_artifact(layout, iteration, "rollouts"), outcomes),
            read_artifact(layout, iteration, "unit_tests"),
            read_artifact(layout, iteration, "pass_matrix"),
            lam=decision.lam,
            band=config.algo.band,
            policy_band=config.algo.policy_band,
            outcome_weight=config.algo.outcome_weight,
        )
    else:
        samples = compute_samples(
            trainable,
            judgments,
            m=config.rm.judgments_per_step,
            lam=decision.lam,
            band=config.algo.band,
            policy_band=config.algo.policy_band,
            outcome_weight=config.algo.outcome_weight,
            steps=None if config.rm.judgments_per_step else read_artifact(layout, iteration, "rollouts"),
            rm_balance=config.algo.rm_balance,
        )
    path = write_artifact(samples, layout, iteration, "advantages")
    pol, rm = samples[samples.kind == "policy"], samples[samples.kind == "rm"]
    judged = judgments[judgments.parsed].merge(outcomes[["traj_id", "outcome"]], on="traj_id")
    metrics = {
        "reward/policy_mean": float(pol.reward.mean()) if len(pol) else 0.0,
        names.POLICY_KEPT: int(pol.kept.sum()),
        names.RM_KEPT: int(rm.kept.sum()),
        # no judgment at all (rm.role unit_tests): not logged, rather than a made-up 0
        names.RM_AGREEMENT: float((judged.step_score == judged.outcome).mean()) if len(judged) else _no_rows(judgments),
        "rm/step_outcome_accuracy": prediction["step_accuracy"],
        names.RM_OUTCOME_ACCURACY: prediction["trajectory_accuracy"],
        names.RM_OUTCOME_AUROC: prediction["auroc"],
        names.RM_SCORE_GAP: prediction["score_gap"],
        names.RM_GUARD_ALARM: int(decision.alarm),
        names.RM_GUARD_LAM: decision.lam,
        **rm_process_metrics(judgments, read_artifact(layout, iteration, "step_labels"), outcomes),
        **rm_verdict_metrics(judged, rm),
    }
    return [path], {k: v for k, v in metrics.items() if v == v}  # NaN (nothing to rank): not logged
