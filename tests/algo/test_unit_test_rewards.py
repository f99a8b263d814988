"""Coding variant: unit-test rewards and advantages, against hand-computed numbers."""

import numpy as np
import pytest

from rlanything.algo.unit_test_rewards import (
    correct_test_pass_fraction,
    unit_test_advantages,
    unit_test_rewards,
    unit_test_samples,
    unit_test_scores,
)

EPS = 1e-6

# 4 generated tests x 4 solutions; solutions 0, 1 pass all ground-truth tests, 2, 3 do not.
PASS = np.array(
    [
        [1, 1, 0, 0],  # passes both correct -> correct test; fails 2 incorrect -> +2
        [1, 1, 1, 0],  # correct test; fails 1 incorrect -> +1
        [1, 0, 1, 1],  # fails correct solution 1 -> incorrect test; passes 2 incorrect -> -2
        [1, 1, 1, 1],  # correct test that catches nothing -> 0
    ],
    dtype=bool,
)
CORRECT = np.array([True, True, False, False])


def test_unit_test_rewards_hand_example():
    np.testing.assert_array_equal(unit_test_rewards(PASS, CORRECT), [2.0, 1.0, -2.0, 0.0])


def test_incorrect_test_that_fails_everything_earns_zero():
    # fails a correct solution (incorrect test) but passes no incorrect solution -> -0
    np.testing.assert_array_equal(unit_test_rewards(np.zeros((1, 4), dtype=bool), CORRECT), [0.0])


def test_no_incorrect_solutions_gives_plus_minus_one():
    passes = np.array([[1, 1, 1], [1, 0, 1], [0, 0, 0]], dtype=bool)
    np.testing.assert_array_equal(unit_test_rewards(passes, np.ones(3, dtype=bool)), [1.0, -1.0, -1.0])


def test_no_correct_solutions_every_test_is_correct():
    # vacuously correct: reward = number of (incorrect) solutions the test fails
    passes = np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(unit_test_rewards(passes, np.zeros(3, dtype=bool)), [1.0, 3.0, 0.0])


def test_no_solutions_at_all():
    np.testing.assert_array_equal(unit_test_rewards(np.zeros((2, 0), dtype=bool), np.zeros(0, dtype=bool)), [1.0, 1.0])


def test_unit_test_rewards_shape_error():
    with pytest.raises(ValueError):
        unit_test_rewards(PASS, np.array([True, False]))


def test_unit_test_advantages_hand_example():
    # [2, 1, -2, 0]: mean 0.25, deviations [1.75, 0.75, -2.25, -0.25],
    # std (ddof=1) = sqrt(8.75 / 3) = 1.70783 -> [1.02470, 0.43915, -1.31747, -0.14639]
    adv = unit_test_advantages(np.array([2.0, 1.0, -2.0, 0.0]))
    s = np.sqrt(8.75 / 3) + EPS
    np.testing.assert_allclose(adv, [1.75 / s, 0.75 / s, -2.25 / s, -0.25 / s], rtol=1e-12)
    np.testing.assert_allclose(adv, [1.02470, 0.43915, -1.31747, -0.14639], atol=1e-5)


def test_unit_test_advantages_std_zero():
    assert np.all(unit_test_advantages(np.array([1.0, 1.0, 1.0])) == 0.0)


def test_unit_test_advantages_single_test_keeps_raw():
    np.testing.assert_array_equal(unit_test_advantages(np.array([-2.0])), [-2.0])


# ---------------------------------------------------------------- rm.role unit_tests: scores and samples


def test_unit_test_scores_hand_example_with_an_unparsed_test():
    # solutions: 0, 1 right; 2, 3 wrong. test 0 fails both wrong ones (correct, catches 2);
    # test 1 fails right solution 1 and passes wrong solution 3 (incorrect: -1 wrong passed);
    # test 2 is unparsed: its matrix row is ignored (here all True, which would earn -2 too).
    matrix = np.array([[1, 1, 0, 0], [1, 0, 0, 1], [1, 1, 1, 1]], dtype=bool)
    s = unit_test_scores(matrix, np.array([True, True, False, False]), np.array([True, True, False]))
    assert s["reward"].tolist() == [2.0, -1.0, -2.0]
    assert s["correct"].tolist() == [True, False, False]
    assert s["incorrect_caught"].tolist() == [2, 1, 0]


def test_unit_test_scores_nothing_parsed():
    s = unit_test_scores(np.zeros((2, 3), bool), np.array([True, False, False]), np.array([False, False]))
    assert s["reward"].tolist() == [-2.0, -2.0] and not s["correct"].any() and s["incorrect_caught"].tolist() == [0, 0]


def test_correct_test_pass_fraction_hand_example():
    matrix = np.array([[1, 0, 1], [1, 1, 0], [0, 0, 0]], dtype=bool)
    # tests 0 and 1 are correct; solution 0 passes both, 1 passes one, 2 passes one
    assert correct_test_pass_fraction(matrix, np.array([True, True, False])).tolist() == [1.0, 0.5, 0.5]
    assert correct_test_pass_fraction(matrix, np.array([False, False, False])).tolist() == [0.0, 0.0, 0.0]


def test_unit_test_samples_hand_computed():
    """Task a: 3 solutions (accuracy 1/3, in band); task b: 2 solutions both right (out of band).
    Policy R = fraction of ground-truth tests + λ·fraction of correct generated tests, λ = 0.5:
    a: 1 + .5·1 = 1.5, .5 + .5·.5 = .75, 0 + 0 = 0 -> mean .75, std .75 -> z = 1, 0, -1
    (the middle one exactly 0: zero_advantage); b: 1.5 and 1.5 -> out of band.
    RM rewards of a: [2, -2] -> z = ±0.7071 (÷ (std 2.828 + 1e-6)); b: [1, 1] -> out of band."""
    tests = {"task_id": np.array(["a", "a", "b", "b"]), "test_idx": np.array([0, 1, 0, 1]),
             "reward": np.array([2.0, -2.0, 1.0, 1.0])}  # fmt: skip
    trajectories = {
        "traj_id": np.array([0, 1, 2, 3, 4]),
        "task_id": np.array(["a", "a", "a", "b", "b"]),
        "outcome": np.array([1, -1, -1, 1, 1]),
        "test_fraction": np.array([1.0, 0.5, 0.0, 1.0, 1.0]),
        "generated_fraction": np.array([1.0, 0.5, 0.0, 1.0, 1.0]),
    }
    pol, rm = unit_test_samples(
        tests, trajectories, lam=0.5, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=1.0
    )
    assert pol["reward"].tolist() == [1.5, 0.75, 0.0, 1.5, 1.5]
    np.testing.assert_allclose(pol["advantage"], [0.75 / (0.75 + 1e-6), 0.0, -0.75 / (0.75 + 1e-6), 0.0, 0.0])
    assert pol["kept"].tolist() == [True, False, True, False, False]
    assert pol["drop_reason"].tolist() == [None, "zero_advantage", None, "out_of_band", "out_of_band"]
    assert rm["traj_id"].tolist() == [-1] * 4 and rm["judge_idx"].tolist() == [0, 1, 0, 1]
    std = np.std([2.0, -2.0], ddof=1)
    np.testing.assert_allclose(rm["advantage"], [2 / (std + 1e-6), -2 / (std + 1e-6), 0.0, 0.0])
    assert rm["kept"].tolist() == [True, True, False, False]
    assert rm["drop_reason"].tolist() == [None, None, "out_of_band", "out_of_band"]


def test_unit_test_samples_outcome_weight_zero_pays_the_generated_tests_only():
    """RM signal only (outcome_weight 0): R = λ·generated fraction; the tests' rewards unchanged.
    Task a: generated fractions 1, 0 -> R = 1, 0 (λ = 1), although both pass half the ground truth."""
    tests = {"task_id": np.array(["a", "a"]), "test_idx": np.array([0, 1]), "reward": np.array([2.0, -2.0])}
    trajectories = {
        "traj_id": np.array([0, 1]),
        "task_id": np.array(["a", "a"]),
        "outcome": np.array([1, -1]),
        "test_fraction": np.array([0.5, 0.5]),
        "generated_fraction": np.array([1.0, 0.0]),
    }
    pol, rm = unit_test_samples(
        tests, trajectories, lam=1.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=0.0
    )
    assert pol["reward"].tolist() == [1.0, 0.0]
    assert rm["reward"].tolist() == [2.0, -2.0]


def test_unit_test_samples_all_equal_rewards_are_zero_std_and_unknown_tasks_raise():
    trajectories = {"traj_id": np.array([0, 1]), "task_id": np.array(["a", "a"]), "outcome": np.array([1, -1]),
                    "test_fraction": np.array([1.0, 0.0]), "generated_fraction": np.zeros(2)}  # fmt: skip
    tests = {"task_id": np.array(["a", "a"]), "test_idx": np.array([0, 1]), "reward": np.array([-2.0, -2.0])}
    _, rm = unit_test_samples(tests, trajectories, lam=1.0, band=(0.0, 1.0), policy_band=(0.0, 1.0), outcome_weight=1.0)
    assert rm["drop_reason"].tolist() == ["zero_std", "zero_std"] and not rm["kept"].any()
    tests["task_id"] = np.array(["a", "z"])
    with pytest.raises(ValueError, match="no trainable trajectory"):
        unit_test_samples(tests, trajectories, lam=1.0, band=(0.0, 1.0), policy_band=(0.0, 1.0), outcome_weight=1.0)


def test_unit_test_samples_rewards_equal_up_to_float_noise_are_zero_std():
    """Task a's two tests earn 0.1 + 0.2 = 0.30000000000000004 and 0.3: max - min = 5.55e-17,
    not 0 for `==`, but below the tolerance 1e-9 * (0.3 + 1) of `is_negligible` -> zero_std, as
    the z-score itself decides (its advantages are 0.0). Task b's [1, -1] still trains."""
    noisy = 0.1 + 0.2
    assert noisy != 0.3 and noisy - 0.3 == pytest.approx(5.551115123125783e-17, abs=0)  # the noise, by hand
    trajectories = {"traj_id": np.array([0, 1, 2, 3]), "task_id": np.array(["a", "a", "b", "b"]),
                    "outcome": np.array([1, -1, 1, -1]), "test_fraction": np.array([1.0, 0.0, 1.0, 0.0]),
                    "generated_fraction": np.zeros(4)}  # fmt: skip
    tests = {"task_id": np.array(["a", "a", "b", "b"]), "test_idx": np.array([0, 1, 0, 1]),
             "reward": np.array([noisy, 0.3, 1.0, -1.0])}  # fmt: skip
    _, rm = unit_test_samples(tests, trajectories, lam=1.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=1.0)
    s = np.std([1.0, -1.0], ddof=1) + EPS  # sqrt(2) + 1e-6
    assert rm["advantage"].tolist() == [0.0, 0.0, 1 / s, -1 / s]
    assert rm["drop_reason"].tolist() == ["zero_std", "zero_std", None, None]  # == 0 on max - min said zero_advantage
    assert rm["kept"].tolist() == [False, False, True, True]
