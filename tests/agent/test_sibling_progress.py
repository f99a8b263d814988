"""`algo.progress_source: siblings` in the rm_score step (agent.branching.progress_rows): the values
of a step's states read from the iteration's own episodes, hand-computed. No model is loaded and
nothing is played, which is the point of the option."""

import pandas as pd
import pytest

from rlanything.agent.branching import progress_rows
from rlanything.agent.judging import can_train
from rlanything.config import build_config

# task A, played 4 times (accuracy 1/2, inside the RM band) plus one invalid episode; task B,
# twice, both lost (accuracy 0: outside the band). (action, observation) of each step:
EPISODES = {
    0: ("A", [("go east", "hall"), ("take key", "won")], 1, True),
    1: ("A", [("go east", "hall"), ("look", "hall"), ("look", "hall")], -1, True),
    2: ("A", [("look", "kitchen"), ("go east", "hall"), ("take key", "won")], 1, True),
    3: ("A", [("xyzzy", "?"), ("xyzzy", "?")], -1, True),
    4: ("A", [("go east", "hall"), ("take key", "won")], -1, False),  # an environment error: not a sample
    5: ("B", [("go west", "yard"), ("look", "yard")], -1, True),
    6: ("B", [("look", "porch"), ("look", "porch")], -1, True),
}


def frames() -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    steps = [
        {"traj_id": t, "task_id": task, "step_idx": k, "action": a, "observation": o}
        for t, (task, events, _, _) in EPISODES.items()
        for k, (a, o) in enumerate(events)
    ]
    episodes = [
        {"traj_id": t, "task_id": task, "first_observation": f"start {task}"} for t, (task, *_) in EPISODES.items()
    ]
    outcomes = pd.DataFrame(
        [
            {"traj_id": t, "task_id": task, "outcome": o, "num_steps": len(ev), "valid": ok, "pending": False}
            for t, (task, ev, o, ok) in EPISODES.items()
        ]
    )
    frames = {"rollouts": pd.DataFrame(steps), "episodes": pd.DataFrame(episodes), "outcomes": outcomes}
    return frames, outcomes[outcomes.valid]


def config(source: str, rm_advantage: str = "zscore"):
    algo = {"rm_target": "progress", "progress_source": source, "progress_steps": 1, "rm_advantage": rm_advantage}
    return build_config({"algo": algo, "rm": {"role": "judge", "judgments_per_step": 2}})


def test_every_trainable_step_is_valued_from_the_episodes_through_its_states():
    """V(start of A) = (1 − 1 + 1 − 1)/4 = 0 (the invalid episode 4 does not count); after
    "go east" (0 and 1): 0; after "look" (2 alone): +1; after "xyzzy": −1; after "go east", "look"
    (1 alone): −1; after "look", "go east" (2 alone): +1, though 0 reached the same room by
    another history. Steps before the last whose verdicts split: all but (2, 1), plus task B's,
    which lies outside the band."""
    frame, judged = frames()
    split = {(0, 0), (1, 0), (1, 1), (2, 0), (3, 0), (5, 0), (6, 0), (0, 1)}  # (0, 1) is a last step
    rows, metrics = progress_rows(config("siblings"), None, 0, frame, judged, split)
    got = {(r["traj_id"], r["step_idx"]): (r["value_before"], r["value_after"], r["progress"]) for r in rows}
    assert got == {
        (0, 0): (0.0, 0.0, 0.0),
        (1, 0): (0.0, 0.0, 0.0),
        (1, 1): (0.0, -1.0, -1.0),
        (2, 0): (0.0, 1.0, 1.0),
        (3, 0): (0.0, -1.0, -1.0),
    }
    assert metrics == {"progress/episodes": 4, "progress/steps": 5, "progress/nonzero_share": pytest.approx(3 / 5)}


def test_nothing_to_value_writes_nothing():
    frame, judged = frames()
    assert progress_rows(config("siblings"), None, 0, frame, judged, {(5, 0)}) == ([], {"progress/steps": 0})


def test_unanimous_verdicts_are_valued_only_where_they_can_train():
    """Under the paper's z-score a step whose m verdicts agree cannot train the RM, so it is not
    valued; paid by the reward itself (algo.rm_advantage reward) it can, and is."""
    judged = pd.DataFrame(
        {"traj_id": [0, 0, 1, 1], "step_idx": [0, 0, 0, 0], "step_score": [1, -1, -1, -1], "parsed": [True] * 4}
    )
    assert can_train(judged, config("siblings")) == {(0, 0)}
    assert can_train(judged, config("siblings", "reward")) == {(0, 0), (1, 0)}


def test_no_judged_task_inside_the_band_values_nothing():
    """Only task B's episodes judged (both lost: outside the band): no step to value, and no
    error (an empty pick once selected no columns instead of no rows: KeyError 'traj_id')."""
    frame, judged = frames()
    only_b = judged[judged.task_id == "B"]
    assert progress_rows(config("siblings", "reward"), None, 0, frame, only_b, {(5, 0), (6, 0)}) == (
        [],
        {"progress/steps": 0},
    )
