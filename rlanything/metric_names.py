"""The names of the metrics that more than one module uses, written once.

The steps (`tasks/`) log their metrics to MLflow under these names and write them into
`iter_NNNN/summary.json`; the reports (`reports/`) read them back from there. A metric that
only its own step names stays a literal in that step. Imports nothing: anyone may import it.
"""

from __future__ import annotations

# verify
ACCURACY = "accuracy"  # success rate of the trainable trajectories
MEAN_OUTCOME = "mean_outcome"

# rm_score
RM_PARSE_RATE = "rm/parse_rate"
UNIT_TESTS_PARSE_RATE = "unit_tests/parse_rate"  # rm.role unit_tests (coding)
UNIT_TESTS_CORRECT_RATE = "unit_tests/correct_rate"
UNIT_TESTS_VERDICT_AGREEMENT = "unit_tests/verdict_agreement"

# advantages
RM_AGREEMENT = "rm/agreement"
RM_OUTCOME_ACCURACY = "rm/outcome_accuracy"
RM_OUTCOME_AUROC = "rm/outcome_auroc"
RM_PROCESS_ACCURACY = "rm/process_accuracy"  # environments with step labels only
RM_SCORE_GAP = "rm/score_gap"
RM_GUARD_ALARM = "rm_guard/alarm"
RM_GUARD_LAM = "rm_guard/lam"
POLICY_KEPT = "samples/policy_kept"
RM_KEPT = "samples/rm_kept"

# policy_update and rm_update: "<kind>/<measure>"
UPDATE_KINDS = ("policy", "rm")
STEP_MEASURES = ("loss", "pg_loss", "kl", "clip_frac", "entropy", "grad_norm")
"""Measured at every optimizer step (columns of <kind>_update.parquet); an iteration's metric is
their sample-weighted mean."""
UPDATE_MEASURES = (*STEP_MEASURES, "anchor_kl", "lr_last", "samples", "replayed_samples", "optimizer_steps")
"""... plus anchor_kl, the same mean where the update has an anchor KL (optim.anchor_beta), and
replayed_samples, those of `samples` that earlier iterations drew (rm.replay_iterations)."""


def update_metric(kind: str, measure: str) -> str:
    """ "policy/kl", "rm/loss": a measure of the policy_update or rm_update step.

    >>> update_metric("rm", "loss")
    'rm/loss'
    """
    if kind not in UPDATE_KINDS or measure not in UPDATE_MEASURES:
        raise ValueError(f"no update metric {kind}/{measure}: kind {UPDATE_KINDS}, measure {UPDATE_MEASURES}")
    return f"{kind}/{measure}"


def update_metrics(measure: str) -> list[str]:
    """The policy's and the RM's `measure`: ["policy/<measure>", "rm/<measure>"]."""
    return [update_metric(kind, measure) for kind in UPDATE_KINDS]


# adapt_tasks: how many judged versions got each decision, and the accepted tasks so far
ADAPT_DECISIONS = ("in_band", "proposed", "no_valid_rewrite", "slot_busy", "accepted", "rejected")
ADAPT_ACCEPTED_TOTAL = "adapt/accepted_total"


def adapt_metric(decision: str) -> str:
    """ "adapt/accepted": how many versions the adapt_tasks step decided so this iteration."""
    if decision not in ADAPT_DECISIONS:
        raise ValueError(f"no adaptation decision {decision!r}: one of {ADAPT_DECISIONS}")
    return f"adapt/{decision}"


# held-out evaluation (`rlanything eval`, eval.rm): the RM's measures of each split
RM_MEASURES = (
    "rm_step_accuracy",
    "rm_outcome_accuracy",
    "rm_outcome_auroc",
    "rm_outcome_auroc_low",
    "rm_outcome_auroc_high",
    "rm_score_gap",
    "rm_judged",
    "rm_solved_judged",
    "rm_unsolved_judged",
    "rm_parse_rate",
    "rm_outcome_before_last_auroc",
    "rm_outcome_before_last_auroc_low",
    "rm_outcome_before_last_auroc_high",
    "rm_judged_before_last",
    "rm_p_plus_mean",
)
"""The RM's columns of a split's row (`agent.eval_judge.rm_measures`), logged as `eval/<split>/<measure>`
(`agent.eval_parts.merge_parts`) and read back by `reports.eval_report`: the *before_last* ones are the
outcome AUROC from the steps before each episode's last only (the win message left out:
`agent.eval_judge.outcome_before_last`); the others `outcome_prediction`'s step_accuracy,
trajectory_accuracy, auroc with its 95% stratified-bootstrap interval (auroc_low, auroc_high: NaN
where fewer than `algo.rm_accuracy.MIN_CLASS` judged episodes were solved or unsolved), score_gap,
trajectories (episodes judged) and of those the solved (positives) and unsolved (negatives), and
the fraction of its judgments whose verdict parsed; p_plus_mean the mean of the judge's P(+1) where
both verdicts were scored (NaN without: `agent.advantage_rows.p_plus_mean`)."""


# every step: its wall time
def step_time(step: str) -> str:
    """ "time/rollout_s": the wall time of a step (seconds)."""
    return f"time/{step}_s"


def is_step_time(key: str) -> bool:
    """Whether `key` is a step's wall time (`step_time`)."""
    return key.startswith("time/") and key.endswith("_s")
