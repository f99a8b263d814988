"""Curriculum rules: task accuracy, the training band, rewrite direction and acceptance.

Paper (docs/method.md):
    * samples train only from tasks with accuracy in [alpha_low, alpha_high] = [0.2, 0.8];
    * a task with accuracy outside (alpha_low, alpha_high) is rewritten:
      harder if acc >= alpha_high, easier if acc <= alpha_low;
    * the rewrite q' is accepted only if acc(q') > 0 and
      harder: alpha_low <= acc(q') < acc(q);   easier: acc(q) < acc(q') <= alpha_high.

The band's ends are keyword-only arguments without a default (``low``, ``high``): callers pass
the config's ``algo.band`` (the paper's [0.2, 0.8] unless set).

Where we depart from the paper / authors' code, and why:

* Accuracy is the fraction of trajectories with outcome == +1 (anything else,
  e.g. a -1 or a 0 for "no outcome", counts as a failure).
* The band test is inclusive on both ends, exactly as the paper writes it; so a task
  at exactly alpha_low or alpha_high both trains *and* is rewritten.
* ``accept_rewrite`` returns a reason with the decision, so the task buffer can
  record *why* a rewrite was rejected (the paper only keeps accepted ones).
  The checks run in a fixed order: zero accuracy first, then direction, then band.
"""

from __future__ import annotations

import numpy as np


def success_rate(outcome: np.ndarray) -> float:
    """Fraction of trajectories with outcome +1 (anything else is a failure); 0.0 when empty.

    outcome (N,) -> python float. The accuracy of one task, or of a whole batch.

    >>> success_rate(np.array([1, -1, 1, 1])), success_rate(np.array([]))
    (0.75, 0.0)
    """
    outcome = np.asarray(outcome)
    if outcome.ndim != 1:
        raise ValueError(f"need outcome (N,); got {outcome.shape}")
    return float((outcome == 1).mean()) if outcome.size else 0.0


def task_accuracy(outcome: np.ndarray, task_ids: np.ndarray) -> dict:
    """Fraction of a task's trajectories with outcome +1.

    outcome (N,) in {-1, +1}, task_ids (N,) hashable -> {task id: accuracy} (python scalars as keys),
    one row per trajectory; keys in first-seen order.

    >>> task_accuracy(np.array([1, -1, 1, 1, -1]), np.array(["a", "a", "a", "b", "c"]))
    {'a': 0.6666666666666666, 'b': 1.0, 'c': 0.0}
    """
    outcome = np.asarray(outcome)
    task_ids = np.asarray(task_ids)
    if outcome.ndim != 1 or task_ids.shape != outcome.shape:
        raise ValueError(f"need outcome (N,) and task_ids (N,); got {outcome.shape} and {task_ids.shape}")
    rows: dict = {}
    for row, task in enumerate(task_ids.tolist()):
        rows.setdefault(task, []).append(row)
    return {task: success_rate(outcome[idx]) for task, idx in rows.items()}


def in_band(accuracy: np.ndarray | float, low: float, high: float) -> np.ndarray | bool:
    """low <= accuracy <= high (inclusive), elementwise.

    accuracy (K,) or scalar -> (K,) bool or bool.

    >>> in_band(np.array([0.0, 0.2, 0.5, 0.8, 1.0]), 0.2, 0.8)
    array([False,  True,  True,  True, False])
    >>> in_band(0.125, 1 / 8, 7 / 8)
    True
    """
    acc = np.asarray(accuracy, dtype=np.float64)
    inside = (low <= acc) & (acc <= high)
    if inside.ndim == 0:
        return bool(inside)
    return inside


def tasks_in_bands(outcome: np.ndarray, task_ids: np.ndarray, *bands: tuple[float, float]) -> set:
    """The tasks whose accuracy lies inside at least one of `bands` (each (low, high), inclusive
    as `in_band`): in step 4 only these tasks' samples can train, the policy's (policy band) and
    the RM's (RM band); every other task's are dropped as out of band.

    outcome (N,) in {-1, +1}, task_ids (N,) hashable, one row per trajectory -> set of task ids.

    Worked example: a 1/4, b 3/4, c 0/2; bands (0.2, 0.8) and (0.25, 1.0): a (0.25) is in the
    second, b in both, c in neither.
    >>> out = np.array([1, -1, -1, -1, 1, 1, 1, -1, -1, -1])
    >>> ids = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 2)
    >>> sorted(tasks_in_bands(out, ids, (0.2, 0.8), (0.25, 1.0))), sorted(tasks_in_bands(out, ids, (0.3, 0.7)))
    (['a', 'b'], [])
    """
    accuracy = task_accuracy(outcome, task_ids)
    return {task for task, acc in accuracy.items() if any(in_band(acc, low, high) for low, high in bands)}


def adaptation_direction(accuracy: float, *, low: float, high: float) -> str | None:
    """Which way to rewrite a task: "harder" if acc >= high, "easier" if acc <= low, else None.

    >>> band = dict(low=0.2, high=0.8)
    >>> adaptation_direction(0.9, **band), adaptation_direction(0.2, **band), adaptation_direction(0.5, **band)
    ('harder', 'easier', None)
    """
    if low >= high:
        raise ValueError(f"need low < high; got low={low}, high={high}")
    if accuracy >= high:
        return "harder"
    if accuracy <= low:
        return "easier"
    return None


def accept_rewrite(direction: str, acc_old: float, acc_new: float, *, low: float, high: float) -> tuple[bool, str]:
    """Decide whether a pending rewrite replaces its parent task.

    Returns (accepted, reason), reason one of "accepted", "zero_accuracy",
    "not_harder", "below_band" (harder), "not_easier", "above_band" (easier).
    Raises ValueError for a direction other than "harder" / "easier".

    >>> accept_rewrite("harder", acc_old=1.0, acc_new=0.5, low=0.2, high=0.8)
    (True, 'accepted')
    >>> accept_rewrite("easier", acc_old=0.1, acc_new=0.9, low=0.2, high=0.8)
    (False, 'above_band')
    """
    if direction not in ("harder", "easier"):
        raise ValueError(f"direction must be 'harder' or 'easier'; got {direction!r}")
    if acc_new <= 0:
        return False, "zero_accuracy"
    if direction == "harder":
        if acc_new >= acc_old:
            return False, "not_harder"
        if acc_new < low:
            return False, "below_band"
    else:
        if acc_new <= acc_old:
            return False, "not_easier"
        if acc_new > high:
            return False, "above_band"
    return True, "accepted"


def judge_rewrite(
    direction: str, parent_accuracy: float, accuracy: float | None, *, low: float, high: float
) -> tuple[bool, str]:
    """The acceptance rule for a pending rewrite after its rollouts: ``accept_rewrite``, and a
    rewrite nobody measured (accuracy None: every rollout of it failed in the environment) is
    rejected as "not_measured".

    >>> judge_rewrite("harder", 0.9, None, low=0.2, high=0.8), judge_rewrite("harder", 0.9, 0.5, low=0.2, high=0.8)
    ((False, 'not_measured'), (True, 'accepted'))
    """
    if accuracy is None:
        return False, "not_measured"
    return accept_rewrite(direction, float(parent_accuracy), accuracy, low=low, high=high)
