"""Group z-scores: hand-computed examples, each edge case, and vectorised vs loop."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlanything.algo.advantages import (
    ZERO_RTOL,
    group_zscore,
    is_negligible,
    rm_advantages,
    step_index_advantages,
    step_index_advantages_loop,
)

EPS = 1e-6

# ---------------------------------------------------------------- group_zscore


def test_group_zscore_hand_example_uses_unbiased_std():
    # group "a": [2, 0] -> mean 1, std (ddof=1) = sqrt(((1)^2 + (-1)^2) / 1) = sqrt(2)
    #   -> +-1/sqrt(2) = +-0.7071 (ddof=0 would give +-1)
    # group "b": [1, 2, 6] -> mean 3, std = sqrt((4 + 1 + 9) / 2) = sqrt(7) = 2.6458
    #   -> [-0.7559, -0.3780, 1.1339]
    values = np.array([2.0, 1.0, 0.0, 2.0, 6.0])
    groups = np.array(["a", "b", "a", "b", "b"])
    z, size = group_zscore(values, groups)
    s2, s7 = np.sqrt(2) + EPS, np.sqrt(7) + EPS
    np.testing.assert_allclose(z, [1 / s2, -2 / s7, -1 / s2, -1 / s7, 3 / s7])
    np.testing.assert_array_equal(size, [2, 3, 2, 3, 3])


def test_group_zscore_singleton_keeps_raw_value():
    z, size = group_zscore(np.array([1.5, 3.0, 5.0]), np.array([0, 1, 1]))
    assert z[0] == 1.5
    assert size[0] == 1


def test_group_zscore_all_equal_is_exactly_zero():
    # the float mean of [0.1, 0.1, 0.1] is not exactly 0.1; the result must still be exactly 0
    z, size = group_zscore(np.array([0.1, 0.1, 0.1, 0.7, 0.7]), np.array([3, 3, 3, 4, 4]))
    assert np.all(z == 0.0)
    np.testing.assert_array_equal(size, [3, 3, 3, 2, 2])


def test_group_zscore_object_and_tuple_ids():
    ids = np.empty(4, dtype=object)
    ids[:] = [("t", 0), ("t", 0), 7, "x"]  # mixed types: np.unique would fail to sort these
    z, size = group_zscore(np.array([0.0, 2.0, 4.0, 5.0]), ids)
    np.testing.assert_allclose(z, [-1 / (np.sqrt(2) + EPS), 1 / (np.sqrt(2) + EPS), 4.0, 5.0])
    np.testing.assert_array_equal(size, [2, 2, 1, 1])


def test_group_zscore_empty():
    z, size = group_zscore(np.array([]), np.array([]))
    assert z.shape == (0,) and size.shape == (0,)


def test_group_zscore_shape_error():
    with pytest.raises(ValueError):
        group_zscore(np.array([1.0, 2.0]), np.array([0]))


# ---------------------------------------------------------------- step_index_advantages
# 3 tasks x 4 trajectories, at most 3 steps, uneven lengths. R = O + mean S with m = 1,
# so R is in {-2, 0, 2}. Per (task, step) group, by hand (std with ddof=1):
#
# task A, lengths a1=3, a2=2, a3=1, a4=3
#   step 0: a1..a4 = [2, 0, -2, 0]  mean 0, std sqrt(8/3) = 1.63299 -> [1.22474, 0, -1.22474, 0]
#   step 1: a1, a2, a4 = [2, 2, 2]  std 0 -> [0, 0, 0]
#   step 2: a1, a4 = [2, 0]         mean 1, std sqrt(2)  -> [0.70711, -0.70711]
# task B, lengths b1=1, b2=1, b3=2, b4=1
#   step 0: [2, 2, -2, 2]           mean 1, std 2        -> [0.5, 0.5, -1.5, 0.5]
#   step 1: b3 alone = -2           one trajectory       -> raw -2
# task C, lengths c1=3, c2=3, c3=2, c4=1
#   step 0: [-2, -2, -2, -2]        std 0                -> [0, 0, 0, 0]
#   step 1: c1, c2, c3 = [0, 0, 2]  mean 2/3, std sqrt(4/3) = 1.15470 -> [-0.57735, -0.57735, 1.15470]
#   step 2: c1, c2 = [-2, 0]        mean -1, std sqrt(2) -> [-0.70711, 0.70711]
S83, S2, S43 = np.sqrt(8 / 3) + EPS, np.sqrt(2) + EPS, np.sqrt(4 / 3) + EPS
HAND_ROWS = [
    # task, trajectory, step, R, expected advantage
    ("A", "a1", 0, 2.0, 2 / S83),
    ("A", "a1", 1, 2.0, 0.0),
    ("A", "a1", 2, 2.0, 1 / S2),
    ("A", "a2", 0, 0.0, 0.0),
    ("A", "a2", 1, 2.0, 0.0),
    ("A", "a3", 0, -2.0, -2 / S83),
    ("A", "a4", 0, 0.0, 0.0),
    ("A", "a4", 1, 2.0, 0.0),
    ("A", "a4", 2, 0.0, -1 / S2),
    ("B", "b1", 0, 2.0, 1 / (2 + EPS)),
    ("B", "b2", 0, 2.0, 1 / (2 + EPS)),
    ("B", "b3", 0, -2.0, -3 / (2 + EPS)),
    ("B", "b3", 1, -2.0, -2.0),
    ("B", "b4", 0, 2.0, 1 / (2 + EPS)),
    ("C", "c1", 0, -2.0, 0.0),
    ("C", "c1", 1, 0.0, -(2 / 3) / S43),
    ("C", "c1", 2, -2.0, -1 / S2),
    ("C", "c2", 0, -2.0, 0.0),
    ("C", "c2", 1, 0.0, -(2 / 3) / S43),
    ("C", "c2", 2, 0.0, 1 / S2),
    ("C", "c3", 0, -2.0, 0.0),
    ("C", "c3", 1, 2.0, (4 / 3) / S43),
    ("C", "c4", 0, -2.0, 0.0),
]


def _hand_arrays(order):
    rows = [HAND_ROWS[i] for i in order]
    task = np.array([r[0] for r in rows])
    step = np.array([r[2] for r in rows])
    reward = np.array([r[3] for r in rows])
    expected = np.array([r[4] for r in rows])
    return reward, task, step, expected


def test_step_index_hand_example():
    reward, task, step, expected = _hand_arrays(range(len(HAND_ROWS)))
    np.testing.assert_allclose(step_index_advantages(reward, task, step), expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(
        step_index_advantages(reward, task, step),
        [
            1.22474,
            0,
            0.70711,
            0,
            0,
            -1.22474,
            0,
            0,
            -0.70711,
            0.5,
            0.5,
            -1.5,
            -2.0,
            0.5,
            0,
            -0.57735,
            -0.70711,
            0,
            -0.57735,
            0.70711,
            0,
            1.15470,
            0,
        ],
        atol=1e-5,
    )


def test_step_index_hand_example_any_row_order():
    order = np.random.default_rng(0).permutation(len(HAND_ROWS))
    reward, task, step, expected = _hand_arrays(order)
    np.testing.assert_allclose(step_index_advantages(reward, task, step), expected, rtol=1e-12, atol=0)


def test_step_index_loop_hand_example():
    reward, task, step, expected = _hand_arrays(range(len(HAND_ROWS)))
    np.testing.assert_allclose(step_index_advantages_loop(reward, task, step), expected, rtol=1e-12, atol=0)


def test_step_index_dropped_samples_are_exact_zeros():
    reward, task, step, expected = _hand_arrays(range(len(HAND_ROWS)))
    adv = step_index_advantages(reward, task, step)
    # std-0 groups (A step 1, C step 0) and the rows at their group's mean are dropped
    assert np.count_nonzero(adv == 0.0) == 9


def test_step_index_single_trajectory_keeps_raw_R():
    adv = step_index_advantages(np.array([1.0, 3.0, -4 / 3]), np.array([0, 0, 0]), np.array([0, 0, 1]))
    assert adv[2] == -4 / 3


def test_step_index_std_zero_gives_zero():
    adv = step_index_advantages(np.full(3, 4 / 3), np.array([5, 5, 5]), np.array([1, 1, 1]))
    assert np.all(adv == 0.0)


def test_step_index_tasks_do_not_mix():
    # same step index, different tasks: two singleton groups, not one pair
    adv = step_index_advantages(np.array([2.0, 0.0]), np.array([0, 1]), np.array([0, 0]))
    np.testing.assert_array_equal(adv, [2.0, 0.0])


def _random_rollout(rng, n_tasks, group, max_steps, m=3):
    """Rows (R, task, step) of a random batch: uneven lengths, R = O + mean of m scores."""
    rewards, tasks, steps = [], [], []
    for t in range(n_tasks):
        for _ in range(group):
            outcome = rng.choice([-1, 1])
            for i in range(rng.integers(1, max_steps + 1)):
                rewards.append(outcome + rng.choice([-1, 0, 1], size=m).mean())
                tasks.append(f"task{t}")
                steps.append(i)
    order = rng.permutation(len(rewards))
    return np.array(rewards)[order], np.array(tasks)[order], np.array(steps)[order]


@pytest.mark.parametrize("seed", range(20))
def test_step_index_vectorised_matches_loop_seeded(seed):
    rng = np.random.default_rng(seed)
    reward, task, step = _random_rollout(rng, n_tasks=5, group=int(rng.integers(1, 9)), max_steps=6)
    fast = step_index_advantages(reward, task, step)
    slow = step_index_advantages_loop(reward, task, step)
    np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(fast == 0.0, slow == 0.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 4), st.floats(-3, 3, allow_nan=False)),
        min_size=1,
        max_size=40,
    )
)
def test_step_index_vectorised_matches_loop_property(rows):
    task = np.array([r[0] for r in rows])
    step = np.array([r[1] for r in rows])
    reward = np.array([r[2] for r in rows])
    fast = step_index_advantages(reward, task, step)
    slow = step_index_advantages_loop(reward, task, step)
    np.testing.assert_allclose(fast, slow, rtol=1e-7, atol=1e-7)
    np.testing.assert_array_equal(fast == 0.0, slow == 0.0)  # the same zero rule in both


# ---------------------------------------------------------------- zero tests robust to float noise

# [-1.2, -0.4, 1.8, -1.8] has mean -0.4 exactly, but -0.4 - mean is +5.6e-17, -5.6e-17 or 0
# depending on the order the values are summed in; every order must give -0.4 advantage exactly 0.
NOISY_ORDERS = [[-1.2, -0.4, 1.8, -1.8], [-1.2, -1.8, -0.4, 1.8], [-1.2, -0.4, -1.8, 1.8], [1.8, -1.8, -0.4, -1.2]]


@pytest.mark.parametrize("values", NOISY_ORDERS)
def test_value_at_its_group_mean_has_advantage_exactly_zero(values):
    values = np.array(values)
    at_mean = values == -0.4
    assert values[at_mean][0] - values.mean() in (0.0, 5.551115123125783e-17, -5.551115123125783e-17)
    ids = np.zeros(4, dtype=np.int64)
    for adv in (
        step_index_advantages(values, ids, ids),
        step_index_advantages_loop(values, ids, ids),
        group_zscore(values, ids)[0],
    ):
        assert adv[at_mean].tolist() == [0.0]  # exactly, in the vectorised code and the loop
        assert np.all(adv[~at_mean] != 0.0)
    adv, valid = rm_advantages(values[None, :])
    assert valid[0] and adv[0][at_mean].tolist() == [0.0] and np.all(adv[0][~at_mean] != 0.0)


def test_the_noisy_case_was_really_noisy_before_the_tolerance():
    # the sum order (-1.2, -1.8, -0.4, 1.8) leaves -5.6e-17 where the mean should be: a plain
    # `!= 0` test would have kept this sample (and counted it in the loss)
    values = np.array([-1.2, -1.8, -0.4, 1.8])
    assert values[2] - np.bincount(np.zeros(4, dtype=np.int64), weights=values)[0] / 4 != 0.0


def test_thirds_at_their_mean_in_many_groups_are_zero_in_both_implementations():
    # rewards O + mean of 3 scores are multiples of 1/3: exact means of 1/3-steps leave float
    # noise; decide with exact fractions which samples are mathematically at their mean
    from fractions import Fraction

    rng = np.random.default_rng(7)
    thirds = rng.integers(-6, 7, size=(400, 3))  # 400 groups of 3
    thirds[:, 2] = -(thirds[:, 0] + thirds[:, 1]) + 3 * rng.integers(-1, 2, size=400)  # many means hit a member
    values = (thirds / 3.0).ravel()
    ids = np.repeat(np.arange(400), 3)
    exact_zero = np.array(
        [Fraction(int(t), 3) == sum(Fraction(int(x), 3) for x in row) / 3 for row in thirds for t in row]
    )
    assert exact_zero.sum() > 50
    fast = step_index_advantages(values, ids, ids)
    slow = step_index_advantages_loop(values, ids, ids)
    np.testing.assert_array_equal(fast == 0.0, exact_zero)
    np.testing.assert_array_equal(slow == 0.0, exact_zero)


def test_is_negligible_scales_with_the_group():
    assert is_negligible(1e-10, 0.0) and not is_negligible(1e-8, 0.0)
    assert is_negligible(5e-7, 1e3) and not is_negligible(5e-6, 1e3)  # 1e-9 * (1000 + 1) ~ 1e-6
    assert ZERO_RTOL == 1e-9


def test_group_whose_spread_is_float_noise_has_std_zero():
    values = np.array([0.1 + 0.2, 0.3, 0.30000000000000004])  # equal up to rounding
    assert values.max() != values.min()
    np.testing.assert_array_equal(step_index_advantages(values, np.zeros(3), np.zeros(3)), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(step_index_advantages_loop(values, np.zeros(3), np.zeros(3)), [0.0, 0.0, 0.0])
    assert not rm_advantages(values[None, :])[1][0]


# ---------------------------------------------------------------- rm_advantages


def test_rm_advantages_hand_example():
    rm_reward = np.array(
        [
            [1.0, 1.0, -1.0],  # mean 1/3, std sqrt(4/3) -> [0.57735, 0.57735, -1.15470]
            [2.0, 2.0, 2.0],  # std 0 -> skipped
            [1.0, -2.0, 1.0],  # one unparseable: mean 0, std sqrt(3) -> [0.57735, -1.15470, 0.57735]
            [0.0, 0.0, 0.0],  # R = 0: every judgment earns 0 -> skipped
        ]
    )
    adv, valid = rm_advantages(rm_reward)
    s43, s3 = np.sqrt(4 / 3) + EPS, np.sqrt(3) + EPS
    expected = np.array(
        [
            [(2 / 3) / s43, (2 / 3) / s43, -(4 / 3) / s43],
            [0.0, 0.0, 0.0],
            [1 / s3, -2 / s3, 1 / s3],
            [0.0, 0.0, 0.0],
        ]
    )
    np.testing.assert_allclose(adv, expected, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(valid, [True, False, True, False])


def test_rm_advantages_single_judgment_is_invalid():
    adv, valid = rm_advantages(np.array([[2.0], [-1.0]]))
    np.testing.assert_array_equal(adv, [[0.0], [0.0]])
    np.testing.assert_array_equal(valid, [False, False])


def test_rm_advantages_equal_thirds_are_invalid():
    adv, valid = rm_advantages(np.full((1, 3), 1 / 3))
    assert not valid[0] and np.all(adv == 0.0)


def test_rm_advantages_shape_error():
    with pytest.raises(ValueError):
        rm_advantages(np.array([1.0, 2.0]))
