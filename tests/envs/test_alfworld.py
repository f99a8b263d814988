"""ALFWorld through its own wrappers and TextWorld's PDDL backend.

ALFWorld's game data is not shipped (alfworld-download fetches it), so the end-to-end tests write
one small game in ALFWorld's own format (its PDDL domain and grammar, from the wheel) into an
ALFWorld-style data folder. They need the `alfworld` package and `fast_downward`
(textworld[pddl]); `make test` installs both (the ALFWorld extra and a fast-downward wheel it
builds once), and a plain `pytest` without them skips these tests, naming what is missing.
"""

import json
from pathlib import Path

import pytest
import scripted_policy

from rlanything.config import build_config
from rlanything.envs import initial_specs, make_env
from rlanything.envs.alfworld import TASK_TYPES, AlfWorldEnv, data_path, split_intro

APPLE = "Apple_bar__plus_00_dot_10_bar__plus_00_dot_90_bar__plus_00_dot_20"
COUNTER = "CounterTop_bar__plus_01_dot_00_bar__plus_00_dot_95_bar__plus_00_dot_00"
FRIDGE = "Fridge_bar__plus_02_dot_00_bar__plus_00_dot_00_bar__plus_00_dot_00"
LOCS = ("loc_bar_0_bar_0_bar_0_bar_30", "loc_bar_4_bar_0_bar_0_bar_30", "loc_bar_8_bar_0_bar_0_bar_30")
PROBLEM = f"""(define (problem plan_trial)
(:domain alfred)
(:objects agent1 - agent {APPLE} - object {COUNTER} - receptacle {FRIDGE} - receptacle
 AppleType - otype CounterTopType - rtype FridgeType - rtype {LOCS[0]} - location {LOCS[1]} - location
 {LOCS[2]} - location)
(:init (atLocation agent1 {LOCS[0]}) (receptacleAtLocation {COUNTER} {LOCS[1]})
 (receptacleAtLocation {FRIDGE} {LOCS[2]}) (receptacleType {COUNTER} CounterTopType)
 (receptacleType {FRIDGE} FridgeType) (objectType {APPLE} AppleType) (canContain CounterTopType AppleType)
 (canContain FridgeType AppleType) (inReceptacle {APPLE} {COUNTER}) (objectAtLocation {APPLE} {LOCS[1]})
 (pickupable {APPLE}) (openable {FRIDGE}))
(:goal (and (exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r) (objectType ?o AppleType)
 (receptacleType ?r FridgeType))))))
)
"""


@pytest.fixture(scope="module")
def alfworld_data(tmp_path_factory):
    """An ALFWorld-style data folder with one solvable pick_and_place_simple game (plus an
    unsolvable one and a `movable` one that the loader must skip)."""
    pytest.importorskip("alfworld", reason="alfworld is not installed (pip install alfworld==0.4.2)")
    pytest.importorskip("fast_downward", reason="fast_downward is missing (pip install 'textworld[pddl]')")
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    root = tmp_path_factory.mktemp("alfworld") / "json_2.1.1" / "train"
    grammar = Path(ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", "put an apple in fridge")
    game = {"pddl_domain": Path(ALFRED_PDDL_PATH).read_text(), "grammar": grammar, "pddl_problem": PROBLEM}
    for folder, solvable in (
        ("pick_and_place_simple-Apple-None-Fridge-1/trial_T0", True),
        ("pick_and_place_simple-Apple-None-Fridge-2/trial_T0", False),
        ("pick_and_place_simple-Apple-None-Fridge-movable-3/trial_T0", True),
    ):
        (root / folder).mkdir(parents=True)
        (root / folder / "game.tw-pddl").write_text(json.dumps({**game, "solvable": solvable}))
        (root / folder / "traj_data.json").write_text(json.dumps({"task_type": "pick_and_place_simple"}))
    return root


def alf_config(root, n=2, max_steps=8):
    alfworld = {"data_path": str(root), "task_types": ["pick_and_place_simple"]}
    return build_config(
        {"env": {"kind": "alfworld", "num_problems": n, "max_steps": max_steps, "options": alfworld}}
    ).env


def play_and_verify(config, tokenizer, specs, plans, max_steps):
    """-> (step rows, each episode's termination, replayed outcomes)."""
    rows, episodes, outcomes = scripted_policy.play_and_verify(config, tokenizer, specs, plans, max_steps)
    return rows, [e["termination"] for e in episodes], outcomes


def test_expert_plan_wins_and_wrong_play_loses(alfworld_data, tiny_tokenizer):
    from rlanything.envs.alfworld import expert_plan, game_path

    config = alf_config(alfworld_data)
    specs = initial_specs(config, seed=0)
    assert specs == [{"task_type": "pick_and_place_simple", "index": k} for k in (0, 1)]
    assert "Fridge-1" in str(game_path(config, specs[1]))  # one solvable, non-movable game: index wraps
    env = make_env(config)
    first = env.reset(specs[0])
    env.close()
    assert first.startswith("Goal: put an apple in fridge.") and "1. go to countertop 1" in first
    plan = expert_plan(config, specs[0])
    assert plan[0] == "go to countertop 1" and plan[-1] == "move apple 1 to fridge 1"
    plans = {first: ["\\boxed{fly}"] + [f"\\boxed{{{c}}}" for c in plan]}
    rows, terminations, outcomes = play_and_verify(config, tiny_tokenizer, specs[:1], plans, max_steps=8)
    assert terminations == ["done"] and outcomes == [1] and len(rows) == len(plan) + 1
    assert rows[0]["observation"].startswith('Nothing happens: "fly"')
    idle = {first: ["\\boxed{inventory}"] * 3}
    _, terminations, outcomes = play_and_verify(config, tiny_tokenizer, specs[:1], idle, max_steps=3)
    assert terminations == ["max_steps"] and outcomes == [-1]


def test_rewrites_pick_other_games_and_validation_checks_the_data(alfworld_data):
    config = alf_config(alfworld_data)
    spec = initial_specs(config, seed=0)[0]
    AlfWorldEnv.validate_spec(config, spec)
    harder = AlfWorldEnv.parse_rewrite(spec, AlfWorldEnv.rule_rewrite(spec, "harder"))
    assert harder == {"task_type": TASK_TYPES[1], "index": 0}
    with pytest.raises(ValueError, match="no solvable look_at_obj_in_light game"):
        AlfWorldEnv.validate_spec(config, harder)
    with pytest.raises(ValueError, match="no task type easier"):
        AlfWorldEnv.rule_rewrite(spec, "easier")
    assert AlfWorldEnv.parse_rewrite(spec, '\\boxed{{"index": 3}}') == {**spec, "index": 3}
    for bad, reason in [
        ('\\boxed{{"task_type": "juggle"}}', "unknown ALFWorld task type"),
        ('\\boxed{{"index": -1}}', "non-negative"),
        ('\\boxed{{"room": 1}}', "unknown parameters"),
    ]:
        with pytest.raises(ValueError, match=reason):
            AlfWorldEnv.parse_rewrite(spec, bad)


def test_missing_data_is_reported_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alf"))  # alfworld-download's variable
    default = build_config({"env": {"kind": "alfworld"}}).env
    assert data_path(default) == tmp_path / "alf" / "json_2.1.1" / "train"
    assert data_path(alf_config(tmp_path / "mine")) == tmp_path / "mine"  # the config's path wins
    config = alf_config(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="no ALFWorld data at .*nowhere.*alfworld-download"):
        AlfWorldEnv.validate_spec(config, {"task_type": "pick_and_place_simple", "index": 0})
    assert split_intro("-= Welcome =-\n\nYou see a bed 1.\n\nYour task is to: look at a book.") == (
        "look at a book.",
        "You see a bed 1.",
    )
