r"""How well the reward model's judgments predict outcomes, and the reward-hacking guard.

The method trains the RM by consistency with outcomes (R·S_j), and the policy by
R = O + λ·mean_j S. If the RM drifts (calls steps good while the episodes fail) the policy
is paid for pleasing the RM: reward hacking. We watch it per iteration with three numbers, from
the iteration's parsed judgments (one row per judgment: trajectory, step, S in {-1, +1}) and
the trajectories' outcomes O in {-1, +1}:

- **step outcome accuracy**: the fraction of judged steps whose majority verdict (the sign of the
  mean of its parsed S) equals its trajectory's outcome. A tie, or a step with no parsed
  judgment, predicts nothing and counts as wrong: an RM that abstains is not accurate.
- **trajectory outcome accuracy**: the same for the sign of a trajectory's mean step score
  (the mean over its judged steps of each step's mean S; the λ-term of R up to λ).
- **AUROC** of the trajectory mean step score for O = +1: the probability that a random
  successful trajectory scores above a random failed one (ties count one half). NaN when only
  one outcome occurs: no ranking to judge, never a made-up 0.5. With it a 95% interval
  (`auroc_interval`, a stratified bootstrap), NaN where either outcome has fewer than `MIN_CLASS`
  judged trajectories: too few to decide.
- **score gap**: mean trajectory step score − mean outcome, in [−2, 2]. Positive: the RM is
  more pleased than the verifier; hacking shows as a large positive gap.

A fourth number needs ground truth per step, which only some environments know (see
`envs.base.step_labels`): **process accuracy**, the fraction of labelled judged steps whose
majority verdict (as above: tie or nothing parsed = wrong) equals the step's label in {-1, +1}.
Outcome accuracy asks whether the RM's verdicts track the episode's end; process accuracy
whether they track each step's own merit (a good step in a failed episode should still be +1).

`guard` turns them into the alarm of `algo.rm_guard`: the RM is flagged when the gap exceeds
`max_score_gap`, the trajectory outcome accuracy falls below `min_outcome_accuracy`, or the
AUROC (where defined) below `min_outcome_auroc`, decided only from at least `min_trajectories`
judged trajectories. Accuracy alone misses an RM at chance when most episodes succeed (calling
every step good is then "accurate"); AUROC does not depend on the success rate. Departure from the paper: the paper
has no guard; it is ours, off the policy's reward unless `fallback` is set, in which case a
flagged iteration uses R = O (λ = 0) for the policy and for the RM's consistency reward, the
next healthy one λ again.

Pure numpy; nothing of ours is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlanything.algo.mc_progress import progress_targets, sibling_values


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of `scores` for `labels` (True = positive), ties counted one half
    (the Mann–Whitney U over n_pos · n_neg); NaN unless both classes occur.

    scores (N,) float, labels (N,) bool -> float

    >>> auroc(np.array([0.9, 0.1, 0.5, 0.5]), np.array([True, False, True, False]))
    0.875
    >>> auroc(np.array([1.0, 2.0]), np.array([True, True]))
    nan
    """
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    pos, neg = scores[labels], scores[~labels]
    if not len(pos) or not len(neg):
        return math.nan
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


MIN_CLASS = 10
"""`auroc_interval` gives no interval (NaN) when either class has fewer members than this."""


def auroc_interval(
    scores: np.ndarray,
    labels: np.ndarray,
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    min_class: int = MIN_CLASS,
) -> tuple[float, float]:
    """A `level` interval of `auroc(scores, labels)`: the stratified bootstrap percentile interval.

    scores (N,) float, labels (N,) bool -> (low, high); (NaN, NaN) when either class has fewer than
    `min_class` members.

    Each of `resamples` resamples draws the positives with replacement, as many as there are, and
    the negatives likewise (a numpy Generator seeded with `seed`); low and high are the
    (1 − level)/2 and (1 + level)/2 quantiles of the resamples' AUROCs. Stratified: a plain
    bootstrap of all N can draw a resample without a positive (AUROC undefined) and lets the
    class sizes vary, which the AUROC, conditional on them, does not. The rule of `min_class`: with
    one positive in 64 every resample repeats that one score, so the interval only reflects the
    spread of the negatives around it and is misleadingly narrow; a handful per class is not much
    better. Each class is sorted before drawing, so the interval does not depend on the input order.

    Worked example: 20 positives scoring 9, 11, …, 47 and 20 negatives 0, 2, …, 38: positive i
    (2i + 9) outranks min(i + 5, 20) negatives, 280 of the 400 pairs (no ties): AUROC 0.7, and an
    interval around it. Perfectly separated classes give (1, 1): every resample ranks every positive
    above every negative. One positive in 64 gives no interval.

    >>> pos, neg = 2.0 * np.arange(20) + 9, 2.0 * np.arange(20)
    >>> scores, labels = np.r_[pos, neg], np.r_[np.ones(20, bool), np.zeros(20, bool)]
    >>> auroc(scores, labels)
    0.7
    >>> [round(x, 2) for x in auroc_interval(scores, labels)]
    [0.53, 0.85]
    >>> auroc_interval(np.r_[pos + 40, neg], labels)
    (1.0, 1.0)
    >>> auroc_interval(np.arange(64.0), np.arange(64) == 63)
    (nan, nan)
    """
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    values = np.unique(scores)  # scores as indices into their sorted distinct values: ties stay ties
    pos, neg = (np.sort(np.searchsorted(values, scores[side])) for side in (labels, ~labels))
    if min(len(pos), len(neg)) < max(min_class, 1):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    aurocs = np.empty(resamples)
    for start in range(0, resamples, 256):  # 256 resamples at a time: memory O(256 · N)
        size = min(256, resamples - start)
        pos_counts, neg_counts = (_draw_counts(rng, side, size, len(values)) for side in (pos, neg))
        below = np.cumsum(neg_counts, axis=1) - neg_counts  # negatives drawn below each value
        wins = (pos_counts * (below + 0.5 * neg_counts)).sum(axis=1)  # Mann–Whitney U, ties one half
        aurocs[start : start + size] = wins / (len(pos) * len(neg))
    low, high = np.quantile(aurocs, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def _draw_counts(rng: np.random.Generator, value_idx: np.ndarray, resamples: int, k: int) -> np.ndarray:
    """(resamples, k): how often each of the k values is drawn in each resample of `value_idx`
    (indices into the values) with replacement, len(value_idx) draws per resample."""
    n = len(value_idx)
    drawn = value_idx[rng.integers(0, n, size=(resamples, n))] + k * np.arange(resamples)[:, None]
    return np.bincount(drawn.ravel(), minlength=resamples * k).reshape(resamples, k)


def _step_means(traj_id, step_idx, step_score, parsed) -> dict[tuple, float]:
    """(traj_id, step_idx) -> mean of the step's parsed S, 0 when none parsed (a tie: no verdict)."""
    keys = list(zip(np.asarray(traj_id).tolist(), np.asarray(step_idx).tolist()))
    scores, parsed = np.asarray(step_score, dtype=float), np.asarray(parsed, dtype=bool)
    steps: dict[tuple, list[float]] = {}
    for key, score, ok in zip(keys, scores, parsed):
        steps.setdefault(key, [])
        if ok:
            steps[key].append(score)
    return {key: (float(np.mean(s)) if s else 0.0) for key, s in steps.items()}


def outcome_prediction(
    traj_id: np.ndarray, step_idx: np.ndarray, step_score: np.ndarray, parsed: np.ndarray, outcome: dict
) -> dict[str, float]:
    """Step and trajectory outcome accuracy, AUROC (with its 95% interval) and score gap of one
    iteration's judgments.

    traj_id, step_idx, step_score, parsed: (J,) per judgment (step_score in {-1, 0, +1}, used only
    where parsed); outcome: traj_id -> O in {-1, +1} for every judged trajectory.
    -> {"step_accuracy", "trajectory_accuracy", "auroc", "auroc_low", "auroc_high", "score_gap",
    "steps", "trajectories", "positives", "negatives"}: auroc_low/high from `auroc_interval`
    (defaults: 2000 resamples, seed 0; NaN below `MIN_CLASS` per class), positives/negatives the
    judged trajectories with O = +1 / −1 (NaN rates when nothing was judged).

    Worked example: trajectory a (O = +1) has steps 0 (S = +1, +1, −1) and 1 (S = −1, −1, +1);
    trajectory b (O = −1) one step (S = −1, unparsed, −1). Step means +1/3, −1/3, −1: the majority
    verdicts +1, −1, −1 against outcomes +1, +1, −1 → step accuracy 2/3. Trajectory means 0 (a tie:
    wrong) and −1 (right) → 1/2; AUROC 1 (0 > −1); gap mean(0, −1) − mean(+1, −1) = −0.5. One
    trajectory per outcome: too few for an interval.

    >>> r = outcome_prediction(np.array(["a"] * 6 + ["b"] * 3), np.array([0, 0, 0, 1, 1, 1, 0, 0, 0]),
    ...     np.array([1, 1, -1, -1, -1, 1, -1, 0, -1]), np.array([True] * 7 + [False, True]), {"a": 1, "b": -1})
    >>> [round(r[k], 4) for k in ("step_accuracy", "trajectory_accuracy", "auroc", "score_gap")]
    [0.6667, 0.5, 1.0, -0.5]
    >>> r["auroc_low"], r["auroc_high"], r["positives"], r["negatives"]
    (nan, nan, 1, 1)
    """
    step_mean = _step_means(traj_id, step_idx, step_score, parsed)
    step_right = [np.sign(mean) == outcome[key[0]] for key, mean in step_mean.items()]
    trajectories: dict = {}
    for (traj, _), mean in step_mean.items():
        trajectories.setdefault(traj, []).append(mean)
    traj_ids = list(trajectories)
    traj_score = np.array([np.mean(trajectories[t]) for t in traj_ids])
    traj_outcome = np.array([outcome[t] for t in traj_ids], dtype=float)
    if not traj_ids:
        nan = math.nan
        rates = dict(step_accuracy=nan, trajectory_accuracy=nan, auroc=nan, auroc_low=nan, auroc_high=nan)
        return rates | dict(score_gap=nan, steps=0, trajectories=0, positives=0, negatives=0)
    low, high = auroc_interval(traj_score, traj_outcome > 0)
    return {
        "step_accuracy": float(np.mean(step_right)),
        "trajectory_accuracy": float(np.mean(np.sign(traj_score) == traj_outcome)),
        "auroc": auroc(traj_score, traj_outcome > 0),
        "auroc_low": low,
        "auroc_high": high,
        "score_gap": float(traj_score.mean() - traj_outcome.mean()),
        "steps": len(step_mean),
        "trajectories": len(traj_ids),
        "positives": int((traj_outcome > 0).sum()),
        "negatives": int((traj_outcome < 0).sum()),
    }


def process_accuracy(
    traj_id: np.ndarray, step_idx: np.ndarray, step_score: np.ndarray, parsed: np.ndarray, labels: dict
) -> dict[str, float]:
    """Agreement of each labelled judged step's majority verdict with its ground-truth label.

    traj_id, step_idx, step_score, parsed: (J,) per judgment, as in `outcome_prediction`;
    labels: (traj_id, step_idx) -> label in {-1, +1}, for the steps the environment labelled.
    -> {"process_accuracy", "labelled_steps"}: the fraction of judged steps with a label whose
    majority verdict (sign of the mean parsed S; a tie or nothing parsed is wrong) equals it, and
    how many there were; NaN accuracy when no judged step has a label (never a made-up number).

    Worked example: step (a, 0) S = +1, +1, −1 (verdict +1) labelled +1: right; (a, 1) S = +1, −1
    (a tie) labelled −1: wrong; (a, 2) nothing parsed, labelled −1: wrong; (b, 0) S = −1 labelled
    −1: right; (b, 1) S = +1 has no label: not counted. → 2 of 4 labelled steps.

    >>> process_accuracy(np.array(["a"] * 7 + ["b", "b"]), np.array([0, 0, 0, 1, 1, 2, 2, 0, 1]),
    ...     np.array([1, 1, -1, 1, -1, 0, 0, -1, 1]), np.array([True] * 5 + [False, False, True, True]),
    ...     {("a", 0): 1, ("a", 1): -1, ("a", 2): -1, ("b", 0): -1, ("c", 0): 1})
    {'process_accuracy': 0.5, 'labelled_steps': 4}
    """
    step_mean = _step_means(traj_id, step_idx, step_score, parsed)
    right = [np.sign(mean) == labels[key] for key, mean in step_mean.items() if key in labels]
    return {"process_accuracy": float(np.mean(right)) if right else math.nan, "labelled_steps": len(right)}


def process_auroc(
    traj_id: np.ndarray, step_idx: np.ndarray, step_score: np.ndarray, parsed: np.ndarray, labels: dict
) -> dict[str, float]:
    """How well each labelled judged step's mean verdict ranks good steps above bad ones.

    Inputs as `process_accuracy`. -> {"auroc", "auroc_low", "auroc_high", "good", "bad"}: the
    AUROC of the step's mean parsed S (0 when nothing parsed) for label +1, its 95% interval
    (`auroc_interval`: NaN below `MIN_CLASS` steps per label), and how many labelled judged steps
    were good (+1) and bad (−1). Unlike process accuracy it does not charge an RM for saying +1
    more often than the labels do: it asks only whether the good steps get the higher verdicts.

    Worked example: good steps scoring +1, +1/3 and bad steps −1, +1/3: of the 4 (good, bad)
    pairs 3 are ranked right and one is a tie (1/2) -> 3.5 / 4.

    >>> r = process_auroc(np.array(["a"] * 4 + ["b"] * 6), np.array([0, 1, 2, 3, 0, 0, 0, 1, 1, 1]),
    ...     np.array([1, -1, 0, 0, 1, 1, -1, 1, 1, -1]), np.array([True] * 10),
    ...     {("a", 0): 1, ("a", 1): -1, ("b", 0): 1, ("b", 1): -1})
    >>> r["auroc"], r["good"], r["bad"], r["auroc_low"]
    (0.875, 2, 2, nan)
    """
    step_mean = _step_means(traj_id, step_idx, step_score, parsed)
    pairs = [(mean, labels[key] > 0) for key, mean in step_mean.items() if key in labels]
    scores = np.array([score for score, _ in pairs], dtype=float)
    good = np.array([label for _, label in pairs], dtype=bool)
    low, high = auroc_interval(scores, good)
    return {
        "auroc": auroc(scores, good),
        "auroc_low": low,
        "auroc_high": high,
        "good": int(good.sum()),
        "bad": int((~good).sum()),
    }


PROGRESS_RULES = ("closer",)
"""Label rules of a step that moved the game towards its win (TextWorld: the quest tracker's
remaining plan shrank)."""
SETBACK_RULES = ("farther", "invalid", "lost")
"""Label rules of a step that moved it away: a longer plan, no admissible command, the game lost."""
NEUTRAL_RULES = ("unchanged",)
"""An admissible no-op (look, examine): whether it is good is not clear-cut, so `progress_auroc`
leaves it out of the ranking and reports it apart."""


def progress_auroc(
    traj_id: np.ndarray, step_idx: np.ndarray, step_score: np.ndarray, parsed: np.ndarray, rules: dict
) -> dict[str, float]:
    """How well the judge ranks progress steps above setbacks: `process_auroc` with the label read
    from each step's rule (+1 `PROGRESS_RULES`, −1 `SETBACK_RULES`), the neutral steps
    (`NEUTRAL_RULES`) left out of the ranking and reported apart.

    Inputs as `process_accuracy`, but `rules`: (traj_id, step_idx) -> the label's rule (a rule in
    none of the three lists is left out, and counted). -> {"auroc", "auroc_low", "auroc_high",
    "good" (progress steps judged), "bad" (setbacks judged), "neutral" (neutral steps judged),
    "neutral_mean" (their mean verdict, NaN when none), "other" (judged steps of another rule)}.
    Why: the environment's ±1 labels count a no-op as good, so the old process AUROC could rise
    with a judge that likes looking around; this one asks only about steps that changed the game.

    Worked example: closer steps scoring +1 and 0, setbacks (farther, invalid) −1 and 0, an
    unchanged step +1 (apart) and a step of an unknown rule (other): of the 4 (good, bad) pairs 3
    are ranked right and one is a tie -> 3.5 / 4.

    >>> r = progress_auroc(np.array(["a"] * 6), np.arange(6), np.array([1, 0, -1, 0, 1, 1]), np.array([True] * 6),
    ...     {("a", 0): "closer", ("a", 1): "closer", ("a", 2): "farther", ("a", 3): "invalid",
    ...      ("a", 4): "unchanged", ("a", 5): "teleported"})
    >>> r["auroc"], r["good"], r["bad"], r["neutral"], r["neutral_mean"], r["other"]
    (0.875, 2, 2, 1, 1.0, 1)
    """
    step_mean = _step_means(traj_id, step_idx, step_score, parsed)
    judged = {key: rules[key] for key in step_mean if key in rules}
    ranked = {key: rule in PROGRESS_RULES for key, rule in judged.items() if rule in PROGRESS_RULES + SETBACK_RULES}
    scores = np.array([step_mean[key] for key in ranked], dtype=float)
    good = np.array(list(ranked.values()), dtype=bool)
    low, high = auroc_interval(scores, good)
    neutral = [step_mean[key] for key, rule in judged.items() if rule in NEUTRAL_RULES]
    return {
        "auroc": auroc(scores, good),
        "auroc_low": low,
        "auroc_high": high,
        "good": int(good.sum()),
        "bad": int((~good).sum()),
        "neutral": len(neutral),
        "neutral_mean": float(np.mean(neutral)) if neutral else math.nan,
        "other": len(judged) - len(ranked) - len(neutral),
    }


def verdict_shares(step_score: np.ndarray, parsed: np.ndarray, groups: np.ndarray) -> dict[str, tuple[float, int]]:
    """group -> (the share of its parsed judgments that say +1, how many parsed there are).

    step_score, parsed, groups: (J,) per judgment; a group is any label of the judged step (its
    episode's outcome, its step label). Where a judge says one verdict to everything, every group's
    share is the same 0 or 1: the collapse the RM's reward cannot undo (a step whose m verdicts
    agree has no RM advantage).

    >>> verdict_shares(np.array([1, 1, -1, 0, -1]), np.array([True, True, True, False, True]),
    ...     np.array(["won", "won", "lost", "lost", "lost"]))
    {'lost': (0.0, 2), 'won': (1.0, 2)}
    """
    scores, ok, groups = np.asarray(step_score), np.asarray(parsed, dtype=bool), np.asarray(groups)
    out = {}
    for group in sorted(set(groups[ok].tolist())):
        mine = scores[ok & (groups == group)]
        out[group] = (float(np.mean(mine > 0)), len(mine))
    return out


def consistency_target(outcome: np.ndarray, label: np.ndarray, rule: np.ndarray) -> dict:
    """What the paper's RM reward teaches about the steps, read from labelled steps alone.

    outcome (N,) ±1: the outcome of each labelled step's episode; label (N,) ±1: the step's
    ground-truth label; rule (N,) str: which case of the environment's rule labelled it
    (closer, unchanged, invalid...). -> {"by_rule": {rule: (its steps in won episodes, its
    steps)}, "won_good", "won_bad" (the share of the good and of the bad steps that are in won
    episodes), "auroc", "auroc_low", "auroc_high"}.

    With λ = 0 judgment j of a step earns O·S_j, z-scored over the step's m judgments: whatever
    the step, the push is towards the verdict S = O. Summed over the steps a judge cannot tell
    apart, a class of steps is pushed towards +1 in proportion to 2·P(won | class) − 1
    (`algo.rm_balance` reweights the outcomes, which moves the zero point, not the order). So the
    reward carries information about the labels only as far as good and bad steps differ in how
    often their episodes are won. `auroc` measures that difference on the labels' scale: the
    AUROC of the episode's outcome as a step's score, which is 1/2 + (won_good − won_bad)/2; it
    is what a judge that knew every episode's outcome, the verdict the reward pays for, would
    score against the labels. Near 1/2 the reward asks the judge for the outcome and nothing that
    tells a good step from a bad one.

    Worked example: closer steps of two won episodes; unchanged steps of a lost and a won one;
    invalid steps of two lost and one won. Good steps are in won episodes 3 of 4 times, bad ones
    1 of 3: AUROC 1/2 + (3/4 − 1/3)/2 = 0.7083 (of the 12 (good, bad) pairs 6 ranked right, 5 ties).

    >>> r = consistency_target(np.array([1, 1, -1, 1, -1, -1, 1]), np.array([1, 1, 1, 1, -1, -1, -1]),
    ...     np.array(["closer"] * 2 + ["unchanged"] * 2 + ["invalid"] * 3))
    >>> round(r["auroc"], 4), r["won_good"], r["by_rule"]
    (0.7083, 0.75, {'closer': (2, 2), 'invalid': (1, 3), 'unchanged': (1, 2)})
    """
    won, good, rule = np.asarray(outcome) > 0, np.asarray(label) > 0, np.asarray(rule)
    by_rule = {name: (int(won[rule == name].sum()), int((rule == name).sum())) for name in sorted(set(rule.tolist()))}
    low, high = auroc_interval(won.astype(float), good)
    return {
        "by_rule": by_rule,
        "won_good": float(won[good].mean()) if good.any() else math.nan,
        "won_bad": float(won[~good].mean()) if (~good).any() else math.nan,
        "auroc": auroc(won.astype(float), good),
        "auroc_low": low,
        "auroc_high": high,
    }


def prefix_credit(group: np.ndarray, traj: np.ndarray, step: np.ndarray, action: np.ndarray, outcome: np.ndarray):
    """A step's Monte-Carlo credit from its group's episodes: how much taking its action moved the
    share of won episodes among those that reached the same point. Not the paper's reward; a
    candidate step target measured against the labels (`benchmarks/rm_reward_target.py`).

    group, traj, step (N,): the episode's task group (episodes of one group start from one game),
    the episode and the step's index; action (N,) str; outcome (N,) ±1, the episode's. -> (N,)
    float: V(a_0..a_t) − V(a_0..a_t−1), where V(prefix) is the mean outcome of the group's episodes
    whose first actions are that prefix. It assumes the game is deterministic, so that one prefix
    is one state. A step after which the episodes it stands for no longer part ways gets 0: the
    credit goes to the steps where a group's actions differ.

    Worked example: one group, episodes A: (go east) +1; B: (go east) +1; C: (look, go east) +1;
    D: (xyzzy, xyzzy) −1. V() = 0.5, V(go east) = V(look) = V(look, go east) = 1, V(xyzzy) = −1:
    credits A0 = B0 = C0 = 0.5, C1 = 0, D0 = −1.5, D1 = 0.

    >>> prefix_credit(np.zeros(6), np.array([0, 1, 2, 2, 3, 3]), np.array([0, 0, 0, 1, 0, 1]),
    ...     np.array(["go east", "go east", "look", "go east", "xyzzy", "xyzzy"]), np.array([1, 1, 1, 1, -1, -1]))
    array([ 0.5,  0.5,  0.5,  0. , -1.5,  0. ])
    """
    group, traj, step = np.asarray(group), np.asarray(traj), np.asarray(step)
    action, outcome = np.asarray(action), np.asarray(outcome, dtype=float)
    episode = {key: i for i, key in enumerate(dict.fromkeys(zip(group.tolist(), traj.tolist())))}
    index = np.array([episode[g, t] for g, t in zip(group.tolist(), traj.tolist())], dtype=int)
    histories: dict[int, list] = {}  # the episode's group, then its actions in step order
    outcomes: dict[int, float] = {}
    for i in np.lexsort((step, traj, group)):
        histories.setdefault(int(index[i]), [group[i]]).append(action[i])
        outcomes[int(index[i])] = float(outcome[i])
    ends = {e: (len(h) - 1, outcomes[e]) for e, h in histories.items()}
    return progress_targets(index, step, sibling_values(histories, outcomes), ends)


def rule_order_auroc(
    by_rule: dict, label: np.ndarray, rule: np.ndarray, *, resamples: int = 2000, seed: int = 0
) -> dict:
    """The AUROC against the labels of a judge that ranks each step by its rule's share of steps
    in won episodes: `by_rule` as `consistency_target` gives it, possibly from other episodes (a
    run's training rollouts, then scored on held-out steps). -> {"auroc", "auroc_low",
    "auroc_high", "unknown"}: a step whose rule `by_rule` lacks scores the overall share
    ("unknown" counts them). The 95% interval redraws both what is uncertain: each rule's share
    (its won count binomial around the measured share) and the scored steps (multinomial over
    their (rule, label) counts); NaN where either label has fewer than `MIN_CLASS` steps.

    Summed over a rule's steps the reward pushes the verdict towards +1 in proportion to
    2·P(won | rule) − 1 (`consistency_target`). A judge that learns to tell the rules apart and
    follows those pushes orders the rules by that share; with `algo.rm_balance` its verdicts
    settle at +1 for the rules whose share lies above the judged steps' overall share, without it
    above one half. So this AUROC is the most the reward can teach a judge that tells the rules
    apart; where two rules' shares are close the interval says the order is uncertain.
    Distinctions within a rule are not measured.

    Worked example: shares closer 2/2, unchanged 1/2, invalid 1/3 (`consistency_target`'s);
    good steps of rules unchanged and closer, two bad invalid ones: every good step above every
    bad one -> 1.0. Two rules with the same share tie -> 0.5.

    >>> shares = {"closer": (2, 2), "invalid": (1, 3), "unchanged": (1, 2)}
    >>> rule_order_auroc(shares, np.array([1, 1, -1, -1]), np.array(["unchanged", "closer", "invalid", "invalid"]))["auroc"]
    1.0
    >>> rule_order_auroc({"a": (1, 2), "b": (2, 4)}, np.array([1, -1]), np.array(["a", "b"]))["auroc"]
    0.5
    """
    good, rule = np.asarray(label) > 0, np.asarray(rule)
    names = sorted(by_rule)
    won = np.array([by_rule[n][0] for n in names], dtype=float)
    seen = np.array([by_rule[n][1] for n in names], dtype=float)
    overall = won.sum() / max(1.0, seen.sum())
    cells = sorted(set(zip(rule.tolist(), good.tolist())))  # (rule, good) with their step counts
    counts = np.array([np.sum((rule == r) & (good == g)) for r, g in cells], dtype=float)
    where = np.array([names.index(r) if r in by_rule else -1 for r, _ in cells])
    cell_good = np.array([g for _, g in cells], dtype=bool)

    def ranked(shares: np.ndarray, n: np.ndarray) -> float:
        score = np.where(where >= 0, shares[np.maximum(where, 0)], overall)
        pos, neg = n * cell_good, n * ~cell_good
        if not pos.sum() or not neg.sum():
            return math.nan
        order = np.sign(score[:, None] - score[None, :])  # +1 where a cell outranks another
        pairs = pos[:, None] * neg[None, :]
        return float((pairs * (order > 0) + 0.5 * pairs * (order == 0)).sum() / (pos.sum() * neg.sum()))

    shares = np.divide(won, seen, out=np.full_like(won, overall), where=seen > 0)
    point, low, high = ranked(shares, counts), math.nan, math.nan
    if min(counts[cell_good].sum(), counts[~cell_good].sum()) >= MIN_CLASS:
        rng = np.random.default_rng(seed)
        draws = []
        for _ in range(resamples):
            drawn = np.divide(rng.binomial(seen.astype(int), shares), seen, out=shares.copy(), where=seen > 0)
            draws.append(ranked(drawn, rng.multinomial(int(counts.sum()), counts / counts.sum()).astype(float)))
        low, high = (float(x) for x in np.nanpercentile(draws, [2.5, 97.5]))
    unknown = int(counts[where < 0].sum())
    return {"auroc": point, "auroc_low": low, "auroc_high": high, "unknown": unknown}


@dataclass(frozen=True)
class GuardDecision:
    alarm: bool
    """The RM was flagged this iteration."""
    lam: float
    """λ the policy's reward uses this iteration (0 when flagged and falling back)."""
    reasons: tuple[str, ...]
    """Why it was flagged (empty when not)."""


def guard(
    prediction: dict[str, float],
    lam: float,
    *,
    max_score_gap: float,
    min_outcome_accuracy: float,
    min_outcome_auroc: float,
    min_trajectories: int,
    fallback: bool,
) -> GuardDecision:
    """The reward-hacking alarm of one iteration from `outcome_prediction`'s numbers.

    >>> limits = dict(max_score_gap=1.0, min_outcome_accuracy=0.5, min_outcome_auroc=0.6, min_trajectories=8)
    >>> healthy = {"score_gap": 0.2, "trajectory_accuracy": 0.8, "auroc": 0.9, "trajectories": 16}
    >>> guard(healthy, 1.0, **limits, fallback=True)
    GuardDecision(alarm=False, lam=1.0, reasons=())
    >>> drift = {"score_gap": 1.5, "trajectory_accuracy": 0.25, "auroc": 0.5, "trajectories": 16}
    >>> d = guard(drift, 1.0, **limits, fallback=True)
    >>> d.alarm, d.lam, len(d.reasons)
    (True, 0.0, 3)
    >>> guard(drift | {"trajectories": 4}, 1.0, **limits, fallback=True).alarm  # too few to decide
    False
    """
    reasons = []
    if prediction["trajectories"] >= min_trajectories:
        if prediction["score_gap"] > max_score_gap:
            reasons.append(f"score gap {prediction['score_gap']:+.2f} > {max_score_gap}")
        if prediction["trajectory_accuracy"] < min_outcome_accuracy:
            reasons.append(f"outcome accuracy {prediction['trajectory_accuracy']:.2f} < {min_outcome_accuracy}")
        if prediction["auroc"] < min_outcome_auroc:  # False for NaN: one outcome only, no ranking
            reasons.append(f"outcome AUROC {prediction['auroc']:.2f} < {min_outcome_auroc}")
    alarm = bool(reasons)
    return GuardDecision(alarm=alarm, lam=0.0 if alarm and fallback else lam, reasons=tuple(reasons))
