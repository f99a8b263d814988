"""Step 4's frame glue, Prefect-free: advantages.parquet rows from the outcomes and the RM's
judgments (`compute_samples`, around `algo.samples.select_samples`), and what the step logs of the
RM: outcome prediction, process accuracy against the environment's step labels, verdict shares."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rlanything import metric_names as names
from rlanything.algo.rm_accuracy import (
    outcome_prediction,
    process_accuracy,
    process_auroc,
    progress_auroc,
    verdict_shares,
)
from rlanything.algo.samples import select_samples
from rlanything.storage.schemas import ADVANTAGES


def compute_samples(
    outcomes: pd.DataFrame,
    judgments: pd.DataFrame,
    *,
    m: int,
    lam: float,
    band: tuple,
    policy_band: tuple,
    outcome_weight: float,
    rm_balance: bool,
    rm_advantage: str,
    steps: pd.DataFrame | None = None,
    progress: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """advantages.parquet rows from the trainable trajectories' outcomes and their judgments:
    the frame glue around `algo.samples.select_samples` (policy rows first, then RM rows). With
    m = 0 (no RM in the loop) the policy samples are the trainable trajectories' `steps`; with
    `progress` (progress.parquet rows) the RM is paid for its steps' progress (`algo.rm_target`)."""
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
        progress=None if progress is None else cols(progress, ("traj_id", "step_idx", "progress")),
        rm_advantage=rm_advantage,
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
    step shows the win message: eval's headline, agent/eval_judge.py), and `progress_auroc` there
    of the verdicts and of P(+1) (`p_plus_scores`) (frame glue); {} when no judged step has a
    label: nothing is logged."""
    keys = list(zip(labels.traj_id.tolist(), labels.step_idx.tolist()))
    ranked = ("traj_id", "step_idx", "step_score", "parsed")
    columns = [judgments[c].to_numpy() for c in ranked]
    result = process_accuracy(*columns, dict(zip(keys, labels.label.tolist())))
    if not result["labelled_steps"]:
        return {}
    last = dict(zip(outcomes.traj_id, outcomes.num_steps - 1))
    early = {key: label for key, label in zip(keys, labels.label.tolist()) if last.get(key[0]) != key[1]}
    rules = {key: rule for key, rule in zip(keys, labels.rule.tolist()) if key in early}
    by_p = p_plus_scores(judgments)
    return {
        names.RM_PROCESS_ACCURACY: result["process_accuracy"],
        "rm/process_labels": result["labelled_steps"],
        "rm/process_auroc_before_last": process_auroc(*columns, early)["auroc"],
        # the headline: progress steps against setbacks, no-ops left out (algo.rm_accuracy.progress_auroc)
        "rm/progress_auroc_before_last": progress_auroc(*columns, rules)["auroc"],
        # the same ranking read from the judge's P(+1), where both verdicts were scored: no verdict draws
        "rm/progress_auroc_p_before_last": progress_auroc(*(by_p[c].to_numpy() for c in ranked), rules)["auroc"],
    }


def p_plus_scores(judgments: pd.DataFrame) -> pd.DataFrame:
    """The judgments that recorded the judge's P(+1) (judgments.p_plus), with it as their score in
    place of the drawn verdict S, for `algo.rm_accuracy`'s rankings: free verdicts, verdicts decoded
    in the generation pass and judgments of an older version drop out (none left: no ranking)."""
    if "p_plus" not in judgments:
        return judgments.iloc[:0]
    known = judgments[judgments.p_plus.notna()]
    return known.assign(step_score=known.p_plus.astype(float), parsed=True)


def rm_verdict_metrics(judged: pd.DataFrame, rm: pd.DataFrame) -> dict[str, float]:
    """What the RM answers and what it is paid for it: the share of its parsed verdicts that say +1,
    overall and in won / lost episodes (`judged`: parsed judgments with their outcome), and the
    share of its samples (`rm`) with zero advantage because the step's m verdicts agreed: a judge
    that always says the same stops being trained (docs/method.md), and the mean of its P(+1) where
    both verdicts were scored (`p_plus_mean`). NaN (not logged) where empty."""
    scores, parsed = judged.step_score.to_numpy(), judged.parsed.to_numpy()
    shares = verdict_shares(scores, parsed, judged.outcome.map({1: "won", -1: "lost"}).to_numpy())
    shares |= verdict_shares(scores, parsed, np.full(len(judged), "all"))
    return {
        "rm/plus_share": shares.get("all", (math.nan,))[0],
        "rm/plus_share_won": shares.get("won", (math.nan,))[0],
        "rm/plus_share_lost": shares.get("lost", (math.nan,))[0],
        "rm/zero_advantage_share": float((rm.drop_reason == "zero_std").mean()) if len(rm) else math.nan,
        "rm/p_plus_mean": p_plus_mean(judged),
    }


def p_plus_mean(judged: pd.DataFrame) -> float:
    """The mean of the judge's P(+1) over the judgments that recorded it (`p_plus_scores`); NaN
    where none did. A step has m judgments (sharing one P(+1) under direct verdicts, each its own
    after reasoning), so this weighs every judged step alike."""
    known = p_plus_scores(judged)
    return float(known.step_score.mean()) if len(known) else math.nan
