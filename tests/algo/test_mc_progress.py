"""The progress target's values read from a group's own episodes (algo.mc_progress.sibling_values),
hand-computed."""

import numpy as np

from rlanything.algo.mc_progress import progress_targets, sibling_values


def test_a_state_is_shared_only_by_episodes_with_the_same_history():
    """Four episodes of one task, events as (action, observation). 0 and 1 both take "a" and see
    the same room: one state, V = (1 − 1)/2 = 0. 2 takes "a" too but the game answers otherwise
    (a game that is not deterministic): a state of its own, worth its outcome +1. 3 takes "b".
    V(start) = (1 − 1 + 1 − 1)/4 = 0."""
    start = ("task", "You are in a kitchen.")
    histories = {
        0: (start, ("a", "hall"), ("c", "won")),
        1: (start, ("a", "hall"), ("d", "lost")),
        2: (start, ("a", "cellar")),
        3: (start, ("b", "attic"), ("e", "attic")),
    }
    outcomes = {0: 1.0, 1: -1.0, 2: 1.0, 3: -1.0}
    values = sibling_values(histories, outcomes)
    assert values == {
        (0, 0): 0.0,
        (0, 1): 0.0,
        (1, 0): 0.0,
        (1, 1): 0.0,
        (2, 0): 0.0,
        (3, 0): 0.0,
        (3, 1): -1.0,
    }
    ends = {t: (len(h) - 1, outcomes[t]) for t, h in histories.items()}
    traj, step = np.array([0, 0, 1, 1, 2, 3, 3]), np.array([0, 1, 0, 1, 0, 0, 1])
    gain = progress_targets(traj, step, values, ends)
    # 0 and 1 part at their second step (won +1, lost −1); 2's only step took it to +1;
    # 3's first step to −1 (−1 − 0) and its second changed nothing (−1 − (−1))
    assert gain.tolist() == [0.0, 1.0, 0.0, -1.0, 1.0, -1.0, 0.0]


def test_an_episodes_progress_sums_to_its_outcome_minus_its_tasks_mean():
    """Telescoping: whatever the tree of histories, the steps of an episode carry, in all, its
    outcome against the mean outcome of its task."""
    rng = np.random.default_rng(0)
    histories, outcomes = {}, {}
    for t in range(40):
        task = f"task{t % 3}"
        n = int(rng.integers(1, 5))
        histories[t] = ((task, "start"), *[(str(rng.integers(0, 2)), "obs") for _ in range(n)])
        outcomes[t] = float(rng.choice([-1.0, 1.0]))
    values = sibling_values(histories, outcomes)
    ends = {t: (len(h) - 1, outcomes[t]) for t, h in histories.items()}
    for t, history in histories.items():
        steps = np.arange(len(history) - 1)
        gain = progress_targets(np.full(len(steps), t), steps, values, ends)
        mean = np.mean([o for u, o in outcomes.items() if histories[u][0] == history[0]])
        assert np.isclose(gain.sum(), outcomes[t] - mean)
