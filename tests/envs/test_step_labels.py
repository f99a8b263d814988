"""Ground-truth step labels (the RM's process accuracy): TextWorld's rule on a hand-built
trajectory, reasoning-gym's answer correctness, and None from environments that know none."""

import json

import pytest

from rlanything.config import build_config
from rlanything.envs import env_class, initial_specs
from rlanything.envs.base import step_labels
from rlanything.envs.reasoning import build_entry
from rlanything.envs.verification import label_episode, replay_outcome
from rlanything.storage.schemas import STEP_LABELS

REASONING = build_config({"env": {"num_problems": 2}}).env


def outcome_row(valid=True, pending=False):
    return {"traj_id": 7, "task_id": "s0001v00", "valid": valid, "pending": pending}


def test_a_hand_built_textworld_trajectory_gets_good_useless_and_harmful_labels(tmp_path):
    pytest.importorskip("textworld", reason="textworld is not installed (pip install textworld==1.7.0)")
    from rlanything.envs.textworld import walkthrough

    options = {"game": "custom", "tw_make": {"world_size": 2, "nb_objects": 3, "quest_length": 2}}
    config = build_config(
        {"env": {"kind": "textworld", "num_problems": 1, "options": {**options, "games_dir": str(tmp_path)}}}
    ).env
    spec = initial_specs(config, seed=0)[0]
    # The game (tw-make custom, seed 0): the cloak is in an open display; a room lies north.
    assert walkthrough(config, spec) == ["take cloak from display", "drop cloak"]
    actions = [
        None,  # no \boxed{}: nothing reaches the game                      2 commands still needed
        "dance on the table",  # not an admissible command                     2
        "look",  # admissible, the goal needs nothing of it: no farther        2 -> 2
        "go north",  # leaves the room: "go south" is now needed too          2 -> 3
        "go south",  # undoes the detour                                       3 -> 2
        "Take Cloak From Display",  # the walkthrough (case ignored, as `step` does)  2 -> 1
        "drop cloak",  # wins                                                  1 -> 0
    ]
    assert replay_outcome(config, spec, actions) == 1
    assert step_labels(env_class("textworld"), config, spec, actions) == [
        (-1, "invalid"),
        (-1, "invalid"),
        (1, "unchanged"),
        (-1, "farther"),
        (1, "closer"),
        (1, "closer"),
        (1, "closer"),
    ]
    # Through verify's library code: one step_labels.parquet row per step, in its schema.
    rows = label_episode(config, outcome_row(), json.dumps(spec), actions)
    assert [(r["step_idx"], r["label"]) for r in rows] == [(0, -1), (1, -1), (2, 1), (3, -1), (4, 1), (5, 1), (6, 1)]
    assert all(set(r) == set(STEP_LABELS.names) and r["traj_id"] == 7 for r in rows)
    # Trajectories whose steps are never judged get no labels.
    assert label_episode(config, outcome_row(valid=False), json.dumps(spec), actions) == []
    assert label_episode(config, outcome_row(pending=True), json.dumps(spec), actions) == []


def test_a_cooking_walkthrough_is_good_throughout_and_a_burnt_ingredient_loses(tmp_path):
    pytest.importorskip("textworld", reason="textworld is not installed (pip install textworld==1.7.0)")
    from rlanything.envs.textworld import walkthrough

    options = {"game": "tw-cooking", "tw_make": {"recipe": 1, "take": 1, "go": 1, "cook": True}}
    config = build_config(
        {"env": {"kind": "textworld", "num_problems": 1, "options": {**options, "games_dir": str(tmp_path)}}}
    ).env
    spec = {"game": "tw-cooking", "options": options["tw_make"], "seed": 3}
    steps = walkthrough(config, spec)
    assert steps == [
        "inventory",
        "examine cookbook",
        "take egg from fridge",
        "cook egg with oven",
        "prepare meal",
        "eat meal",
    ]
    labels = lambda actions: step_labels(env_class("textworld"), config, spec, actions)  # noqa: E731
    # the walkthrough's opening looks change nothing the tracker needs: no farther, +1
    assert labels(steps) == [(1, "unchanged")] * 2 + [(1, "closer")] * 4
    # the recipe wants the egg roasted (oven); fried on the stove, it is burnt and the game lost;
    # a command after the end reaches no game
    assert labels(steps[:3] + ["cook egg with stove", "look"]) == [
        (1, "unchanged"),
        (1, "unchanged"),
        (1, "closer"),
        (-1, "lost"),
        (-1, "invalid"),
    ]


def test_reasoning_labels_are_the_answers_correctness():
    spec = initial_specs(REASONING, seed=0)[1]
    answer = build_entry(spec)["entry"]["answer"]
    label = lambda actions: step_labels(env_class("reasoning_gym"), REASONING, spec, actions)  # noqa: E731
    assert label([answer]) == [(1, "answer")]
    assert label([str(int(answer) + 1)]) == [(-1, "answer")]
    assert label([None]) == [(-1, "answer")]  # no answer: wrong
    assert [r["label"] for r in label_episode(REASONING, outcome_row(), json.dumps(spec), [answer])] == [1]
    with pytest.raises(ValueError, match="one step"):
        label([answer, answer])


@pytest.mark.parametrize("kind", ["first_letter", "coding", "textworld_express", "miniwob"])
def test_environments_without_labels_give_none(kind):
    config = build_config({"env": {"kind": kind, "num_problems": 1}}).env
    assert step_labels(env_class(kind), config, {"any": "spec"}, ["an action"]) is None
    assert label_episode(config, outcome_row(), json.dumps({"any": "spec"}), ["an action"]) is None
