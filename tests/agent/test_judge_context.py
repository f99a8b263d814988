"""What the RM sees of a step: the task, the earlier steps (all, or the latest `rm.history_steps`),
the step and what happened next."""

import pandas as pd

from rlanything.agent.judging import steps_to_judge
from rlanything.models.prompts import judge_messages


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


def test_compact_observations_show_the_rm_the_games_words_without_the_policys_command_list(
    tiny_model_path, tiny_tokenizer
):
    from pathlib import Path

    from rlanything.agent.judging import judge_as_configured
    from rlanything.config import load_config
    from rlanything.envs.textgame import WORDINGS, invalid_observation, observation
    from rlanything.models.engines.transformers_engine import TransformersEngine
    from rlanything.models.loading import load_model

    shipped = WORDINGS["shipped"]
    first = observation("Put the key in the box.", "-= Attic =-\nYou see a key.", ["look", "take key"], shipped)
    after = invalid_observation("Put the key in the box.", "fly", ["look", "take key"], shipped)
    step = {"traj_id": 0, "task_id": "t", "step_idx": 1, "task": first, "history": [("\\boxed{look}", first)]}
    step |= {"response": "\\boxed{fly}", "observation": after, "shown_from": 0}
    engine = TransformersEngine(load_model(tiny_model_path), tiny_tokenizer, batch_size=2)
    repo = Path(__file__).resolve().parents[2]
    prompts = {}
    for compact in (False, True):
        config = load_config(
            repo / "configs" / "smollm2-textworld.yaml", [f"rm.compact_observations={compact}", "rm.history_steps=null"]
        )
        rows = judge_as_configured(engine, tiny_tokenizer, [step], config, seed=0)
        prompts[compact] = rows[0]["prompt"]
    assert prompts[False].count("Valid commands:") == 3 and prompts[True].count("Valid commands:") == 0
    assert "2. take key" not in prompts[True] and "inside \\boxed{}." not in prompts[True]
    for kept in (
        "Goal: Put the key in the box.",
        "You see a key.",
        'Nothing happens: "fly" is not one',
        "Agent: \\boxed{fly}",
    ):
        assert kept in prompts[True], kept
    assert len(tiny_tokenizer.encode(prompts[True])) < len(tiny_tokenizer.encode(prompts[False]))
