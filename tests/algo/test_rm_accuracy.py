"""RM outcome and process accuracy, AUROC (and its bootstrap interval) and the reward-hacking guard,
on hand-computed numbers."""

import itertools
import math

import numpy as np
import pytest

from rlanything.algo.rm_accuracy import (
    MIN_CLASS,
    auroc,
    auroc_interval,
    consistency_target,
    guard,
    outcome_prediction,
    prefix_credit,
    process_accuracy,
    process_auroc,
    progress_auroc,
    rule_order_auroc,
)

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


def two_classes(n_pos: int, n_neg: int, seed: int = 0):
    """Scores of n_pos positives ~ N(1, 1) and n_neg negatives ~ N(0, 1), rounded to thirds (ties,
    as mean step scores have): a true AUROC of about 0.76."""
    rng = np.random.default_rng(seed)
    labels = np.r_[np.ones(n_pos, bool), np.zeros(n_neg, bool)]
    return np.round(rng.normal(labels.astype(float), 1.0) * 3) / 3, labels


def test_perfectly_separated_classes_have_the_interval_one_one():
    # every positive (10..19) above every negative (0..9): every resample's AUROC is 1
    scores, labels = np.arange(20.0), np.arange(20) >= 10
    assert auroc(scores, labels) == 1.0 and auroc_interval(scores, labels) == (1.0, 1.0)
    assert auroc_interval(-scores, labels) == (0.0, 0.0)  # and every negative above: 0


def test_a_class_below_min_class_has_no_interval():
    scores, labels = np.arange(64.0), np.arange(64) == 63  # 1 positive in 64: AUROC 1, no interval
    assert auroc(scores, labels) == 1.0 and all(math.isnan(x) for x in auroc_interval(scores, labels))
    nine = np.arange(20) < MIN_CLASS - 1  # 9 positives, 11 negatives
    assert all(math.isnan(x) for x in auroc_interval(np.arange(20.0), nine))
    assert all(math.isnan(x) for x in auroc_interval(np.arange(20.0), ~nine))  # 9 negatives
    assert not any(math.isnan(x) for x in auroc_interval(np.arange(20.0), nine, min_class=MIN_CLASS - 1))
    assert all(math.isnan(x) for x in auroc_interval(np.array([]), np.array([], dtype=bool), min_class=0))


def test_the_interval_contains_the_auroc_and_narrows_as_episodes_grow():
    small, large = two_classes(20, 20), two_classes(200, 200)
    for scores, labels in (small, large):
        low, high = auroc_interval(scores, labels)
        assert low < auroc(scores, labels) < high
    (low_s, high_s), (low_l, high_l) = auroc_interval(*small), auroc_interval(*large)
    # the width shrinks about as 1/sqrt(n): 10 times the episodes, about a third of the width
    assert 0.2 < (high_l - low_l) / (high_s - low_s) < 0.5
    narrow = auroc_interval(*small, level=0.5)
    assert low_s < narrow[0] < narrow[1] < high_s  # a 50% interval inside the 95% one


def test_the_interval_is_the_percentiles_of_stratified_resamples_and_seeded():
    scores, labels = two_classes(12, 30, seed=3)
    got = auroc_interval(scores, labels, resamples=300, seed=7)
    assert got == auroc_interval(scores, labels, resamples=300, seed=7)  # deterministic for a seed
    assert got != auroc_interval(scores, labels, resamples=300, seed=8)
    shuffled = np.random.default_rng(4).permutation(len(scores))
    assert auroc_interval(scores[shuffled], labels[shuffled], resamples=300, seed=7) == got  # order-free
    # the same draws, one resample at a time: each class sorted, drawn with replacement at its own
    # size, 256 resamples per batch (positives, then negatives)
    pos, neg = np.sort(scores[labels]), np.sort(scores[~labels])
    rng, aurocs = np.random.default_rng(7), []
    for size in (256, 44):
        p, q = rng.integers(0, len(pos), (size, len(pos))), rng.integers(0, len(neg), (size, len(neg)))
        both = np.r_[np.ones(len(pos), bool), np.zeros(len(neg), bool)]
        aurocs += [auroc(np.r_[pos[p[b]], neg[q[b]]], both) for b in range(size)]
    assert got == pytest.approx(tuple(np.quantile(aurocs, [0.025, 0.975])))


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
    assert r["positives"] == 2 and r["negatives"] == 2  # too few for an interval
    assert math.isnan(r["auroc_low"]) and math.isnan(r["auroc_high"])
    shuffled = np.random.default_rng(1).permutation(len(cols[0]))
    assert outcome_prediction(*(c[shuffled] for c in cols), {0: 1, 1: -1, 2: -1, 3: 1}) == r  # order-free


def test_nothing_judged_is_nan_not_a_number():
    empty = [np.array([]) for _ in range(4)]
    r = outcome_prediction(*empty, {})
    assert r["trajectories"] == r["positives"] == r["negatives"] == 0
    assert all(math.isnan(r[k]) for k in ("step_accuracy", "auroc", "auroc_low", "auroc_high", "score_gap"))


def test_outcome_prediction_gives_the_interval_of_the_trajectory_scores():
    # 12 won, 10 lost trajectories, one step each; won t scores +1 when t % 3, lost ones +1 when t % 4 == 0
    outcomes = {t: (1 if t < 12 else -1) for t in range(22)}
    verdict = {t: (1 if (t % 3 if t < 12 else t % 4 == 0) else -1) for t in range(22)}
    r = outcome_prediction(*judgments([(t, 0, [verdict[t]]) for t in range(22)]), outcomes)
    assert r["positives"] == 12 and r["negatives"] == 10 and r["trajectories"] == 22
    scores = np.array([verdict[t] for t in range(22)], dtype=float)
    assert (r["auroc_low"], r["auroc_high"]) == auroc_interval(scores, np.arange(22) < 12)
    # pairs (won, lost): 8 × 7 (+1 > -1) wins, 8 × 3 and 4 × 7 ties: (56 + 26) / 120
    assert r["auroc"] == pytest.approx(82 / 120) and r["auroc_low"] < r["auroc"] < r["auroc_high"]


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


def test_consistency_target_is_the_outcome_gap_between_good_and_bad_steps():
    """The outcome's AUROC against the labels is 1/2 + (P(won | good) − P(won | bad)) / 2, and
    the per-rule counts are the steps and their won ones; labels drawn independently of the
    outcome give a gap near zero."""
    rng = np.random.default_rng(0)
    rule = rng.choice(["closer", "unchanged", "invalid", "farther"], size=400)
    label = np.where(np.isin(rule, ["closer", "unchanged"]), 1, -1)
    outcome = np.where(rng.random(400) < np.where(rule == "closer", 0.9, 0.2), 1, -1)
    r = consistency_target(outcome, label, rule)
    assert r["auroc"] == pytest.approx(0.5 + (r["won_good"] - r["won_bad"]) / 2)
    assert r["auroc_low"] < r["auroc"] < r["auroc_high"]
    for name, (won, n) in r["by_rule"].items():
        assert (won, n) == ((outcome[rule == name] > 0).sum(), (rule == name).sum())
    blind = consistency_target(rng.choice([-1, 1], size=400), label, rule)
    assert abs(blind["auroc"] - 0.5) < 0.07 and blind["auroc_low"] < 0.5 < blind["auroc_high"]


def test_rule_order_auroc_counts_pairs_by_rule_and_widens_with_few_steps_per_rule():
    """Hand-counted: shares closer 0.9 > unchanged 0.5 = farther 0.5 > invalid 0.1; good steps 3
    closer and 1 unchanged, bad 2 farther and 2 invalid. Of the 16 (good, bad) pairs, closer wins
    all 12, unchanged beats the 2 invalid and ties the 2 farther -> (12 + 2 + 1) / 16. A rule the
    shares lack scores the overall share. The interval holds the point and narrows as every
    rule's share rests on more steps."""
    rule = np.array(["closer"] * 3 + ["unchanged", "farther", "farther", "invalid", "invalid"])
    label = np.array([1, 1, 1, 1, -1, -1, -1, -1])
    few = {"closer": (9, 10), "unchanged": (5, 10), "farther": (5, 10), "invalid": (1, 10)}
    assert rule_order_auroc(few, label, rule)["auroc"] == pytest.approx(15 / 16)
    assert math.isnan(rule_order_auroc(few, label, rule)["auroc_low"])  # fewer than MIN_CLASS per label
    many_rule, many_label = np.repeat(rule, 10), np.repeat(label, 10)
    wide = rule_order_auroc(few, many_label, many_rule)
    narrow = rule_order_auroc({k: (100 * w, 100 * n) for k, (w, n) in few.items()}, many_label, many_rule)
    assert wide["auroc_low"] <= 15 / 16 <= wide["auroc_high"]
    assert narrow["auroc_high"] - narrow["auroc_low"] < wide["auroc_high"] - wide["auroc_low"]
    unseen = rule_order_auroc({"closer": (1, 1), "invalid": (0, 1)}, np.array([1, -1]), np.array(["look", "invalid"]))
    assert unseen["unknown"] == 1 and unseen["auroc"] == 1.0  # "look" scores the overall 1/2 > 0


def test_prefix_credit_goes_to_the_step_where_a_group_parts_ways_whatever_the_row_order():
    # group a, three episodes of one game: X wins after (open box, take key), Y loses after
    # (open box, eat key), Z loses after (xyzzy).
    # V() = -1/3, V(open box) = 0, V(xyzzy) = -1, V(open box, take key) = 1, V(open box, eat key) = -1.
    # group b: one episode alone: nothing to part from, every credit 0
    group = np.array(["a"] * 5 + ["b"] * 2)
    traj = np.array([0, 0, 1, 1, 2, 0, 0])  # trajectory ids repeat across groups on purpose
    step = np.array([0, 1, 0, 1, 0, 0, 1])
    action = np.array(["open box", "take key", "open box", "eat key", "xyzzy", "look", "go east"])
    outcome = np.array([1, 1, -1, -1, -1, 1, 1])
    expected = np.array([1 / 3, 1.0, 1 / 3, -1.0, -2 / 3, 0.0, 0.0])
    np.testing.assert_allclose(prefix_credit(group, traj, step, action, outcome), expected)
    order = np.random.default_rng(0).permutation(len(group))
    shuffled = prefix_credit(group[order], traj[order], step[order], action[order], outcome[order])
    np.testing.assert_allclose(shuffled, expected[order])


def test_progress_auroc_leaves_no_ops_out_and_counts_a_lost_game_as_a_setback():
    # Steps (m = 2): closer (+1, +1) mean +1; lost (+1, -1) mean 0; unchanged (+1, +1) apart; invalid,
    # nothing parsed: mean 0. Good {+1} against bad {0, 0}: both pairs right -> 1. Counting the
    # no-op as good (process_auroc with ±1 labels) the same judge gets good {+1, +1} bad {0, 0}: 1 too;
    # a no-op judged -1 lowers the old figure (good {+1, -1} -> 2 of 4 pairs right: 0.5) but not this one.
    traj = np.array(["a"] * 8)
    step = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    parsed = np.array([True] * 6 + [False, False])
    rules = {("a", 0): "closer", ("a", 1): "lost", ("a", 2): "unchanged", ("a", 3): "invalid"}
    labels = {key: 1 if rule in ("closer", "unchanged") else -1 for key, rule in rules.items()}
    likes_no_ops = np.array([1, 1, 1, -1, 1, 1, 0, 0])
    dislikes_no_ops = np.array([1, 1, 1, -1, -1, -1, 0, 0])
    for scores in (likes_no_ops, dislikes_no_ops):
        r = progress_auroc(traj, step, scores, parsed, rules)
        assert (r["auroc"], r["good"], r["bad"], r["neutral"], r["other"]) == (1.0, 1, 2, 1, 0)
    assert progress_auroc(traj, step, dislikes_no_ops, parsed, rules)["neutral_mean"] == -1.0
    assert process_auroc(traj, step, likes_no_ops, parsed, labels)["auroc"] == 1.0
    assert process_auroc(traj, step, dislikes_no_ops, parsed, labels)["auroc"] == 0.5
