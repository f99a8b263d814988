"""Which samples train: rewards, advantages and the band and zero-advantage rules of step 4.

Paper (the method's step 4):
    policy sample = one step (tau, i): reward R = O + lam * mean_j S_ij, advantage = z-score
                    within (task, step index); it trains if its task's accuracy is in the
                    policy band and its advantage is not 0;
    RM sample     = one judgment (tau, i, j): reward R * S_ij (-2 unparsed), advantage =
                    z-score over the m judgments of (tau, i); the m train if the task's
                    accuracy is in the RM band and the m rewards are not all equal.

Where we depart from the paper / authors' code, and why:

* Every judged step must carry exactly m judgments numbered 0..m-1; anything else (a
  missing, duplicated or out-of-range judge_idx) raises ValueError naming the first bad
  step, rather than letting a reshape pair the wrong judgments.
* "Advantage 0" is decided with the tolerance of ``advantages.is_negligible`` (those
  samples carry exactly 0.0), and an RM judgment whose advantage is 0 inside a valid set is
  dropped too ("zero_advantage"): a sample without gradient must not count in the
  loss's per-sample mean, for the RM as for the policy.
* The policy band and the RM band are separate parameters (the paper uses one band).
* ``outcome_weight`` w scales O in the policy's reward only (R_pol = w*O + lam * mean_j S),
  for the RM-signal-only ablation (w = 0); the RM's reward keeps R = O + lam * mean_j S.
* m = 0 (no RM in the loop, the policy-only arm at lam = 0): the policy samples are the
  trainable steps given as ``steps``, their reward w*O; there are no RM samples.
* ``progress`` (``algo.rm_target: progress``, off by default): the RM's reward of a judgment is
  sign(V(s_t+1) - V(s_t)) * S_ij (-2 unparsed) instead of R * S_ij, the Monte-Carlo progress of
  its step (``algo.mc_progress``); the z-score over the m judgments makes only the sign matter.
  Steps without a progress value, or with 0, do not train the RM ("no_target").
* ``rm_balance`` (``algo.rm_balance``, off by default): the kept RM judgments of the two classes
  (episodes won and lost; with ``progress``, steps of positive and negative progress) carry
  equal total weight; with ``progress`` a batch of one class only trains nothing ("one_class").
* ``rm_advantage: reward`` (``algo.rm_advantage``, off by default): a judgment's advantage is its
  reward itself, not its z-score over the step's m judgments, so a step whose m verdicts agree
  still trains ("zero_std" is never given) and a unanimous wrong verdict can be corrected.
"""

from __future__ import annotations

import numpy as np

from rlanything.algo.advantages import class_balanced, rm_advantages, step_index_advantages
from rlanything.algo.curriculum import in_band, task_accuracy
from rlanything.algo.rewards import UNPARSEABLE_REWARD, integrated_reward, rm_consistency_reward


def judgment_matrix(
    traj_id: np.ndarray, step_idx: np.ndarray, judge_idx: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray]:
    """Check that every (trajectory, step) has exactly m judgments with judge_idx 0..m-1 and
    order them.

    traj_id, step_idx, judge_idx (J,) int, in any order -> (keys (N, 2) int64 of the N judged
    steps sorted by (traj_id, step_idx), order (N, m): the row of each step's judgment j).
    Raises ValueError otherwise.

    >>> keys, order = judgment_matrix(np.array([1, 0, 1, 0]), np.array([0, 0, 0, 0]), np.array([1, 0, 0, 1]), m=2)
    >>> keys.tolist(), order.tolist()
    ([[0, 0], [1, 0]], [[1, 3], [2, 0]])
    """
    traj_id, step_idx, judge_idx = (np.asarray(a, dtype=np.int64) for a in (traj_id, step_idx, judge_idx))
    if not traj_id.shape == step_idx.shape == judge_idx.shape or traj_id.ndim != 1:
        raise ValueError(
            f"need traj_id, step_idx, judge_idx all (J,); got {traj_id.shape}, {step_idx.shape}, {judge_idx.shape}"
        )
    if m < 1:
        raise ValueError(f"need m >= 1 judgments per step; got {m}")
    if not len(traj_id):
        return np.zeros((0, 2), dtype=np.int64), np.zeros((0, m), dtype=np.int64)
    order = np.lexsort((judge_idx, step_idx, traj_id))  # by traj, then step, then judge
    keys = np.stack([traj_id[order], step_idx[order]], axis=1)  # (J, 2)
    starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)])
    counts = np.diff(np.r_[starts, len(order)])
    bad = np.flatnonzero(counts != m)
    if not len(bad):
        expected = np.tile(np.arange(m), len(starts))
        wrong = np.flatnonzero(judge_idx[order] != expected)
        bad = np.unique(np.searchsorted(starts, wrong, side="right") - 1)
    if len(bad):
        k = bad[0]
        got = judge_idx[order[starts[k] : starts[k] + counts[k]]].tolist()
        raise ValueError(
            f"step {int(keys[starts[k], 1])} of trajectory {int(keys[starts[k], 0])} has judgments {got}; every "
            f"judged step needs exactly m={m} judgments numbered 0..{m - 1} ({len(bad)} step(s) differ)"
        )
    return keys[starts], order.reshape(-1, m)


def select_samples(
    judgments: dict[str, np.ndarray],
    trajectories: dict[str, np.ndarray],
    *,
    m: int,
    lam: float,
    band: tuple[float, float],
    policy_band: tuple[float, float],
    outcome_weight: float,
    rm_balance: bool,
    rm_advantage: str,
    steps: dict[str, np.ndarray] | None = None,
    progress: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Policy and RM samples of one iteration, with reward, advantage and whether each trains.

    judgments: traj_id, step_idx, judge_idx, step_score (-1/+1, 0 unparsed), parsed (J,);
    steps (only with m = 0, when nothing is judged): traj_id, step_idx (N,) of the trainable steps;
    trajectories: traj_id, task_id, outcome (T,), the trainable ones (their outcomes also give
    each task's accuracy). -> (policy, rm): dicts of equal-length arrays, policy (N,) with
    traj_id, task_id, step_idx, reward, advantage, kept, drop_reason (None, "out_of_band" or
    "zero_advantage"); rm (N*m,) the same plus judge_idx, drop_reason also "zero_std".

    Worked example: one task, trajectories 0 (won) and 1 (lost), one step each, m = 2.
    R = O + mean S: 1 + 1 = 2 and -1 + 0 = -1; z-scores +-0.7071. RM rewards R*S: [2, 2]
    (all equal: zero_std) and [-1, 1].
    >>> pol, rm = select_samples(
    ...     {"traj_id": np.array([0, 0, 1, 1]), "step_idx": np.zeros(4, int), "judge_idx": np.array([0, 1, 0, 1]),
    ...      "step_score": np.array([1, 1, 1, -1]), "parsed": np.ones(4, bool)},
    ...     {"traj_id": np.array([0, 1]), "task_id": np.array(["a", "a"]), "outcome": np.array([1, -1])},
    ...     m=2, lam=1.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=1.0, rm_balance=False,
    ...     rm_advantage="zscore")
    >>> pol["reward"].tolist(), pol["advantage"].round(4).tolist(), pol["kept"].tolist()
    ([2.0, -1.0], [0.7071, -0.7071], [True, True])
    >>> rm["reward"].tolist(), rm["kept"].tolist(), rm["drop_reason"].tolist()
    ([2.0, 2.0, -1.0, 1.0], [False, False, True, True], ['zero_std', 'zero_std', None, None])

    With outcome_weight 0 (RM signal only) the policy's rewards are the mean verdicts, the RM's unchanged.
    >>> pol, rm = select_samples(
    ...     {"traj_id": np.array([0, 0, 1, 1]), "step_idx": np.zeros(4, int), "judge_idx": np.array([0, 1, 0, 1]),
    ...      "step_score": np.array([1, 1, 1, -1]), "parsed": np.ones(4, bool)},
    ...     {"traj_id": np.array([0, 1]), "task_id": np.array(["a", "a"]), "outcome": np.array([1, -1])},
    ...     m=2, lam=1.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=0.0, rm_balance=False,
    ...     rm_advantage="zscore")
    >>> pol["reward"].tolist(), rm["reward"].tolist()
    ([1.0, 0.0], [2.0, 2.0, -1.0, 1.0])

    `rm_balance`, `progress` and `rm_advantage` change what the RM is paid: see `_rm_part`.

    With m = 0 (no RM in the loop) the two trajectories give rewards O = +-1, the same z-scores, no RM sample.
    >>> none = {k: np.array([], int) for k in ("traj_id", "step_idx", "judge_idx", "step_score", "parsed")}
    >>> pol, rm = select_samples(
    ...     none, {"traj_id": np.array([0, 1]), "task_id": np.array(["a", "a"]), "outcome": np.array([1, -1])},
    ...     m=0, lam=0.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=1.0, rm_balance=False,
    ...     rm_advantage="zscore", steps={"traj_id": np.array([1, 0]), "step_idx": np.array([0, 0])})
    >>> pol["traj_id"].tolist(), pol["reward"].tolist(), pol["advantage"].round(4).tolist(), len(rm["reward"])
    ([0, 1], [1.0, -1.0], [0.7071, -0.7071], 0)
    """
    keys, order = _judged_steps(judgments, steps, m, lam)
    score = np.asarray(judgments["step_score"], dtype=np.float64)[order]  # (N, m)
    parsed = np.asarray(judgments["parsed"], dtype=bool)[order]  # (N, m)
    outcome, task_ids, task_acc = _per_step_trajectory(trajectories, keys[:, 0])
    if m:
        reward = integrated_reward(outcome, score, lam=lam)  # (N,): the paper's R, the RM's reward uses it
        policy_reward = reward if outcome_weight == 1.0 else integrated_reward(outcome_weight * outcome, score, lam=lam)
    else:  # no verdicts: R = O (lam is 0)
        reward, policy_reward = outcome, outcome_weight * outcome
    policy = _policy_samples(keys, task_ids, policy_reward, np.asarray(in_band(task_acc, *policy_band), dtype=bool))
    in_rm = np.asarray(in_band(task_acc, *band), dtype=bool)
    return policy, _rm_part(keys, task_ids, reward, score, parsed, in_rm, outcome, rm_balance, progress, rm_advantage)


def _rm_part(keys, task_ids, reward, score, parsed, in_rm_band, outcome, rm_balance, progress, rm_advantage) -> dict:
    """The RM's samples of the judged steps (`_rm_samples`), paid R·S_j (-2 unparsed), or with
    `progress` (traj_id, step_idx, progress of the valued steps) sign(progress)·S_j, the steps
    without a value dropped as no_target (`progress_signs`, `_unpaid`); their advantage is the
    z-score over a step's m judgments, or with `rm_advantage` "reward" the reward itself. With
    `rm_balance` the two classes (outcomes, or progress signs) carry equal total weight in the
    kept advantages (`advantages.class_balanced`; select_samples' first example keeps one
    outcome's judgments: no change), and a progress batch of one class is dropped (`_one_class`).

    Worked example: progress +1 on step 0 of trajectory 0, -1 on trajectories 1 and 2, m = 2,
    verdicts [-1, -1] everywhere. The z-score drops every step (zero_std); paid by their reward
    they all train, [-1, -1, 1, 1, 1, 1]; balanced, the class +1 judgments weigh 6/(2*2) = 1.5
    and the class -1 ones 6/(2*4) = 0.75.
    >>> keys, score = np.array([[0, 0], [1, 0], [2, 0]]), -np.ones((3, 2))
    >>> prog = {"traj_id": np.array([0, 1, 2]), "step_idx": np.zeros(3, int), "progress": np.array([.5, -.5, -.5])}
    >>> args = (keys, np.array(["a"] * 3), np.zeros(3), score, np.ones((3, 2), bool), np.ones(3, bool), -np.ones(3))
    >>> _rm_part(*args, False, prog, "zscore")["drop_reason"].tolist()
    ['zero_std', 'zero_std', 'zero_std', 'zero_std', 'zero_std', 'zero_std']
    >>> _rm_part(*args, True, prog, "reward")["advantage"].tolist()
    [-1.5, -1.5, 0.75, 0.75, 0.75, 0.75]
    """
    m = score.shape[1]
    target = reward if progress is None else progress_signs(keys, progress)
    rm_reward = rm_consistency_reward(target, score, parsed, unparseable_reward=UNPARSEABLE_REWARD)
    rm = _rm_samples(keys, task_ids, rm_reward, in_rm_band, per_step=rm_advantage == "zscore")
    if progress is not None and m:
        rm = _unpaid(rm, target, m)
    if rm_balance and m:  # both classes weigh the same in the RM's update
        label = np.repeat(outcome if progress is None else target, m)
        rm["advantage"] = class_balanced(rm["advantage"], label, rm["kept"])
        if progress is not None:
            rm = _one_class(rm, label)
    return rm


def _one_class(rm: dict[str, np.ndarray], label: np.ndarray) -> dict[str, np.ndarray]:
    """`rm` with every kept judgment dropped as "one_class" when all of them have one label:
    such a batch can only move the judge's prior (measured: a first batch of 27 judgments of
    setbacks took SmolLM2's +1 share from 0.77 to 0.31, docs/judge.md)."""
    if len(np.unique(label[rm["kept"]])) != 1:
        return rm
    return rm | {"kept": np.zeros_like(rm["kept"]), "drop_reason": np.where(rm["kept"], "one_class", rm["drop_reason"])}


def _unpaid(rm: dict[str, np.ndarray], target: np.ndarray, m: int) -> dict[str, np.ndarray]:
    """`rm` with the judgments of steps whose target is 0 (no progress value, or none made)
    dropped as "no_target": they teach nothing (out_of_band keeps its reason)."""
    lacking = np.repeat(target == 0, m) & (rm["drop_reason"] != "out_of_band")
    return rm | {"kept": rm["kept"] & ~lacking, "drop_reason": np.where(lacking, "no_target", rm["drop_reason"])}


def progress_signs(keys: np.ndarray, progress: dict[str, np.ndarray]) -> np.ndarray:
    """sign of each step's progress, 0 where it has no value (or a NaN one): keys (N, 2) of
    (traj_id, step_idx); progress: traj_id, step_idx, progress (P,) -> (N,) float in {-1, 0, 1}.

    >>> progress_signs(np.array([[0, 0], [0, 1], [2, 0]]),
    ...     {"traj_id": np.array([0, 2]), "step_idx": np.array([1, 0]), "progress": np.array([0.25, np.nan])})
    array([0., 1., 0.])
    """
    value = {
        (int(t), int(k)): float(v) for t, k, v in zip(progress["traj_id"], progress["step_idx"], progress["progress"])
    }
    return np.nan_to_num(np.sign([value.get((int(t), int(k)), 0.0) for t, k in keys]), nan=0.0).astype(np.float64)


def _per_step_trajectory(
    trajectories: dict[str, np.ndarray], traj_of_step: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(outcome (N,) float, task_id (N,) object, task accuracy (N,) float) of each step's
    trajectory; the accuracy is over all the given trajectories of the task."""
    traj_ids = np.asarray(trajectories["traj_id"]).tolist()
    row_of = {t: r for r, t in enumerate(traj_ids)}
    if len(row_of) != len(traj_ids):
        raise ValueError("trajectories: traj_id must be unique")
    unknown = sorted({int(t) for t in traj_of_step} - set(row_of))
    if unknown:
        raise ValueError(f"judgments of trajectories {unknown[:5]} that are not among the trainable trajectories")
    rows = np.array([row_of[int(t)] for t in traj_of_step], dtype=np.int64)
    outcome_all = np.asarray(trajectories["outcome"])
    task_all = np.asarray(trajectories["task_id"], dtype=object)
    accuracy = task_accuracy(outcome_all, task_all)
    task_ids = task_all[rows]
    return outcome_all[rows].astype(np.float64), task_ids, np.array([accuracy[t] for t in task_ids], dtype=np.float64)


def _policy_samples(
    keys: np.ndarray, task_ids: np.ndarray, reward: np.ndarray, in_policy_band: np.ndarray
) -> dict[str, np.ndarray]:
    """The policy's samples: one per step of `keys` (N, 2), with its reward (N,), z-scored per
    (task, step index); each step's task in the policy band (N,) bool -> dict of (N,) arrays."""
    advantage = step_index_advantages(reward, task_ids, keys[:, 1])
    return {
        "traj_id": keys[:, 0],
        "task_id": task_ids,
        "step_idx": keys[:, 1],
        "reward": reward,
        "advantage": advantage,
        "kept": in_policy_band & (advantage != 0),  # exact: advantages decided zero are exactly 0.0
        "drop_reason": _reasons(~in_policy_band, advantage == 0, "zero_advantage"),
    }


def _rm_samples(
    keys: np.ndarray, task_ids: np.ndarray, rm_reward: np.ndarray, in_rm_band: np.ndarray, per_step: bool
) -> dict[str, np.ndarray]:
    """The RM's samples: one per judgment of the N steps `keys` (N, 2), rewards (N, m), each
    step's task in the RM band (N,) bool -> dict of (N*m,) arrays, judgments of a step in a row.
    Advantages: the z-score over a step's m judgments (`per_step`, the paper), else the reward."""
    m = rm_reward.shape[1]
    if per_step:
        rm_adv, rm_valid = rm_advantages(rm_reward)
    else:
        rm_adv, rm_valid = rm_reward.astype(np.float64), np.ones(len(rm_reward), dtype=bool)
    rm_ok = np.repeat(in_rm_band, m)
    valid = np.repeat(rm_valid, m)
    zero = valid & (rm_adv.ravel() == 0)
    return {
        "traj_id": np.repeat(keys[:, 0], m),
        "task_id": np.repeat(task_ids, m),
        "step_idx": np.repeat(keys[:, 1], m),
        "judge_idx": np.tile(np.arange(m), len(keys)),
        "reward": rm_reward.ravel(),
        "advantage": rm_adv.ravel(),
        "kept": rm_ok & valid & ~zero,
        "drop_reason": _reasons(~rm_ok, ~valid, "zero_std", zero),
    }


def _judged_steps(
    judgments: dict[str, np.ndarray], steps: dict[str, np.ndarray] | None, m: int, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """(keys (N, 2) sorted by (traj_id, step_idx), order (N, m)) of the steps that make samples:
    the judged ones (`judgment_matrix`), or with m = 0 the given `steps`."""
    if m:
        if steps is not None:
            raise ValueError("steps are only given with m = 0; with judgments the judged steps are the samples")
        return judgment_matrix(judgments["traj_id"], judgments["step_idx"], judgments["judge_idx"], m)
    if lam != 0:
        raise ValueError(f"m = 0 (no judgments) needs lam = 0; got lam = {lam}")
    if steps is None or len(judgments["traj_id"]):
        raise ValueError("m = 0 needs the trainable steps as `steps` and no judgments")
    traj_id, step_idx = (np.asarray(steps[k], dtype=np.int64).reshape(-1) for k in ("traj_id", "step_idx"))
    keys = np.stack([traj_id, step_idx], axis=1)[np.lexsort((step_idx, traj_id))]  # (N, 2)
    if len(keys) > 1 and not (keys[1:] != keys[:-1]).any(axis=1).all():
        raise ValueError("steps: every (traj_id, step_idx) must appear once")
    return keys, np.zeros((len(keys), 0), dtype=np.int64)


def _reasons(
    out_of_band: np.ndarray, first: np.ndarray, first_reason: str, zero: np.ndarray | None = None
) -> np.ndarray:
    """drop_reason per sample: out_of_band wins, then `first_reason`, then zero_advantage."""
    out = np.full(len(out_of_band), None, dtype=object)
    if zero is not None:
        out[zero] = "zero_advantage"
    out[first] = first_reason
    out[out_of_band] = "out_of_band"
    return out
