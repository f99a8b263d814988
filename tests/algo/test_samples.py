"""Which samples train (algo.samples): the m-judgments check and hand-computed selections."""

import re

import numpy as np
import pytest

from rlanything.algo.samples import judgment_matrix, select_samples

# the paper's payment of the RM's judgments (algo.rm_balance off, algo.rm_advantage zscore)
PAPER_RM = {"rm_balance": False, "rm_advantage": "zscore"}


def judgments(rows):
    """rows of (traj_id, step_idx, judge_idx, step_score) -> the column dict."""
    t, s, j, sc = (np.array(c) for c in zip(*rows))
    return {"traj_id": t, "step_idx": s, "judge_idx": j, "step_score": sc, "parsed": sc != 0}


def trajectories(traj, task, outcome):
    return {"traj_id": np.array(traj), "task_id": np.array(task, dtype=object), "outcome": np.array(outcome)}


# ---------------------------------------------------------------- the m-judgments check


def test_judgment_matrix_orders_each_steps_judgments():
    keys, order = judgment_matrix(
        np.array([2, 0, 2, 0, 0, 0]), np.array([0, 1, 0, 0, 1, 0]), np.array([1, 0, 0, 1, 1, 0]), m=2
    )
    assert keys.tolist() == [[0, 0], [0, 1], [2, 0]]
    assert order.tolist() == [[5, 3], [1, 4], [2, 0]]


@pytest.mark.parametrize(
    "judge_idx, message",
    [
        ([0, 1, 0], "has judgments [0]"),  # step (1, 0) has 1 of 2
        ([0, 1, 0, 1, 1], "has judgments [0, 1, 1]"),  # 3 judgments, one duplicated
        ([0, 1, 1, 2], "has judgments [1, 2]"),  # 2 judgments but numbered 1, 2
        ([0, 1, 0, 0], "has judgments [0, 0]"),  # right count, judge 1 missing, 0 twice
    ],
)
def test_judgment_matrix_refuses_anything_but_m_judgments_numbered_0_to_m_minus_1(judge_idx, message):
    n = len(judge_idx)
    traj = np.array([0, 0] + [1] * (n - 2))
    with pytest.raises(ValueError, match=re.escape(f"step 0 of trajectory 1 {message}")):
        judgment_matrix(traj, np.zeros(n, dtype=np.int64), np.array(judge_idx), m=2)


def test_select_samples_refuses_a_step_with_too_few_judgments():
    bad = judgments([(0, 0, 0, 1), (0, 0, 1, 1), (1, 0, 0, -1)])  # m = 2, trajectory 1 has one
    with pytest.raises(ValueError, match="exactly m=2 judgments"):
        select_samples(
            bad,
            trajectories([0, 1], ["a", "a"], [1, -1]),
            m=2,
            lam=1.0,
            band=(0, 1),
            policy_band=(0, 1),
            outcome_weight=1.0,
            **PAPER_RM,
        )


def test_select_samples_refuses_judgments_of_unknown_trajectories():
    with pytest.raises(ValueError, match=r"trajectories \[5\]"):
        select_samples(
            judgments([(5, 0, 0, 1)]),
            trajectories([0], ["a"], [1]),
            m=1,
            lam=1.0,
            band=(0, 1),
            policy_band=(0, 1),
            outcome_weight=1.0,
            **PAPER_RM,
        )


# ---------------------------------------------------------------- hand-computed selections


def test_select_samples_by_hand():
    # task a: trajectories 0 (won, 2 steps), 1 (lost, 1 step), 3 (won, 1 step): accuracy 2/3
    # task b: trajectory 2 (lost): accuracy 0; m = 2 judgments, 0 = unparsed
    rows = [
        (0, 0, 0, 1),
        (0, 0, 1, 1),
        (0, 1, 0, 1),
        (0, 1, 1, -1),
        (1, 0, 0, -1),
        (1, 0, 1, 0),
        (2, 0, 0, 1),
        (2, 0, 1, 1),
        (3, 0, 0, 1),
        (3, 0, 1, -1),
    ]
    order = [7, 2, 9, 0, 4, 1, 8, 3, 6, 5]  # any row order
    jud = judgments([rows[i] for i in order])
    traj = trajectories([0, 1, 2, 3], ["a", "a", "b", "a"], [1, -1, -1, 1])
    pol, rm = select_samples(
        jud, traj, m=2, lam=1.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=1.0, **PAPER_RM
    )
    # steps sorted (0,0) (0,1) (1,0) (2,0) (3,0); R = O + mean S: 2, 1, -1.5, 0, 1
    assert pol["traj_id"].tolist() == [0, 0, 1, 2, 3] and pol["step_idx"].tolist() == [0, 1, 0, 0, 0]
    assert pol["reward"].tolist() == [2.0, 1.0, -1.5, 0.0, 1.0]
    # (a, step 0) = {2, -1.5, 1}: mean 0.5, sample std sqrt((2.25 + 4 + 0.25) / 2) = 1.80278
    std = np.sqrt(3.25) + 1e-6
    assert pol["advantage"][[0, 2, 4]] == pytest.approx([1.5 / std, -2.0 / std, 0.5 / std], abs=1e-12)
    assert pol["advantage"][1] == 1.0 and pol["advantage"][3] == 0.0  # alone at (a, 1): raw R; (b, 0): raw 0
    assert pol["kept"].tolist() == [True, True, True, False, True]
    assert pol["drop_reason"].tolist() == [None, None, None, "out_of_band", None]
    # RM rewards R * S (-2 unparsed): (0,0) [2, 2] equal -> zero_std; (0,1) [1, -1]; (1,0) [1.5, -2];
    # (2,0) [0, 0] out of band; (3,0) [1, -1]
    assert rm["reward"].tolist() == [2.0, 2.0, 1.0, -1.0, 1.5, -2.0, 0.0, 0.0, 1.0, -1.0]
    assert rm["judge_idx"].tolist() == [0, 1] * 5
    assert rm["kept"].tolist() == [False, False, True, True, True, True, False, False, True, True]
    assert rm["drop_reason"].tolist() == [
        "zero_std",
        "zero_std",
        None,
        None,
        None,
        None,
        "out_of_band",
        "out_of_band",
        None,
        None,
    ]
    s2 = np.sqrt(2) + 1e-6  # [1, -1]: mean 0, std sqrt(2)
    assert rm["advantage"][[2, 3]] == pytest.approx([1 / s2, -1 / s2], abs=1e-12)


def test_rm_balance_gives_solved_and_unsolved_episodes_equal_weight_by_hand():
    # the by-hand case above: kept RM judgments (0,1) and (3,0) of won episodes (4), (1,0) of a
    # lost one (2): n = 6, weights 6 / (2 * 4) = 0.75 and 6 / (2 * 2) = 1.5
    rows = [(0, 0, 0, 1), (0, 0, 1, 1), (0, 1, 0, 1), (0, 1, 1, -1), (1, 0, 0, -1), (1, 0, 1, 0)]
    rows += [(2, 0, 0, 1), (2, 0, 1, 1), (3, 0, 0, 1), (3, 0, 1, -1)]
    traj = trajectories([0, 1, 2, 3], ["a", "a", "b", "a"], [1, -1, -1, 1])
    args = dict(m=2, lam=1.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=1.0)
    plain_pol, plain = select_samples(judgments(rows), traj, **args, **PAPER_RM)
    pol, rm = select_samples(judgments(rows), traj, **args, rm_balance=True, rm_advantage="zscore")
    z = 1 / (np.sqrt(2) + 1e-6)  # [1, -1] and [1.5, -2] both z-score to +-0.7071
    assert plain["advantage"][[2, 3, 4, 5, 8, 9]] == pytest.approx([z, -z, z, -z, z, -z], abs=1e-6)
    expected = [0.0, 0.0, 0.75 * z, -0.75 * z, 1.5 * z, -1.5 * z, 0.0, 0.0, 0.75 * z, -0.75 * z]
    assert rm["advantage"] == pytest.approx(expected, abs=1e-6)
    won = np.isin(rm["traj_id"], [0, 3]) & rm["kept"]
    assert np.abs(rm["advantage"][won]).sum() == pytest.approx(np.abs(rm["advantage"][rm["kept"] & ~won]).sum())
    assert rm["kept"].tolist() == plain["kept"].tolist()  # the same samples train, reweighted
    assert pol["advantage"].tolist() == plain_pol["advantage"].tolist()  # the policy's are untouched


def test_rm_balance_leaves_a_batch_with_one_outcome_alone():
    rows = [(0, 0, 0, 1), (0, 0, 1, -1), (1, 0, 0, -1), (1, 0, 1, 1), (2, 0, 0, -1), (2, 0, 1, -1)]
    traj = trajectories([0, 1, 2], ["a", "a", "a"], [-1, -1, 1])  # accuracy 1/3: in band
    _, plain = select_samples(
        judgments(rows), traj, m=2, lam=0.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=1.0, **PAPER_RM
    )
    _, rm = select_samples(
        judgments(rows),
        traj,
        m=2,
        lam=0.0,
        band=(0.2, 0.8),
        policy_band=(0.2, 0.8),
        outcome_weight=1.0,
        rm_balance=True,
        rm_advantage="zscore",
    )
    assert rm["kept"].tolist() == [True] * 4 + [False] * 2  # the won episode's two -1s: zero_std
    assert rm["advantage"].tolist() == plain["advantage"].tolist()


def test_a_policy_sample_at_its_group_mean_is_dropped_whatever_the_float_noise():
    # one task, four one-step trajectories, m = 4, lam = 0.8: R = O + 0.8 * mean S
    #   traj 0: -1 + 0.8 * (-1/4) = -1.2;  traj 1: -1 + 0.8 * (-1) = -1.8
    #   traj 2: -1 + 0.8 * (3/4) = -0.4;   traj 3:  1 + 0.8 * 1 = 1.8
    # mean -0.4: trajectory 2 is exactly at it, but in floats R_2 - mean = 5.6e-17
    scores = [[-1, 0, 0, 0], [-1, -1, -1, -1], [1, 1, 1, 0], [1, 1, 1, 1]]
    jud = judgments([(t, 0, j, sc) for t, row in enumerate(scores) for j, sc in enumerate(row)])
    traj = trajectories([0, 1, 2, 3], ["a"] * 4, [-1, -1, -1, 1])
    pol, rm = select_samples(jud, traj, m=4, lam=0.8, band=(0, 1), policy_band=(0, 1), outcome_weight=1.0, **PAPER_RM)
    reward = pol["reward"]
    assert reward[2] - np.bincount(np.zeros(4, dtype=np.int64), weights=reward)[0] / 4 != 0.0  # the noise is real
    assert pol["advantage"][2] == 0.0  # exactly
    assert pol["kept"].tolist() == [True, True, False, True]
    assert pol["drop_reason"].tolist() == [None, None, "zero_advantage", None]
    # RM: every judgment set of 4 has a spread; a judgment whose reward is its set's mean is dropped too
    # traj 0: R*S = [1.2, 0, 0, 0] (S = 0 is unparsed: -2) -> [1.2, -2, -2, -2], no member at the mean -1.2
    assert rm["kept"][:4].tolist() == [True] * 4
    # traj 1 and 3: all S equal -> zero_std; traj 2: [-0.4, -0.4, -0.4, -2]: no member at the mean
    assert rm["drop_reason"][4:8].tolist() == ["zero_std"] * 4 and rm["drop_reason"][12:].tolist() == ["zero_std"] * 4


def test_an_rm_judgment_at_its_sets_mean_is_dropped_as_zero_advantage():
    # won trajectory, m = 4, S = [1, -1, unparsed, unparsed]: R = 1 + lam * 0 = 1, RM rewards
    # R * S = [1, -1, -2, -2] (mean -1): judgment 1 sits at the mean -> advantage 0, dropped
    jud = judgments([(0, 0, 0, 1), (0, 0, 1, -1), (0, 0, 2, 0), (0, 0, 3, 0)])
    _, rm = select_samples(
        jud,
        trajectories([0], ["a"], [1]),
        m=4,
        lam=1.0,
        band=(0, 1),
        policy_band=(0, 1),
        outcome_weight=1.0,
        **PAPER_RM,
    )
    assert rm["reward"].tolist() == [1.0, -1.0, -2.0, -2.0]
    assert rm["advantage"][1] == 0.0 and rm["advantage"][0] > 0 > rm["advantage"][2]
    assert rm["kept"].tolist() == [True, False, True, True]
    assert rm["drop_reason"].tolist() == [None, "zero_advantage", None, None]


# ---------------------------------------------------------------- no RM in the loop (m = 0)

NONE = {k: np.array([], dtype=np.int64) for k in ("traj_id", "step_idx", "judge_idx", "step_score", "parsed")}


def test_select_samples_without_judgments_by_hand():
    # the trajectories of test_select_samples_by_hand, no RM: R = w * O, z-scored per (task, step)
    traj = trajectories([0, 1, 2, 3], ["a", "a", "b", "a"], [1, -1, -1, 1])
    steps = {"traj_id": np.array([3, 0, 2, 1, 0]), "step_idx": np.array([0, 1, 0, 0, 0])}  # any order
    pol, rm = select_samples(
        NONE, traj, m=0, lam=0.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), steps=steps, outcome_weight=1.0, **PAPER_RM
    )
    assert pol["traj_id"].tolist() == [0, 0, 1, 2, 3] and pol["step_idx"].tolist() == [0, 1, 0, 0, 0]
    assert pol["reward"].tolist() == [1.0, 1.0, -1.0, -1.0, 1.0]
    # (a, step 0) = {1, -1, 1}: mean 1/3, sample std sqrt((4/9 + 16/9 + 4/9) / 2) = 1.1547
    std = np.sqrt(4 / 3) + 1e-6
    assert pol["advantage"][[0, 2, 4]] == pytest.approx([(2 / 3) / std, (-4 / 3) / std, (2 / 3) / std], abs=1e-12)
    assert pol["advantage"][1] == 1.0 and pol["advantage"][3] == -1.0  # alone in their (task, step): raw R
    assert pol["kept"].tolist() == [True, True, True, False, True]  # task b (accuracy 0) out of band
    assert all(len(column) == 0 for column in rm.values())  # no judgment, no RM sample
    half = select_samples(
        NONE, traj, m=0, lam=0.0, band=(0, 1), policy_band=(0, 1), steps=steps, outcome_weight=0.5, **PAPER_RM
    )
    assert half[0]["reward"].tolist() == [0.5, 0.5, -0.5, -0.5, 0.5]


@pytest.mark.parametrize(
    "given, lam, m, message",
    [
        ("steps", 1.0, 0, "m = 0 (no judgments) needs lam = 0"),
        (None, 0.0, 0, "m = 0 needs the trainable steps"),
        ("both", 0.0, 0, "m = 0 needs the trainable steps as `steps` and no judgments"),
        ("twice", 0.0, 0, "every (traj_id, step_idx) must appear once"),
        ("steps+judged", 0.0, 1, "steps are only given with m = 0"),
    ],
)
def test_select_samples_without_judgments_refuses_what_it_cannot_mean(given, lam, m, message):
    traj = trajectories([0, 1], ["a", "a"], [1, -1])
    steps = {"traj_id": np.array([0, 1]), "step_idx": np.array([0, 0])}
    judged = judgments([(0, 0, 0, 1), (1, 0, 0, -1)])
    args = {
        "steps": (NONE, steps),
        None: (NONE, None),
        "both": (judged, steps),
        "twice": (NONE, {"traj_id": np.array([0, 1, 0]), "step_idx": np.array([0, 0, 0])}),
        "steps+judged": (judged, steps),
    }[given]
    with pytest.raises(ValueError, match=re.escape(message)):
        select_samples(
            args[0], traj, m=m, lam=lam, band=(0, 1), policy_band=(0, 1), steps=args[1], outcome_weight=1.0, **PAPER_RM
        )


def test_select_samples_pays_the_rm_for_progress_by_hand():
    """algo.rm_target progress, on the steps of test_select_samples_by_hand: (0,0) lost value
    (-0.5) in a won episode, (0,1) gained (+1.0), (1,0) made none (0), (2,0) is out of the RM band,
    (3,0) was not valued. RM rewards sign(progress) * S, -2 unparsed."""
    rows = [(0, 0, 0, 1), (0, 0, 1, 1), (0, 1, 0, 1), (0, 1, 1, -1), (1, 0, 0, -1), (1, 0, 1, 0)]
    rows += [(2, 0, 0, 1), (2, 0, 1, 1), (3, 0, 0, 1), (3, 0, 1, -1)]
    traj = trajectories([0, 1, 2, 3], ["a", "a", "b", "a"], [1, -1, -1, 1])
    progress = {"traj_id": np.array([0, 0, 1, 2]), "step_idx": np.array([0, 1, 0, 0])}
    progress["progress"] = np.array([-0.5, 1.0, 0.0, 0.5])
    args = {"m": 2, "lam": 1.0, "band": (0.2, 0.8), "policy_band": (0.2, 0.8), "outcome_weight": 1.0}
    pol, rm = select_samples(judgments(rows), traj, **args, **PAPER_RM, progress=progress)
    # (0,0): -1 * [1, 1] equal -> zero_std; (0,1): [1, -1]; (1,0): progress 0: 0 * -1, and -2 unparsed,
    # but no target; (2,0): out of band; (3,0): no value -> no target
    assert rm["reward"].tolist() == [-1.0, -1.0, 1.0, -1.0, -0.0, -2.0, 1.0, 1.0, 0.0, -0.0]
    assert rm["drop_reason"].tolist() == [
        "zero_std",
        "zero_std",
        None,
        None,
        "no_target",
        "no_target",
        "out_of_band",
        "out_of_band",
        "no_target",
        "no_target",
    ]
    assert rm["kept"].tolist() == [False, False, True, True] + [False] * 6
    # the policy's reward is the paper's, whatever the RM is paid for
    assert pol["reward"].tolist() == [2.0, 1.0, -1.5, 0.0, 1.0]


def test_the_rm_paid_its_reward_and_balanced_by_progress_sign_by_hand():
    """algo.rm_advantage reward with algo.rm_balance, on the rows above with (1,0) valued -1.0:
    (0,0) target -1, verdicts [1, 1] -> rewards [-1, -1], kept although they agree; (0,1) target
    +1 -> [1, -1]; (1,0) target -1, verdicts [-1, unparsed] -> [1, -2]. Kept: 4 judgments of
    class -1, 2 of class +1 (n = 6): weights 6/8 and 6/4."""
    rows = [(0, 0, 0, 1), (0, 0, 1, 1), (0, 1, 0, 1), (0, 1, 1, -1), (1, 0, 0, -1), (1, 0, 1, 0)]
    rows += [(2, 0, 0, 1), (2, 0, 1, 1), (3, 0, 0, 1), (3, 0, 1, -1)]
    traj = trajectories([0, 1, 2, 3], ["a", "a", "b", "a"], [1, -1, -1, 1])
    progress = {"traj_id": np.array([0, 0, 1, 2]), "step_idx": np.array([0, 1, 0, 0])}
    progress["progress"] = np.array([-0.5, 1.0, -1.0, 0.5])
    args = {"m": 2, "lam": 1.0, "band": (0.2, 0.8), "policy_band": (0.2, 0.8), "outcome_weight": 1.0}
    _, plain = select_samples(judgments(rows), traj, **args, rm_balance=False, rm_advantage="reward", progress=progress)
    _, rm = select_samples(judgments(rows), traj, **args, rm_balance=True, rm_advantage="reward", progress=progress)
    assert plain["advantage"].tolist() == [-1.0, -1.0, 1.0, -1.0, 1.0, -2.0, 1.0, 1.0, 0.0, 0.0]
    assert rm["advantage"].tolist() == [-0.75, -0.75, 1.5, -1.5, 0.75, -1.5, 1.0, 1.0, 0.0, 0.0]
    assert rm["kept"].tolist() == [True] * 6 + [False] * 4
    assert rm["drop_reason"].tolist() == [None] * 6 + ["out_of_band"] * 2 + ["no_target"] * 2


@pytest.mark.parametrize("rm_advantage", ["zscore", "reward"])
def test_a_progress_batch_of_one_class_does_not_train_the_rm_when_balanced(rm_advantage):
    """Every valued step a setback: balancing has nothing to weigh against, and such a batch only
    moves the judge's prior, so its judgments are dropped as one_class (unbalanced they train)."""
    rows = [(0, 0, 0, 1), (0, 0, 1, -1), (1, 0, 0, -1), (1, 0, 1, 1)]
    traj = trajectories([0, 1], ["a", "a"], [1, -1])
    progress = {"traj_id": np.array([0, 1]), "step_idx": np.array([0, 0]), "progress": np.array([-0.5, -1.0])}
    args = {"m": 2, "lam": 1.0, "band": (0.2, 0.8), "policy_band": (0.2, 0.8), "outcome_weight": 1.0}
    _, plain = select_samples(
        judgments(rows), traj, **args, rm_balance=False, rm_advantage=rm_advantage, progress=progress
    )
    _, rm = select_samples(judgments(rows), traj, **args, rm_balance=True, rm_advantage=rm_advantage, progress=progress)
    assert plain["kept"].all() and not rm["kept"].any()
    assert rm["drop_reason"].tolist() == ["one_class"] * 4
