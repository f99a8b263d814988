"""What the RM sees of a step: the task, the earlier steps (all, or the latest `rm.history_steps`),
the step and what happened next."""

import pandas as pd

from rlanything.models.prompts import judge_messages
from rlanything.tasks.scoring import steps_to_judge


def trajectory(n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    steps = pd.DataFrame(
        {
            "traj_id": [0] * n,
            "task_id": ["t"] * n,
            "step_idx": list(range(n)),
            "response": [f"r{k}" for k in range(n)],
            "observation": [f"o{k}" for k in range(n)],
        }
    )
    episodes = pd.DataFrame({"traj_id": [0], "first_observation": ["goal"], "valid": [True], "pending": [False]})
    return steps, episodes


def test_every_earlier_step_by_default_and_the_latest_ones_with_a_window():
    steps, episodes = trajectory(4)
    full = steps_to_judge(steps, episodes, episodes)
    assert [c["history"] for c in full][3] == [("r0", "o0"), ("r1", "o1"), ("r2", "o2")]
    assert [c["shown_from"] for c in full] == [0, 0, 0, 0]
    window = steps_to_judge(steps, episodes, episodes, history_steps=1)
    assert [c["history"] for c in window] == [[], [("r0", "o0")], [("r1", "o1")], [("r2", "o2")]]
    assert [c["shown_from"] for c in window] == [0, 0, 1, 2]
    assert [c["history"] for c in steps_to_judge(steps, episodes, episodes, history_steps=0)] == [[]] * 4


def test_the_prompt_numbers_the_steps_as_the_episode_did_and_says_what_it_left_out():
    text = judge_messages("goal", [("r2", "o2")], "r3", "o3", shown_from=2)[1]["content"]
    assert "## Steps 1-2\n(not shown)" in text and "## Step 3\nAgent: r2\nEnvironment: o2" in text
    assert "## Step to judge (step 4)\nAgent: r3" in text and "r0" not in text
    full = judge_messages("goal", [("r0", "o0"), ("r1", "o1")], "r2", "o2")[1]["content"]
    assert "not shown" not in full and "## Step 1\nAgent: r0" in full and "(step 3)" in full
