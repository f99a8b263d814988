"""Curriculum rules: accuracy, the inclusive band, direction and rewrite acceptance at every boundary."""

import numpy as np
import pytest

from rlanything.algo.curriculum import accept_rewrite, adaptation_direction, in_band, task_accuracy

# ---------------------------------------------------------------- task_accuracy


def test_task_accuracy_hand_example():
    outcome = np.array([1, -1, 1, -1, 1, 1, 1, 1, -1, -1])
    task = np.array(["a", "a", "a", "a", "b", "b", "b", "b", "c", "c"])
    # a: 2 of 4, b: 4 of 4, c: 0 of 2
    assert task_accuracy(outcome, task) == {"a": 0.5, "b": 1.0, "c": 0.0}


def test_task_accuracy_int_ids_are_python_ints():
    acc = task_accuracy(np.array([1, -1, -1]), np.array([3, 3, 9]))
    assert acc == {3: 0.5, 9: 0.0}
    assert all(type(k) is int for k in acc)


def test_task_accuracy_shape_error():
    with pytest.raises(ValueError):
        task_accuracy(np.array([1, 1]), np.array([0]))


# ---------------------------------------------------------------- in_band


def test_in_band_inclusive_array():
    acc = np.array([0.0, 0.19, 0.2, 0.5, 0.8, 0.81, 1.0])
    np.testing.assert_array_equal(in_band(acc, 0.2, 0.8), [False, False, True, True, True, False, False])


def test_in_band_scalar_returns_bool():
    assert in_band(0.8, 0.2, 0.8) is True
    assert in_band(1.0, 0.2, 0.8) is False


def test_in_band_policy_band_eighths():
    # group of 8: 1/8 .. 7/8 train, 0/8 and 8/8 do not
    acc = np.arange(9) / 8
    np.testing.assert_array_equal(in_band(acc, 1 / 8, 7 / 8), [False] + [True] * 7 + [False])


# ---------------------------------------------------------------- adaptation_direction


@pytest.mark.parametrize(
    "acc, direction",
    [(1.0, "harder"), (0.8, "harder"), (0.79, None), (0.5, None), (0.21, None), (0.2, "easier"), (0.0, "easier")],
)
def test_adaptation_direction_boundaries(acc, direction):
    assert adaptation_direction(acc, low=0.2, high=0.8) == direction


def test_adaptation_direction_custom_band():
    assert adaptation_direction(0.875, low=0.125, high=0.875) == "harder"
    assert adaptation_direction(0.8, low=0.125, high=0.875) is None


def test_adaptation_direction_bad_band():
    with pytest.raises(ValueError):
        adaptation_direction(0.5, low=0.8, high=0.2)


# ---------------------------------------------------------------- accept_rewrite: harder


def test_harder_accepted_inside():
    assert accept_rewrite("harder", acc_old=1.0, acc_new=0.5, low=0.2, high=0.8) == (True, "accepted")


def test_harder_accepted_at_low():
    assert accept_rewrite("harder", acc_old=0.9, acc_new=0.2, low=0.2, high=0.8) == (True, "accepted")


def test_harder_below_band():
    assert accept_rewrite("harder", acc_old=0.9, acc_new=0.1, low=0.2, high=0.8) == (False, "below_band")


def test_harder_zero_accuracy():
    assert accept_rewrite("harder", acc_old=0.9, acc_new=0.0, low=0.2, high=0.8) == (False, "zero_accuracy")


def test_harder_zero_accuracy_even_when_low_is_zero():
    assert accept_rewrite("harder", acc_old=0.9, acc_new=0.0, low=0.0, high=0.8) == (False, "zero_accuracy")


def test_harder_equal_accuracy_is_not_harder():
    assert accept_rewrite("harder", acc_old=0.8, acc_new=0.8, low=0.2, high=0.8) == (False, "not_harder")


def test_harder_easier_result_is_not_harder():
    assert accept_rewrite("harder", acc_old=0.8, acc_new=1.0, low=0.2, high=0.8) == (False, "not_harder")


def test_harder_at_high_is_accepted_if_lower_than_before():
    assert accept_rewrite("harder", acc_old=1.0, acc_new=0.8, low=0.2, high=0.8) == (True, "accepted")


# ---------------------------------------------------------------- accept_rewrite: easier


def test_easier_accepted_inside():
    assert accept_rewrite("easier", acc_old=0.0, acc_new=0.5, low=0.2, high=0.8) == (True, "accepted")


def test_easier_accepted_at_high():
    assert accept_rewrite("easier", acc_old=0.1, acc_new=0.8, low=0.2, high=0.8) == (True, "accepted")


def test_easier_above_band():
    assert accept_rewrite("easier", acc_old=0.1, acc_new=0.9, low=0.2, high=0.8) == (False, "above_band")


def test_easier_zero_accuracy():
    assert accept_rewrite("easier", acc_old=0.0, acc_new=0.0, low=0.2, high=0.8) == (False, "zero_accuracy")


def test_easier_equal_accuracy_is_not_easier():
    assert accept_rewrite("easier", acc_old=0.2, acc_new=0.2, low=0.2, high=0.8) == (False, "not_easier")


def test_easier_harder_result_is_not_easier():
    assert accept_rewrite("easier", acc_old=0.2, acc_new=0.1, low=0.2, high=0.8) == (False, "not_easier")


def test_easier_at_low_is_accepted_if_higher_than_before():
    assert accept_rewrite("easier", acc_old=0.0, acc_new=0.2, low=0.2, high=0.8) == (True, "accepted")


def test_unknown_direction_raises():
    with pytest.raises(ValueError):
        accept_rewrite("sideways", acc_old=0.5, acc_new=0.5, low=0.2, high=0.8)
