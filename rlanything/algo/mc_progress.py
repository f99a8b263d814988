"""A step target grounded in the game: Monte-Carlo progress (our addition; not the paper's).

The paper pays each judgment of a step its episode's outcome (`algo.rewards`). Where lost
episodes run longer than won ones, that teaches a small judge "−1" (docs/experiments.md, the
stage-2 side-by-side run). A progress target asks instead what the step changed: V(s) is the
share of won continuations (as ±1) when the current policy plays on K times from state s, and a
step from s_t to s_t+1 earns

    progress_t = V(s_t+1) − V(s_t)          in [−2, 2]

where s_t is the state after the episode's first t actions, and the state after an episode's
last step is worth its outcome. This is how PAV (arXiv 2410.08146), VinePPO (2410.01679) and
StepWiser (2508.19229) label steps. The values come from `agent.branching.state_values`, or,
free of any extra play, from the iteration's own episodes (`sibling_values`); this module only
combines them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np


def progress_targets(
    traj: np.ndarray, step: np.ndarray, values: dict[tuple[int, int], float], ends: dict[int, tuple[int, float]]
) -> np.ndarray:
    """Each step's progress V(s_t+1) − V(s_t), NaN where a value is missing.

    traj, step (N,) int: the steps, by episode and index t; values: (traj, k) -> V of the state
    after the episode's first k actions (a mean over K continuations, NaN if none was valid);
    ends: traj -> (num_steps, outcome): the state after the last step is worth the outcome, a
    state the continuations need not measure. -> (N,) float.

    Worked example: episode 0 took 3 steps and was won (+1); V(s_0) = −0.5, V(s_1) = 0.5,
    V(s_2) unmeasured. Step 0 earns 0.5 − (−0.5) = 1; step 1 needs V(s_2): NaN; step 2 earns
    +1 − V(s_2): NaN. Episode 1 lost in 2 steps with V(s_1) = 0: step 1 earns −1 − 0 = −1.

    >>> progress_targets(np.array([0, 0, 0, 1]), np.array([0, 1, 2, 1]),
    ...     {(0, 0): -0.5, (0, 1): 0.5, (1, 1): 0.0}, {0: (3, 1.0), 1: (2, -1.0)})
    array([ 1., nan, nan, -1.])
    """

    def value(t: int, k: int) -> float:
        num_steps, outcome = ends[t]
        return float(outcome) if k == num_steps else values.get((t, k), np.nan)

    return np.array([value(int(t), int(k) + 1) - value(int(t), int(k)) for t, k in zip(traj, step)], dtype=float)


def branch_states(traj: np.ndarray, step: np.ndarray, ends: dict[int, tuple[int, float]]) -> list[tuple[int, int]]:
    """The states (traj, k) whose values the progress of `traj`/`step` needs, each once, in order:
    s_t and s_t+1 of every step, less the states after an episode's last step (worth its outcome).

    >>> branch_states(np.array([0, 0, 1]), np.array([0, 1, 1]), {0: (3, 1.0), 1: (2, -1.0)})
    [(0, 0), (0, 1), (0, 2), (1, 1)]
    """
    needed = {(int(t), int(k) + d) for t, k in zip(traj, step) for d in (0, 1)}
    return sorted((t, k) for t, k in needed if k < ends[t][0])


def sibling_values(
    histories: dict[int, Sequence[Hashable]], outcomes: dict[int, float]
) -> dict[tuple[int, int], float]:
    """V of every state an episode passed through, from the episodes that passed through it: the
    mean outcome of the G episodes of a task whose histories agree up to that state. No extra
    play: a step of the rollouts is a continuation of every state its episode had passed.

    histories: traj -> (start, event_1, ..., event_n), where start names the task and its first
    observation and event_i the episode's i-th action with the observation it drew; two episodes
    share the state after k actions exactly when their first k + 1 entries are equal (the same
    history: no determinism of the game is assumed). outcomes: traj -> ±1.
    -> {(traj, k): V} for 0 <= k < n: each state before an episode's last step.

    A state only one episode reached is worth that episode's outcome, so along an episode the
    progress (`progress_targets`) is 0 except where its history parts from its siblings' with
    another mean outcome, and sums to outcome − V(start): the credit of the episode against its
    group lands on the steps where it went its own way. Departure from PAV/VinePPO: their K
    continuations are fresh and independent of the judged episode; these include it.

    Worked example: three episodes of one task. 0 took a then b and won; 1 took a then c and
    lost; 2 took d and lost. V(start) = (1 − 1 − 1)/3 = −1/3 for all three; after a, V = 0
    (episodes 0 and 1); after d, V = −1 (episode 2 alone). Step 0 of episode 0 earns
    0 − (−1/3) = 1/3, its last step +1 − 0 = 1; step 0 of episode 2 earns −1 − (−1/3) = −2/3.

    >>> v = sibling_values({0: ("T", "a", "b"), 1: ("T", "a", "c"), 2: ("T", "d")}, {0: 1.0, 1: -1.0, 2: -1.0})
    >>> {key: round(value, 3) for key, value in sorted(v.items())}
    {(0, 0): -0.333, (0, 1): 0.0, (1, 0): -0.333, (1, 1): 0.0, (2, 0): -0.333}
    >>> progress_targets(np.array([0, 0, 2]), np.array([0, 1, 0]), v, {0: (2, 1.0), 1: (2, -1.0), 2: (1, -1.0)})
    array([ 0.33333333,  1.        , -0.66666667])
    """
    through: dict[tuple, list[float]] = defaultdict(list)
    for traj, history in histories.items():
        for k in range(len(history)):
            through[tuple(history[: k + 1])].append(float(outcomes[traj]))
    return {
        (traj, k): float(np.mean(through[tuple(history[: k + 1])]))
        for traj, history in histories.items()
        for k in range(len(history) - 1)
    }
