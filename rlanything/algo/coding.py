"""Coding variant: rewards and advantages of the RM acting as a unit-test generator.

Paper (docs/method.md, "Coding variant"): each generated test is run on the
policy's solutions. A test is *correct* if it passes on every solution that passes
all ground-truth tests. A correct test earns the number of incorrect solutions it
fails (it tells them apart); an incorrect test earns -(number of incorrect solutions
it passes); when there are no incorrect solutions, +1 / -1. Rewards are z-scored over
the tests of one task.

Where we depart from the paper / authors' code, and why:

* No correct solution: we read the definition literally, so every test is correct
  (it passes on all of the zero correct solutions) and earns the number of solutions
  it fails. Nothing then separates a test that catches a bug from one whose expected
  output is wrong, so this signal is weak; tasks with zero accuracy lie outside the
  training band [alpha_low, alpha_high] and their RM samples do not train anyway.
  Callers that train on them regardless should mask such tasks out.
* No solutions at all (S = 0): likewise every test is correct and, with no incorrect
  solutions, earns +1 -- z-scored to 0, so it never trains.
* The advantage uses the same z-score as the policy (ddof=1, std 0 -> 0, a single
  test keeps its raw reward); see ``advantages.group_zscore``.
"""

from __future__ import annotations

import numpy as np

from rlanything.algo.advantages import group_zscore


def unit_test_rewards(pass_matrix: np.ndarray, solution_correct: np.ndarray) -> np.ndarray:
    """Reward of each generated unit test of one task.

    pass_matrix (K, S) bool: generated test k passes on solution s;
    solution_correct (S,) bool: solution s passes all ground-truth tests -> (K,) float64.

    >>> unit_test_rewards(np.array([[1, 1, 0, 0], [1, 0, 1, 1]], dtype=bool),
    ...                   np.array([True, True, False, False]))
    array([ 2., -2.])
    """
    pass_matrix = np.asarray(pass_matrix, dtype=bool)
    solution_correct = np.asarray(solution_correct, dtype=bool)
    if pass_matrix.ndim != 2 or solution_correct.shape != (pass_matrix.shape[1],):
        raise ValueError(
            f"need pass_matrix (K, S) and solution_correct (S,); got {pass_matrix.shape} and {solution_correct.shape}"
        )
    test_correct = pass_matrix[:, solution_correct].all(axis=1)  # (K,), vacuously True if no correct solution
    incorrect = ~solution_correct
    if not incorrect.any():
        return np.where(test_correct, 1.0, -1.0)
    fails_incorrect = (~pass_matrix[:, incorrect]).sum(axis=1)  # (K,)
    passes_incorrect = pass_matrix[:, incorrect].sum(axis=1)  # (K,)
    return np.where(test_correct, fails_incorrect, -passes_incorrect).astype(np.float64)


def unit_test_advantages(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Z-score of the K test rewards of one task (ddof=1; std 0 -> 0; K = 1 -> raw reward).

    rewards (K,) -> (K,) float64.

    >>> unit_test_advantages(np.array([2.0, 0.0])).round(4)
    array([ 0.7071, -0.7071])
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 1:
        raise ValueError(f"need rewards (K,); got {rewards.shape}")
    return group_zscore(rewards, np.zeros(rewards.shape[0], dtype=np.int64), eps)[0]
