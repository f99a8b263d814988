"""Rewards: the policy's integrated feedback and the RM's consistency feedback.

Paper (docs/method.md):
    R_{tau_i}       = O_tau + lam * (1/m) * sum_j S_{tau_i,j}        (policy, per step)
    R^S_{tau_i,j}   = R_{tau_i} * S_{tau_i,j}, or -2 if unparseable   (RM, per judgment)

lam is a keyword-only argument without a default: callers pass the config's ``algo.lam``.

Where we depart from the paper / authors' code, and why:

* An unparseable judgment enters the policy's mean as S = 0 and still counts in
  the denominator m (the paper's reading: the judge was asked m times). The caller
  encodes it as 0 in ``step_score`` and passes ``parsed`` to the RM reward.
* The -2 for an unparseable judgment is the paper's fixed constant, ``UNPARSEABLE_REWARD``
  (no config setting); ``rm_consistency_reward`` still takes it as an argument without a
  default (``unparseable_reward``), so every caller names the value it uses.
"""

from __future__ import annotations

import numpy as np

UNPARSEABLE_REWARD = -2.0
"""R^S of a judgment without a parseable verdict (the paper's constant; also what an unparseable
unit test earns, `algo.unit_test_rewards`)."""


def integrated_reward(outcome: np.ndarray, step_score: np.ndarray, *, lam: float) -> np.ndarray:
    """Policy reward per step: outcome + lam * mean over the m judgments.

    outcome (N,) in {-1, +1} (the trajectory's outcome repeated for each of its steps),
    step_score (N, m) in {-1, 0, +1} (0 = unparseable) -> (N,) float64.
    lam = 0 gives the outcome-only baseline.

    >>> integrated_reward(np.array([1, -1]), np.array([[1, 1, -1], [-1, 0, -1]]), lam=1.0)
    array([ 1.33333333, -1.66666667])
    """
    outcome = np.asarray(outcome, dtype=np.float64)
    step_score = np.asarray(step_score, dtype=np.float64)
    if outcome.ndim != 1 or step_score.ndim != 2 or step_score.shape[0] != outcome.shape[0]:
        raise ValueError(f"need outcome (N,) and step_score (N, m); got {outcome.shape} and {step_score.shape}")
    if step_score.shape[1] == 0:
        raise ValueError("step_score needs at least one judgment per step (m >= 1)")
    return outcome + lam * step_score.mean(axis=1)


def rm_consistency_reward(
    integrated: np.ndarray,
    step_score: np.ndarray,
    parsed: np.ndarray,
    *,
    unparseable_reward: float,
) -> np.ndarray:
    """RM reward per judgment: integrated reward of its step times its verdict.

    integrated (N,), step_score (N, m), parsed (N, m) bool -> (N, m) float64;
    ``unparseable_reward`` (the paper's: ``UNPARSEABLE_REWARD``, -2) where ``parsed`` is False.

    >>> rm_consistency_reward(np.array([4/3, -2.0]), np.array([[1, 1, -1], [-1, 0, -1]]),
    ...                       np.array([[True, True, True], [True, False, True]]),
    ...                       unparseable_reward=UNPARSEABLE_REWARD)
    array([[ 1.33333333,  1.33333333, -1.33333333],
           [ 2.        , -2.        ,  2.        ]])
    """
    integrated = np.asarray(integrated, dtype=np.float64)
    step_score = np.asarray(step_score, dtype=np.float64)
    parsed = np.asarray(parsed, dtype=bool)
    if integrated.ndim != 1 or step_score.ndim != 2 or step_score.shape[0] != integrated.shape[0]:
        raise ValueError(f"need integrated (N,) and step_score (N, m); got {integrated.shape} and {step_score.shape}")
    if parsed.shape != step_score.shape:
        raise ValueError(f"parsed {parsed.shape} must match step_score {step_score.shape}")
    return np.where(parsed, integrated[:, None] * step_score, unparseable_reward)
