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

from rlanything.algo.advantages import group_zscore, is_negligible, step_index_advantages
from rlanything.algo.curriculum import in_band, task_accuracy
from rlanything.algo.rewards import UNPARSEABLE_REWARD  # an unparseable test earns what a judgment would


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


def unit_test_scores(
    pass_matrix: np.ndarray, solution_correct: np.ndarray, parsed: np.ndarray
) -> dict[str, np.ndarray]:
    """Everything one task's generated tests earn, unparseable ones included.

    pass_matrix (K, S) bool (rows of unparsed tests are ignored), solution_correct (S,) bool,
    parsed (K,) bool -> dict of (K,) arrays: reward (float64; `unit_test_rewards` for parsed
    tests, UNPARSEABLE_REWARD for the others, as for an unparseable judgment), correct (bool; False
    when unparsed), incorrect_caught (int64: incorrect solutions the test fails; 0 unparsed).

    Worked example: two correct solutions, two wrong; test 0 tells them apart, test 1 fails a
    correct solution, test 2 could not be parsed.
    >>> s = unit_test_scores(np.array([[1, 1, 0, 0], [1, 0, 1, 1], [0, 0, 0, 0]], dtype=bool),
    ...                      np.array([True, True, False, False]), np.array([True, True, False]))
    >>> s["reward"].tolist(), s["correct"].tolist(), s["incorrect_caught"].tolist()
    ([2.0, -2.0, -2.0], [True, False, False], [2, 0, 0])
    """
    pass_matrix = np.asarray(pass_matrix, dtype=bool)
    parsed = np.asarray(parsed, dtype=bool)
    solution_correct = np.asarray(solution_correct, dtype=bool)
    if parsed.shape != (pass_matrix.shape[0],):
        raise ValueError(f"need parsed (K,) for pass_matrix {pass_matrix.shape}; got {parsed.shape}")
    reward = np.full(len(parsed), UNPARSEABLE_REWARD, dtype=np.float64)
    correct = np.zeros(len(parsed), dtype=bool)
    caught = np.zeros(len(parsed), dtype=np.int64)
    if parsed.any():
        ok = pass_matrix[parsed]
        reward[parsed] = unit_test_rewards(ok, solution_correct)
        correct[parsed] = ok[:, solution_correct].all(axis=1)
        caught[parsed] = (~ok[:, ~solution_correct]).sum(axis=1)
    return {"reward": reward, "correct": correct, "incorrect_caught": caught}


def correct_test_pass_fraction(pass_matrix: np.ndarray, test_correct: np.ndarray) -> np.ndarray:
    """Per solution, the fraction of the task's *correct* generated tests it passes; 0 when
    the task has no correct test (the term then adds nothing to the policy's reward).

    pass_matrix (K, S) bool, test_correct (K,) bool -> (S,) float64.

    >>> correct_test_pass_fraction(np.array([[1, 0], [1, 1], [0, 0]], dtype=bool), np.array([True, True, False]))
    array([1. , 0.5])
    """
    pass_matrix = np.asarray(pass_matrix, dtype=bool)
    test_correct = np.asarray(test_correct, dtype=bool)
    if not test_correct.any():
        return np.zeros(pass_matrix.shape[1], dtype=np.float64)
    return pass_matrix[test_correct].mean(axis=0).astype(np.float64)


def unit_test_samples(
    tests: dict[str, np.ndarray],
    trajectories: dict[str, np.ndarray],
    *,
    lam: float,
    band: tuple[float, float],
    policy_band: tuple[float, float],
    outcome_weight: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Policy and RM samples of one coding iteration with rm.role unit_tests (step 4).

    tests: task_id, test_idx, reward (N,), the K generated tests of each task;
    trajectories: traj_id, task_id, outcome, test_fraction (ground-truth tests passed / run),
    generated_fraction (`correct_test_pass_fraction`) (T,), the trainable ones.
    -> (policy, rm) like `algo.samples.select_samples` (step_idx 0; rm rows have traj_id -1
    and judge_idx = test_idx).

    Policy: R = outcome_weight * test_fraction + lam * generated_fraction, z-scored per task; kept in the policy
    band when the advantage is not 0. RM: the task's test rewards z-scored by
    `unit_test_advantages`; kept in the RM band unless all K rewards are equal ("zero_std", up to
    ``advantages.is_negligible``) or the advantage is 0.

    Worked example: one task, two solutions (all tests / half the tests), two generated tests.
    >>> pol, rm = unit_test_samples(
    ...     {"task_id": np.array(["a", "a"]), "test_idx": np.array([0, 1]), "reward": np.array([1.0, -2.0])},
    ...     {"traj_id": np.array([0, 1]), "task_id": np.array(["a", "a"]), "outcome": np.array([1, -1]),
    ...      "test_fraction": np.array([1.0, 0.5]), "generated_fraction": np.array([1.0, 0.0])},
    ...     lam=1.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=1.0)
    >>> pol["reward"].tolist(), pol["advantage"].round(4).tolist(), rm["advantage"].round(4).tolist()
    ([2.0, 0.5], [0.7071, -0.7071], [0.7071, -0.7071])
    """
    task_all = np.asarray(trajectories["task_id"], dtype=object)
    accuracy = task_accuracy(np.asarray(trajectories["outcome"]), task_all)
    policy = _policy_samples(trajectories, accuracy, lam=lam, band=policy_band, outcome_weight=outcome_weight)
    return policy, _rm_samples(tests, accuracy, band=band)


def _policy_samples(
    trajectories: dict[str, np.ndarray],
    accuracy: dict[object, float],
    *,
    lam: float,
    band: tuple[float, float],
    outcome_weight: float,
) -> dict[str, np.ndarray]:
    """The policy half of `unit_test_samples`: one sample per trajectory (T,), step_idx 0.

    R = outcome_weight * test_fraction + lam * generated_fraction, z-scored per task; kept when
    the task's accuracy (`task_accuracy`: task id -> accuracy) lies in `band` and the advantage
    is not 0.
    """
    task_all = np.asarray(trajectories["task_id"], dtype=object)
    reward = outcome_weight * np.asarray(trajectories["test_fraction"], dtype=np.float64) + lam * np.asarray(
        trajectories["generated_fraction"], dtype=np.float64
    )
    step_idx = np.zeros(len(task_all), dtype=np.int64)
    advantage = step_index_advantages(reward, task_all, step_idx)
    policy_ok = np.asarray(in_band(np.array([accuracy[t] for t in task_all], dtype=np.float64), *band), bool)
    return {
        "traj_id": np.asarray(trajectories["traj_id"], dtype=np.int64),
        "task_id": task_all,
        "step_idx": step_idx,
        "reward": reward,
        "advantage": advantage,
        "kept": policy_ok & (advantage != 0),
        "drop_reason": _drop_reasons(~policy_ok, np.zeros(len(reward), bool), advantage == 0),
    }


def _rm_samples(
    tests: dict[str, np.ndarray], accuracy: dict[object, float], *, band: tuple[float, float]
) -> dict[str, np.ndarray]:
    """The RM half of `unit_test_samples`: one sample per generated test (N,), traj_id -1.

    Each task's test rewards z-scored by `unit_test_advantages`; kept when the task's accuracy
    lies in `band`, its rewards are not all equal ("zero_std", up to ``is_negligible``) and the
    advantage is not 0. A test of a task without a trainable trajectory is a ValueError.

    Worked example: two tests whose rewards differ by float noise only (0.1 + 0.2 vs 0.3).
    >>> rm = _rm_samples({"task_id": np.array(["a", "a"]), "test_idx": np.array([0, 1]),
    ...                   "reward": np.array([0.1 + 0.2, 0.3])}, {"a": 0.5}, band=(0.2, 0.8))
    >>> rm["advantage"].tolist(), rm["drop_reason"].tolist()
    ([0.0, 0.0], ['zero_std', 'zero_std'])
    """
    test_task = np.asarray(tests["task_id"], dtype=object)
    unknown = sorted(set(test_task.tolist()) - set(accuracy))
    if unknown:
        raise ValueError(f"unit tests of tasks {unknown[:5]} that have no trainable trajectory")
    test_reward = np.asarray(tests["reward"], dtype=np.float64)
    rm_adv, zero_std = np.zeros(len(test_reward)), np.zeros(len(test_reward), dtype=bool)
    for task in dict.fromkeys(test_task.tolist()):  # first-seen order
        rows = np.flatnonzero(test_task == task)
        group = test_reward[rows]
        rm_adv[rows] = unit_test_advantages(group)
        # the z-score's own "std 0" rule: 0.1 + 0.2 and 0.3 are equal rewards, not a spread of 5.6e-17
        zero_std[rows] = len(rows) > 1 and is_negligible(np.ptp(group), np.abs(group).max())
    rm_ok = np.asarray(in_band(np.array([accuracy[t] for t in test_task], dtype=np.float64), *band), dtype=bool)
    return {
        "traj_id": np.full(len(test_task), -1, dtype=np.int64),
        "task_id": test_task,
        "step_idx": np.zeros(len(test_task), dtype=np.int64),
        "judge_idx": np.asarray(tests["test_idx"], dtype=np.int64),
        "reward": test_reward,
        "advantage": rm_adv,
        "kept": rm_ok & ~zero_std & (rm_adv != 0),
        "drop_reason": _drop_reasons(~rm_ok, zero_std, rm_adv == 0),
    }


def _drop_reasons(out_of_band: np.ndarray, zero_std: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """out_of_band wins, then zero_std, then zero_advantage (as `algo.samples`)."""
    out = np.full(len(out_of_band), None, dtype=object)
    out[zero] = "zero_advantage"
    out[zero_std] = "zero_std"
    out[out_of_band] = "out_of_band"
    return out
