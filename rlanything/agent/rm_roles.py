"""What the reward model does in a run, one row per `rm.role`: the one table the steps dispatch on.

- `judge` (the paper's): the RM judges every step m times (steps 3, 4 and 6 on judgments.parquet);
- `unit_tests` (the paper's coding setting): the RM writes unit tests for each problem, the
  solutions run against them, and the tests are what it trains on (unit_tests.parquet,
  pass_matrix.parquet).

A plain dict of plain functions, as verl keys its advantage estimators by name: a new role is one
row here and one value of `rm.role` in the config. The step tasks call the dispatchers below,
which know no role by name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from rlanything import metric_names as names
from rlanything.agent.advantage_rows import (
    compute_samples,
    rm_outcome_metrics,
    rm_process_metrics,
    rm_verdict_metrics,
)
from rlanything.agent.judging import score_steps
from rlanything.agent.unit_test_scoring import (
    failed_test_judgments,
    score_with_unit_tests,
    solutions,
    unit_test_advantage_rows,
)
from rlanything.agent.update_data import judgment_samples, policy_samples, unit_test_samples_of
from rlanything.algo.rm_accuracy import guard
from rlanything.config import Config
from rlanything.models.training.trainer import Sample
from rlanything.storage.layout import RunLayout

Frames = dict[str, pd.DataFrame]


@dataclass(frozen=True)
class RmRole:
    """The four things a role decides, and whether its RM judges steps."""

    score: Callable[[Config, RunLayout, int, Frames], tuple[dict[str, list[dict]], dict]]
    """rm_score: (config, layout, iteration, frames) -> ({artifact: rows}, written in this order,
    the last marking the step done; metrics)."""
    advantage_rows: Callable[[Config, Frames, float], pd.DataFrame]
    """advantages: (config, frames, λ this iteration) -> advantages.parquet rows."""
    critic_judgments: Callable[[Frames], pd.DataFrame]
    """adapt_tasks: what the critic summary reads, in the judgment columns."""
    rm_samples: Callable[[Config, RunLayout, int], list[Sample]]
    """rm_update: the RM's kept samples of an iteration."""
    judges_steps: bool
    """Whether the RM judges steps (verdicts in judgments.parquet): what a held-out evaluation's RM
    measures (`flows/evaluation.py`) and what an experiment's policy-only arm takes out of the loop
    (`flows/experiment.py`, with rm.judgments_per_step 0)."""


def _judgment_rows(config: Config, frames: Frames, lam: float) -> pd.DataFrame:
    m = config.rm.judgments_per_step
    trainable = frames["outcomes"][frames["outcomes"].valid & ~frames["outcomes"].pending]
    return compute_samples(
        trainable,
        frames["judgments"],
        m=m,
        lam=lam,
        band=config.algo.band,
        policy_band=config.algo.policy_band,
        outcome_weight=config.algo.outcome_weight,
        steps=None if m else frames["rollouts"],
        rm_balance=config.algo.rm_balance,
        progress=frames["progress"] if config.algo.rm_target == "progress" else None,
        rm_advantage=config.algo.rm_advantage,
    )


def _unit_test_rows(config: Config, frames: Frames, lam: float) -> pd.DataFrame:
    return unit_test_advantage_rows(
        solutions(frames["rollouts"], frames["outcomes"]),
        frames["unit_tests"],
        frames["pass_matrix"],
        lam=lam,
        band=config.algo.band,
        policy_band=config.algo.policy_band,
        outcome_weight=config.algo.outcome_weight,
    )


RM_ROLES: dict[str, RmRole] = {
    "judge": RmRole(
        score=score_steps,
        advantage_rows=_judgment_rows,
        critic_judgments=lambda frames: frames["judgments"],
        rm_samples=lambda config, layout, iteration: judgment_samples(
            config, layout, iteration, chosen_only=not config.rm.train_forced_tokens
        ),
        judges_steps=True,
    ),
    "unit_tests": RmRole(
        score=score_with_unit_tests,
        advantage_rows=_unit_test_rows,
        critic_judgments=lambda f: failed_test_judgments(f["unit_tests"], f["pass_matrix"], f["rollouts"]),
        rm_samples=lambda config, layout, iteration: unit_test_samples_of(layout, iteration),
        judges_steps=False,  # it writes tests
    ),
}


def rm_score_outputs(config: Config, layout: RunLayout, iteration: int, frames: Frames):
    """Step 3 as the run's `rm.role` does it -> ({artifact: rows} in writing order; metrics)."""
    return RM_ROLES[config.rm.role].score(config, layout, iteration, frames)


def advantage_samples(config: Config, frames: Frames, iteration: int) -> tuple[pd.DataFrame, dict]:
    """Step 4: the RM guard decides this iteration's λ (`algo.rm_accuracy.guard`), the role's rows
    give the samples. `frames`: the iteration's outcomes, judgments, progress, rollouts, unit_tests,
    pass_matrix and step_labels -> (advantages.parquet rows, metrics; NaN: not logged)."""
    outcomes, judgments = frames["outcomes"], frames["judgments"]
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
    samples = RM_ROLES[config.rm.role].advantage_rows(config, frames, decision.lam)
    pol, rm = samples[samples.kind == "policy"], samples[samples.kind == "rm"]
    judged = judgments[judgments.parsed].merge(outcomes[["traj_id", "outcome"]], on="traj_id")
    no_rows = float("nan") if judgments.empty else 0.0  # no judgment at all (role unit_tests): not logged
    metrics = {
        "reward/policy_mean": float(pol.reward.mean()) if len(pol) else 0.0,
        names.POLICY_KEPT: int(pol.kept.sum()),
        names.RM_KEPT: int(rm.kept.sum()),
        names.RM_AGREEMENT: float((judged.step_score == judged.outcome).mean()) if len(judged) else no_rows,
        "rm/step_outcome_accuracy": prediction["step_accuracy"],
        names.RM_OUTCOME_ACCURACY: prediction["trajectory_accuracy"],
        names.RM_OUTCOME_AUROC: prediction["auroc"],
        names.RM_SCORE_GAP: prediction["score_gap"],
        names.RM_GUARD_ALARM: int(decision.alarm),
        names.RM_GUARD_LAM: decision.lam,
        **rm_process_metrics(judgments, frames["step_labels"], outcomes),
        **rm_verdict_metrics(judged, rm),
    }
    return samples, {k: v for k, v in metrics.items() if v == v}  # NaN (nothing to rank): not logged


def critic_judgments(config: Config, frames: Frames) -> pd.DataFrame:
    """Step 7: the judgments the critic summary reads (the RM's, or for a test-writing RM one −1
    per correct generated test a solution failed)."""
    return RM_ROLES[config.rm.role].critic_judgments(frames)


def update_samples(config: Config, layout: RunLayout, iteration: int, kind: str) -> list[Sample]:
    """Steps 5–6: what the update of `kind` ("policy" or "rm") trains on in `iteration`: the
    policy's kept rollout steps, or the role's RM samples; nothing for a frozen model (a control
    run: its checkpoint keeps the start weights)."""
    section = config.policy if kind == "policy" else config.rm
    if section.optim.frozen:
        return []
    if kind == "policy":
        return policy_samples(layout, iteration)
    return RM_ROLES[config.rm.role].rm_samples(config, layout, iteration)
