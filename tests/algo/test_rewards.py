"""Integrated policy reward and RM consistency reward, against hand-computed numbers."""

import numpy as np
import pytest

from rlanything.algo.rewards import integrated_reward, rm_consistency_reward

OUTCOME = np.array([1, -1, 1])
STEP_SCORE = np.array(
    [
        [1, 1, -1],  # mean  1/3
        [-1, -1, -1],  # mean -1
        [1, 0, 0],  # mean  1/3 (two unparseable judgments count as 0)
    ]
)


def test_integrated_reward_lam_one():
    # 1 + 1/3, -1 - 1, 1 + 1/3
    np.testing.assert_allclose(integrated_reward(OUTCOME, STEP_SCORE, lam=1.0), [4 / 3, -2.0, 4 / 3])


def test_integrated_reward_lam_half():
    # 1 + 1/6, -1 - 1/2, 1 + 1/6
    np.testing.assert_allclose(integrated_reward(OUTCOME, STEP_SCORE, lam=0.5), [7 / 6, -1.5, 7 / 6])


def test_integrated_reward_lam_zero_is_outcome_baseline():
    np.testing.assert_array_equal(integrated_reward(OUTCOME, STEP_SCORE, lam=0.0), [1.0, -1.0, 1.0])


def test_integrated_reward_single_judgment():
    np.testing.assert_array_equal(integrated_reward(np.array([1, -1]), np.array([[1], [1]]), lam=1.0), [2.0, 0.0])


def test_integrated_reward_shape_errors():
    with pytest.raises(ValueError):
        integrated_reward(np.array([1, 1]), np.array([1, 1]), lam=1.0)
    with pytest.raises(ValueError):
        integrated_reward(np.array([1, 1]), np.zeros((3, 2)), lam=1.0)
    with pytest.raises(ValueError):
        integrated_reward(np.array([1, 1]), np.zeros((2, 0)), lam=1.0)


def test_rm_consistency_reward_hand_example():
    integrated = np.array([4 / 3, -2.0, 4 / 3])
    parsed = np.array([[True, True, True], [True, True, True], [True, False, False]])
    expected = np.array(
        [
            [4 / 3, 4 / 3, -4 / 3],  # R * S
            [2.0, 2.0, 2.0],  # -2 * -1: the judge agreed with a failure
            [4 / 3, -2.0, -2.0],  # unparseable -> -2
        ]
    )
    np.testing.assert_allclose(rm_consistency_reward(integrated, STEP_SCORE, parsed, unparseable_reward=-2.0), expected)


def test_rm_consistency_unparseable_is_minus_two_even_when_R_is_zero():
    out = rm_consistency_reward(np.array([0.0]), np.array([[0, 1]]), np.array([[False, True]]), unparseable_reward=-2.0)
    np.testing.assert_array_equal(out, [[-2.0, 0.0]])


def test_rm_consistency_custom_unparseable_reward():
    out = rm_consistency_reward(np.array([1.0]), np.array([[0]]), np.array([[False]]), unparseable_reward=-5.0)
    np.testing.assert_array_equal(out, [[-5.0]])


def test_rm_consistency_shape_errors():
    with pytest.raises(ValueError):
        rm_consistency_reward(np.array([1.0]), np.array([[1, 1]]), np.array([[True]]), unparseable_reward=-2.0)
    with pytest.raises(ValueError):
        rm_consistency_reward(
            np.array([1.0, 2.0]), np.array([[1, 1]]), np.array([[True, True]]), unparseable_reward=-2.0
        )
