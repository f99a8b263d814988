"""Advantages: group z-scores for the policy (per task and step index) and the RM.

Paper (docs/method.md):
    policy: for task q and step index i, z-score R_{tau_i} over q's trajectories that
            reached step i; one trajectory -> its raw R; std 0 -> 0; advantage-0
            samples are dropped by the caller.
    RM:     z-score R^S_{tau_i,j} over the m judgments of one (tau, i); std 0 -> skipped.

Where we depart from the paper / authors' code, and why:

* std is the *unbiased* sample std (ddof=1), as ``torch.std`` and verl's GRPO use;
  the paper does not say which. With groups of 2-8 the two differ by up to ~40%,
  so the choice is written here and tested.
* Zero tests use a tolerance scaled to the group, ``ZERO_RTOL * (max|group| + 1)``
  (``is_negligible``), never ``== 0`` on computed floats: a value equal to its group's
  mean comes out of float summation as 0 or +-1e-16 depending on the order (e.g. the
  group [-1.2, -0.4, 1.8, -1.8] has mean -0.4, and ``-0.4 - mean`` is 0, +5.6e-17 or
  -5.6e-17 depending on the order the four are summed in). A group
  whose max - min is negligible has "std 0" (all its advantages 0, RM row invalid); a
  value whose distance to the mean is negligible has advantage exactly 0.0. The caller
  drops samples by ``advantage == 0``, which is then exact. The loop references in this
  module and the tests apply the same rule.
* A singleton group keeps its raw value for the policy (paper) but makes an RM row
  invalid (m = 1 judgments cannot be compared), as the design says "skipped".
* Group ids may be any hashable values (ints, strings, tuples in an object array);
  we factorise them with a dict in first-seen order rather than ``np.unique``, which
  must sort and fails on mixed types.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

ZERO_RTOL = 1e-9  # relative to the group's largest |value| (+1, so values near 0 use an absolute 1e-9)


def is_negligible(x: np.ndarray | float, scale: np.ndarray | float) -> np.ndarray | bool:
    """|x| <= ZERO_RTOL * (scale + 1): the zero test of every advantage rule.

    x and scale broadcast (scale = the group's max |value|) -> bool array (or bool).

    >>> vals = np.array([-1.2, -1.8, -0.4, 1.8])  # mean -0.4, summed in this order
    >>> float(vals[2] - vals.mean()), bool(is_negligible(vals[2] - vals.mean(), np.abs(vals).max()))
    (-5.551115123125783e-17, True)
    """
    return np.abs(x) <= ZERO_RTOL * (np.asarray(scale) + 1.0)


def _factorize(*keys: np.ndarray) -> np.ndarray:
    """Integer codes (N,) for the tuples zip(*keys), in first-seen order.

    >>> _factorize(np.array(["a", "b", "a"]), np.array([0, 0, 0]))
    array([0, 1, 0])
    """
    codes: dict = {}
    rows = zip(*(np.asarray(k).tolist() for k in keys))
    return np.array([codes.setdefault(row, len(codes)) for row in rows], dtype=np.int64)


def _zscore_codes(values: np.ndarray, codes: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Z-score of values (N,) within groups given by integer codes (N,); see group_zscore."""
    n_groups = int(codes.max()) + 1 if codes.size else 0
    count = np.bincount(codes, minlength=n_groups)
    mean = np.bincount(codes, weights=values, minlength=n_groups) / np.maximum(count, 1)
    centred = values - mean[codes]
    sq = np.bincount(codes, weights=centred**2, minlength=n_groups)
    std = np.sqrt(sq / np.maximum(count - 1, 1))
    vmax = np.full(n_groups, -np.inf)
    vmin = np.full(n_groups, np.inf)
    np.maximum.at(vmax, codes, values)
    np.minimum.at(vmin, codes, values)
    scale = np.maximum(np.abs(vmax), np.abs(vmin))  # max |value| per group
    group_size = count[codes]
    z = centred / (std[codes] + eps)
    zero = is_negligible((vmax - vmin)[codes], scale[codes]) | is_negligible(centred, scale[codes])
    z = np.where(zero, 0.0, z)
    z = np.where(group_size == 1, np.where(is_negligible(values, np.abs(values)), 0.0, values), z)
    return z, group_size


def group_zscore(values: np.ndarray, group_ids: np.ndarray, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Z-score within groups: (v - mean) / (std + eps), std with ddof=1.

    values (N,), group_ids (N,) of any hashable values -> (z (N,) float64, group_size (N,) int64).
    Singleton group -> z = raw value; all values equal (size >= 2) -> z = 0; a value at its
    group's mean -> exactly 0 (equality up to ``is_negligible``).

    >>> z, n = group_zscore(np.array([2.0, 0.0, 5.0, 1.0, 1.0]), np.array(["a", "a", "b", "c", "c"]))
    >>> z.round(4), n
    (array([ 0.7071, -0.7071,  5.    ,  0.    ,  0.    ]), array([2, 2, 1, 2, 2]))
    """
    values = np.asarray(values, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    if values.ndim != 1 or group_ids.shape != values.shape:
        raise ValueError(f"need values (N,) and group_ids (N,); got {values.shape} and {group_ids.shape}")
    return _zscore_codes(values, _factorize(group_ids), eps)


def step_index_advantages(
    integrated: np.ndarray, task_ids: np.ndarray, step_idx: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """Policy advantage per step: z-score of the integrated reward within (task, step index).

    integrated (N,), task_ids (N,) hashable, step_idx (N,) int -> advantage (N,) float64.
    One row per (trajectory, step); trajectories may have different lengths, so later
    step indices have smaller groups. One trajectory at a step -> raw R; std 0 -> 0.

    >>> step_index_advantages(np.array([2.0, 0.0, 2.0, -2.0]), np.array([7, 7, 7, 7]),
    ...                       np.array([0, 0, 1, 2])).round(4)
    array([ 0.7071, -0.7071,  2.    , -2.    ])
    """
    integrated = np.asarray(integrated, dtype=np.float64)
    task_ids = np.asarray(task_ids)
    step_idx = np.asarray(step_idx)
    if integrated.ndim != 1 or task_ids.shape != integrated.shape or step_idx.shape != integrated.shape:
        raise ValueError(
            f"need integrated, task_ids, step_idx all (N,); got {integrated.shape}, {task_ids.shape}, {step_idx.shape}"
        )
    return _zscore_codes(integrated, _factorize(task_ids, step_idx), eps)[0]


def step_index_advantages_loop(
    integrated: np.ndarray, task_ids: np.ndarray, step_idx: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """Plain-loop reference for ``step_index_advantages`` (same shapes); used by the tests.

    >>> step_index_advantages_loop(np.array([1.0, 3.0]), np.array([0, 0]), np.array([0, 0])).round(4)
    array([-0.7071,  0.7071])
    """
    groups: dict = defaultdict(list)
    for row, (task, step) in enumerate(zip(np.asarray(task_ids).tolist(), np.asarray(step_idx).tolist())):
        groups[(task, step)].append(row)
    advantage = np.zeros(len(integrated), dtype=np.float64)
    for rows in groups.values():
        vals = [float(integrated[r]) for r in rows]
        scale = max(abs(v) for v in vals)
        if len(vals) == 1:
            advantage[rows[0]] = 0.0 if is_negligible(vals[0], scale) else vals[0]
            continue
        if is_negligible(max(vals) - min(vals), scale):
            continue  # std 0: stays 0
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for r, v in zip(rows, vals):
            advantage[r] = 0.0 if is_negligible(v - mean, scale) else (v - mean) / (std + eps)
    return advantage


def rm_advantages(rm_reward: np.ndarray, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """RM advantage per judgment: z-score across the m judgments of each (trajectory, step).

    rm_reward (N, m) -> (advantage (N, m) float64, valid (N,) bool).
    Rows whose m rewards are all equal (up to ``is_negligible``), or m == 1, are invalid
    (advantage 0): skipped. A judgment whose reward is its row's mean gets exactly 0.

    >>> adv, valid = rm_advantages(np.array([[1.0, 1.0, -1.0], [2.0, 2.0, 2.0]]))
    >>> adv.round(3), valid
    (array([[ 0.577,  0.577, -1.155],
           [ 0.   ,  0.   ,  0.   ]]), array([ True, False]))
    """
    rm_reward = np.asarray(rm_reward, dtype=np.float64)
    if rm_reward.ndim != 2:
        raise ValueError(f"need rm_reward (N, m); got {rm_reward.shape}")
    n, m = rm_reward.shape
    if m < 2:
        return np.zeros_like(rm_reward), np.zeros(n, dtype=bool)
    scale = np.abs(rm_reward).max(axis=1, keepdims=True)  # (N, 1)
    valid = ~is_negligible(rm_reward.max(axis=1) - rm_reward.min(axis=1), scale[:, 0])
    mean = rm_reward.mean(axis=1, keepdims=True)
    std = rm_reward.std(axis=1, ddof=1, keepdims=True)
    centred = rm_reward - mean
    zero = ~valid[:, None] | is_negligible(centred, scale)
    advantage = np.where(zero, 0.0, centred / (std + eps))
    return advantage, valid


def class_balanced(advantage: np.ndarray, label: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """RM advantages reweighted so that the kept judgments of the two classes carry equal total
    weight (`algo.rm_balance`, our departure; off by default). The class of a judgment is its
    episode's outcome (the paper's target) or the sign of its step's progress (`algo.rm_target:
    progress`).

    advantage, label (±1), kept (K,) -> (K,): a kept judgment of class c is scaled by
    n / (2·n_c), n the kept judgments and n_c those of class c; judgments not kept are unchanged
    (their advantage is not used). With one class only among the kept ones nothing can be
    balanced: unchanged (`algo.samples` then drops a progress batch: `one_class`).

    Why: the consistency reward O·S_j pays the verdict that matches the outcome, so when most
    episodes fail most kept judgments push the RM towards −1 whatever it sees; a small judge
    then learns the class prior (measured: two optimizer steps moved SmolLM2-135M's +1 share
    from 0.7 to 0.1 or 0.9 for solved and unsolved episodes alike). The progress target has
    the same flaw when most valued steps are setbacks. Balanced, the prior's push cancels and
    what is left is the difference between the classes.

    Worked example: 3 kept judgments of class −1 and 1 of class +1: n = 4, weights 4/6 and
    4/2; the last judgment is not kept.
    >>> class_balanced(np.array([1.0, -1.0, 1.0, 1.0, 1.0]), np.array([-1, -1, -1, 1, 1]),
    ...                np.array([True, True, True, True, False])).round(4).tolist()
    [0.6667, -0.6667, 0.6667, 2.0, 1.0]
    """
    advantage = np.asarray(advantage, dtype=np.float64).copy()
    label, kept = np.asarray(label), np.asarray(kept, dtype=bool)
    counts = {c: int((kept & (label == c)).sum()) for c in (-1, 1)}
    if not all(counts.values()):
        return advantage
    n = counts[-1] + counts[1]
    for c, n_c in counts.items():
        rows = kept & (label == c)
        advantage[rows] *= n / (2 * n_c)
    return advantage


def expected_verdict_advantages(payoff: np.ndarray, plus_logprob: np.ndarray, minus_logprob: np.ndarray) -> np.ndarray:
    """The advantages of a judged step's two constrained verdicts, +1 and -1, trained together so
    that an update's first step follows the exact gradient of what the judge is paid in
    expectation over its own verdict, instead of m sampled verdicts' estimate of it
    (`algo.rm_verdicts: expected`, our departure).

    payoff (N,): what a verdict S earns per unit of S, a = R (or the step's progress sign),
    times any class weight; a kept judgment's advantage is a*S_j under `rm_advantage: reward`.
    plus_logprob, minus_logprob (N,): the first token of "1" and of "-1" right after "\\boxed{",
    under the full softmax at the judge's temperature T, as the judgment recorded them.
    -> (N, 2): the advantages of the +1 and the -1 sample, c and -c with c = 4*a*p*(1-p),
    p = P(+1) renormalised over the two options = sigmoid(plus_logprob - minus_logprob).

    Why: the judge is paid J = E_S[a*S] = a*(2p - 1), whose gradient is 2a*p*(1-p)*grad(l+ - l-),
    l the log-probs at T, and grad(l+ - l-) = grad(z+ - z-)/T for the raw logits z: the full
    softmax's normaliser cancels. At an update's first step (ratio 1, the k3 KL's gradient 0) the
    loss's gradient is the mini-batch mean of -A*grad(log-prob of the trained token). Over these
    two samples that mean is -(c/2)*grad(l+ - l-), so c = 4a*p*(1-p) gives exactly -grad J per
    step. The step weighs what m drawn judgments weigh: each sample trains one token, and the
    loss averages over samples. Under `rm_advantage: reward` the drawn judgments estimate, with
    the noise of m draws, sum_S p(S)*a*S*grad(log of the full-softmax probability of S): grad J
    plus a*(2p - 1) times the gradient of the log of the two options' total mass.

    Worked example: a = 1, first tokens' probabilities 0.6 and 0.2 -> p = 0.75, c = 0.75.
    >>> expected_verdict_advantages(np.array([1.0, -2.0]), np.log([0.6, 0.5]), np.log([0.2, 0.5])).round(4).tolist()
    [[0.75, -0.75], [-2.0, 2.0]]
    """
    payoff, plus, minus = (np.asarray(a, dtype=np.float64) for a in (payoff, plus_logprob, minus_logprob))
    if not payoff.shape == plus.shape == minus.shape or payoff.ndim != 1:
        raise ValueError(
            f"need payoff, plus_logprob, minus_logprob all (N,); got {payoff.shape}, {plus.shape}, {minus.shape}"
        )
    p = 1.0 / (1.0 + np.exp(minus - plus))
    c = 4.0 * payoff * p * (1.0 - p)
    return np.stack([c, -c], axis=1)
