"""RM outcome and process accuracy, AUROC and the reward-hacking guard, on hand-computed numbers."""

import itertools
import math

import numpy as np
import pytest

from rlanything.algo.rm_accuracy import auroc, guard, outcome_prediction, process_accuracy

LIMITS = dict(max_score_gap=1.0, min_outcome_accuracy=0.5, min_outcome_auroc=0.6, min_trajectories=4)


def test_auroc_by_hand():
    # positives 3, 1; negatives 2, 1: pairs (3>2) (3>1) (1<2) (1=1) -> (1 + 1 + 0 + 0.5) / 4
    assert auroc(np.array([3.0, 1.0, 2.0, 1.0]), np.array([True, True, False, False])) == 0.625
    assert auroc(np.array([0.0, 1.0]), np.array([False, True])) == 1.0
    assert auroc(np.array([0.0, 1.0]), np.array([True, False])) == 0.0
    assert math.isnan(auroc(np.array([0.0, 1.0]), np.array([False, False])))
    assert math.isnan(auroc(np.array([]), np.array([], dtype=bool)))


def test_auroc_matches_a_loop_over_pairs():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 12))
        scores = rng.integers(-3, 4, n) / 3  # many ties, as mean step scores have
        labels = rng.random(n) < 0.5
        pairs = [(p, q) for p, q in itertools.product(scores[labels], scores[~labels])]
        expected = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in pairs) / len(pairs) if pairs else math.nan
        got = auroc(scores, labels)
        assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


def judgments(rows):
    """rows: (traj, step, [S_j ...]) with None for an unparsed judgment -> the four columns."""
    flat = [(t, s, 0 if x is None else x, x is not None) for t, s, scores in rows for x in scores]
    return [np.array(col) for col in zip(*flat)]


def test_outcome_prediction_by_hand():
    # t0 (won): step 0 all +1 (right), step 1 split 1:1 (a tie: wrong). Mean step score (1 + 0)/2 = 0.5
    # t1 (lost): step 0 -1, -1, +1 (right). Mean -1/3
    # t2 (lost): step 0 +1, unparsed, unparsed (wrong). Mean +1
    # t3 (won): step 0 nothing parsed: predicts nothing (wrong). Mean 0
    cols = judgments(
        [
            (0, 0, [1, 1, 1]),
            (0, 1, [1, -1, None]),
            (1, 0, [-1, -1, 1]),
            (2, 0, [1, None, None]),
            (3, 0, [None, None, None]),
        ]
    )
    r = outcome_prediction(*cols, {0: 1, 1: -1, 2: -1, 3: 1})
    assert r["steps"] == 5 and r["trajectories"] == 4
    assert r["step_accuracy"] == pytest.approx(2 / 5)
    # trajectory signs +, -, +, 0 against +, -, -, + -> 2 of 4
    assert r["trajectory_accuracy"] == 0.5
    # won: 0.5, 0; lost: -1/3, 1 -> pairs (0.5>-1/3) (0.5<1) (0>-1/3) (0<1) = 2/4
    assert r["auroc"] == 0.5
    # mean score (0.5 - 1/3 + 1 + 0)/4 = 7/24; mean outcome 0
    assert r["score_gap"] == pytest.approx(7 / 24)
    shuffled = np.random.default_rng(1).permutation(len(cols[0]))
    assert outcome_prediction(*(c[shuffled] for c in cols), {0: 1, 1: -1, 2: -1, 3: 1}) == r  # order-free


def test_nothing_judged_is_nan_not_a_number():
    empty = [np.array([]) for _ in range(4)]
    r = outcome_prediction(*empty, {})
    assert r["trajectories"] == 0 and all(math.isnan(r[k]) for k in ("step_accuracy", "auroc", "score_gap"))


def test_guard_fires_on_a_drifting_rm_and_not_on_a_healthy_one():
    outcomes = {t: (1 if t < 2 else -1) for t in range(8)}  # 2 of 8 trajectories succeed
    healthy = outcome_prediction(*judgments([(t, 0, [outcomes[t]] * 3) for t in range(8)]), outcomes)
    hacked = outcome_prediction(*judgments([(t, 0, [1, 1, 1]) for t in range(8)]), outcomes)  # always pleased
    assert healthy["trajectory_accuracy"] == 1.0 and healthy["score_gap"] == 0.0
    assert hacked["trajectory_accuracy"] == 0.25 and hacked["score_gap"] == 1.5  # 1 - (2 - 6)/8
    assert guard(healthy, 1.0, **LIMITS, fallback=True) == guard(healthy, 1.0, **LIMITS, fallback=False)
    assert not guard(healthy, 1.0, **LIMITS, fallback=True).alarm
    flagged = guard(hacked, 1.0, **LIMITS, fallback=True)
    assert flagged.alarm and flagged.lam == 0.0
    # always +1: every trajectory scores 1, so AUROC is 0.5 (all ties)
    assert flagged.reasons == ("score gap +1.50 > 1.0", "outcome accuracy 0.25 < 0.5", "outcome AUROC 0.50 < 0.6")
    warned = guard(hacked, 1.0, **LIMITS, fallback=False)
    assert warned.alarm and warned.lam == 1.0  # a warning only: λ unchanged
    few = guard({**hacked, "trajectories": 3}, 1.0, **LIMITS, fallback=True)
    assert not few.alarm and few.lam == 1.0


def test_an_rm_at_chance_is_flagged_by_auroc_even_when_accurate():
    # 6 of 8 succeed; 6 of 8 verdicts right: +1 on 5 successes and 1 failure, -1 on 1 success and 1 failure
    outcomes = {t: (1 if t < 6 else -1) for t in range(8)}
    verdict = {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: -1, 6: 1, 7: -1}
    r = outcome_prediction(*judgments([(t, 0, [verdict[t]]) for t in range(8)]), outcomes)
    assert r["trajectory_accuracy"] == 0.75  # looks fine
    # pairs (success, failure): success +1 vs failure +1 tie, vs -1 win; success -1 vs +1 loss, vs -1 tie
    # 5 × (0.5 + 1) + 1 × (0 + 0.5) = 8 of 12
    assert r["auroc"] == pytest.approx(8 / 12)
    decision = guard(r, 1.0, **{**LIMITS, "min_outcome_auroc": 0.7}, fallback=True)
    assert decision.alarm and decision.reasons == ("outcome AUROC 0.67 < 0.7",) and decision.lam == 0.0
    one_class = outcome_prediction(*judgments([(t, 0, [1]) for t in range(8)]), {t: 1 for t in range(8)})
    assert math.isnan(one_class["auroc"]) and not guard(one_class, 1.0, **LIMITS, fallback=True).alarm


def test_process_accuracy_by_hand():
    # step            S_j             verdict   label   right?
    # (0, 0)          +1 +1 -1        +1        +1      yes
    # (0, 1)          -1 -1 -1        -1        +1      no
    # (0, 2)          +1 -1 unparsed  tie       -1      no (a tie predicts nothing)
    # (1, 0)          unparsed x3     none      -1      no (nothing parsed)
    # (1, 1)          -1 unparsed     -1        -1      yes
    # (2, 0)          +1 +1 +1        +1        (none)  not counted: no label
    # (3, 0) labelled but never judged: not counted
    cols = judgments(
        [
            (0, 0, [1, 1, -1]),
            (0, 1, [-1, -1, -1]),
            (0, 2, [1, -1, None]),
            (1, 0, [None, None, None]),
            (1, 1, [-1, None]),
            (2, 0, [1, 1, 1]),
        ]
    )
    labels = {(0, 0): 1, (0, 1): 1, (0, 2): -1, (1, 0): -1, (1, 1): -1, (3, 0): 1}
    assert process_accuracy(*cols, labels) == {"process_accuracy": 2 / 5, "labelled_steps": 5}
    shuffled = np.random.default_rng(2).permutation(len(cols[0]))
    assert process_accuracy(*(c[shuffled] for c in cols), labels) == {"process_accuracy": 2 / 5, "labelled_steps": 5}
    # the labels of the steps the majority got right only: every labelled step right
    assert process_accuracy(*cols, {(0, 0): 1, (1, 1): -1})["process_accuracy"] == 1.0


def test_process_accuracy_without_labels_is_nan_not_a_number():
    cols = judgments([(0, 0, [1, 1]), (0, 1, [-1])])
    for labels in ({}, {(5, 0): 1}):  # no labels at all; labels of steps nobody judged
        r = process_accuracy(*cols, labels)
        assert r["labelled_steps"] == 0 and math.isnan(r["process_accuracy"])
    r = process_accuracy(*[np.array([]) for _ in range(4)], {(0, 0): 1})  # nothing judged
    assert r["labelled_steps"] == 0 and math.isnan(r["process_accuracy"])


def test_process_accuracy_matches_a_loop_over_steps():
    rng = np.random.default_rng(0)
    for _ in range(100):
        rows = [(t, k, [None if rng.random() < 0.2 else int(rng.choice([-1, 1])) for _ in range(3)])
                for t in range(4) for k in range(int(rng.integers(1, 4)))]  # fmt: skip
        labels = {(t, k): int(rng.choice([-1, 1])) for t, k, _ in rows if rng.random() < 0.7}
        right = []
        for t, k, scores in rows:
            parsed = [x for x in scores if x is not None]
            verdict = np.sign(sum(parsed)) if parsed else 0
            if (t, k) in labels:
                right.append(verdict == labels[(t, k)])
        got = process_accuracy(*judgments(rows), labels)
        assert got["labelled_steps"] == len(right)
        assert (math.isnan(got["process_accuracy"]) and not right) or got["process_accuracy"] == np.mean(right)
