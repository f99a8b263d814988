"""TextWorld (tw-make games) and TextWorld-Express, played through the rollout loop and verified
by replay: the walkthrough / gold path wins, wrong play loses, bad answers cost a step."""

import gc
import json
import os
import shutil
import weakref
from pathlib import Path

import pytest
import torch

pytest.importorskip("textworld", reason="textworld is not installed (pip install textworld==1.7.0)")

import textworld.generator.text_grammar  # noqa: E402
import textworld.logic  # noqa: E402
from scripted_policy import listed_commands, play_and_verify  # noqa: E402

from rlanything.config import build_config  # noqa: E402
from rlanything.envs import initial_specs, make_env  # noqa: E402
from rlanything.envs.textgame import resolve_command  # noqa: E402
from rlanything.envs.textworld import TextWorldEnv, game_file, spec_key, walkthrough  # noqa: E402

SMALL = {"world_size": 2, "nb_objects": 3, "quest_length": 2}


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    return tmp_path_factory.mktemp("tw-games")


def tw_config(games, n=2, max_steps=6, **textworld):
    textworld = {"game": "custom", "tw_make": SMALL, "games_dir": str(games), **textworld}
    return build_config(
        {"env": {"kind": "textworld", "num_problems": n, "max_steps": max_steps, "options": textworld}}
    ).env


def run(config, tokenizer, specs, plans, max_steps):
    """play() with a scripted policy, then the verify path's replay for every trajectory."""
    return play_and_verify(config, tokenizer, specs, plans, max_steps)


def first_observations(config, specs):
    env = make_env(config)
    try:
        return [env.reset(spec) for spec in specs]
    finally:
        env.close()


def test_walkthrough_wins_through_rollout_and_verify_with_numbers_and_bad_answers(games, tiny_tokenizer):
    config = tw_config(games)
    specs = initial_specs(config, seed=0)
    plans = {}
    for spec, first in zip(specs, first_observations(config, specs)):
        # A bad opening (no box, then a command the game does not list), then the walkthrough,
        # each command answered by its number in the list the observation shows.
        plans[first] = ["Let me think about the room.", "\\boxed{dance on the table}"] + [
            f"\\boxed{{{cmd}}}" for cmd in walkthrough(config, spec)
        ]
    rows, episodes, outcomes = run(config, tiny_tokenizer, specs, plans, max_steps=6)
    assert [e["termination"] for e in episodes] == ["done", "done"] and outcomes == [1, 1]
    first = [r for r in rows if r["traj_id"] == 0]
    assert [r["step_idx"] for r in first] == list(range(2 + len(walkthrough(config, specs[0]))))
    assert first[0]["action_status"] == "no_box" and first[0]["action"] is None
    assert first[0]["observation"].startswith("Nothing happens: your reply held no command")
    assert first[1]["observation"].startswith('Nothing happens: "dance on the table" is not one of the valid commands.')
    assert "Valid commands:\n1. " in first[1]["observation"] and "Goal: " in first[1]["observation"]
    assert first[-1]["done"] and "*** The End ***" in first[-1]["observation"]


def test_commands_by_number_and_wrong_play_loses(games, tiny_tokenizer):
    config = tw_config(games)
    specs = initial_specs(config, seed=0)
    firsts = first_observations(config, specs)
    # Numbers: the expert answers each walkthrough command by its 1-based position in the list.
    env = make_env(config)
    env.reset(specs[0])
    obs, numbers = firsts[0], []
    for cmd in walkthrough(config, specs[0]):
        number = listed_commands(obs).index(cmd) + 1
        assert resolve_command(str(number), listed_commands(obs)) == cmd
        numbers.append(f"I pick \\boxed{{{number}}}")
        obs = env.step(str(number)).observation
    env.close()
    _, episodes, outcomes = run(config, tiny_tokenizer, specs[:1], {firsts[0]: numbers}, max_steps=4)
    assert episodes[0]["termination"] == "done" and outcomes == [1]
    # Wrong play: looking around forever never wins; the step cap ends the episode.
    looking = {f: ["\\boxed{look}"] * 4 for f in firsts}
    rows, episodes, outcomes = run(config, tiny_tokenizer, specs, looking, max_steps=4)
    assert [e["termination"] for e in episodes] == ["max_steps"] * 2 and outcomes == [-1, -1]
    assert len(rows) == 8 and {r["action"] for r in rows} == {"look"}


def test_first_observation_shows_goal_feedback_and_sorted_commands(games):
    config = tw_config(games)
    spec = initial_specs(config, seed=0)[0]
    env = TextWorldEnv(config)
    first = env.reset(spec)
    goal, rest = first.split("\n\n", 1)
    assert goal.startswith("Goal: ") and "-= " in rest  # the room's name heads the description
    commands = listed_commands(first)
    assert commands == sorted(commands) and "look" in commands and first.endswith("inside \\boxed{}.")
    assert "$$$$" not in first and "\n>" not in first  # no ASCII-art banner, no prompt/status line
    assert env.outcome() == -1
    env.close()


def test_games_are_generated_once_atomically_and_keyed_by_spec(games):
    config = tw_config(games)
    spec = {"game": "custom", "options": SMALL, "seed": 99}
    path = game_file(config, spec)
    folder = path.parent
    assert folder.name == spec_key(spec) and folder.parent == games
    assert {"game.z8", "game.json", "spec.json", "walkthrough.json"} <= set(os.listdir(folder))
    assert json.loads((folder / "spec.json").read_text())["tw_make"] == (
        "tw-make custom --nb-objects 3 --quest-length 2 --world-size 2 --seed 99"
    )
    stamp = path.stat().st_mtime_ns
    assert game_file(config, dict(spec)) == path and path.stat().st_mtime_ns == stamp  # cached
    assert not [p for p in os.listdir(games) if ".tmp-" in p]  # no half-built folders left
    assert spec_key({**spec, "seed": 100}) != spec_key(spec)


@pytest.mark.parametrize("game", ["built", "made in the reset"])
def test_a_reset_leaves_nothing_of_its_caller_alive(games, game):
    """TextWorld's parsers keep the traceback of a failed match from their last parse, and with it
    every frame of the call that loaded or made the game: in a rollout the engine and its model
    (`envs.textgame.forget_parse_failures`). Without it the weight below outlives its caller,
    even after a full collection: live parsers hold it, not garbage."""
    config = tw_config(games)
    spec = {"game": "custom", "options": SMALL, "seed": 98 if game == "built" else 97}
    if game == "built":
        game_file(config, spec)  # the reset below only loads it (the game logic's parser)
    else:
        shutil.rmtree(game_file(config, spec).parent)  # the reset makes it (the text grammar's too)

    def reset_while_holding(weight):
        env = make_env(config)
        try:
            env.reset(spec)
        finally:
            env.close()

    weight = torch.zeros(1000)
    ref = weakref.ref(weight)
    # each parsed once per process: this reset is that once
    textworld.logic.GameLogic.parse.cache_clear()
    textworld.generator.text_grammar.Grammar._cache.clear()
    reset_while_holding(weight)
    del weight
    gc.collect()
    assert ref() is None


def test_bad_specs_are_refused_with_tw_makes_reason(games):
    config = tw_config(games)
    good = {"game": "custom", "options": SMALL, "seed": 1}
    for bad, reason in [
        ({**good, "options": {**SMALL, "colour": 3}}, "unrecognized arguments: --colour"),
        ({**good, "options": {**SMALL, "world_size": "big"}}, "invalid int value"),
        ({**good, "options": {**SMALL, "world_size": 50}}, "above the cap"),
        ({**good, "game": "tw-zork"}, "unknown TextWorld game type"),
        ({**good, "seed": -1}, "seed must be"),
        ({"game": "tw-treasure_hunter", "options": {"level": 31}, "seed": 1}, "level to be within"),
    ]:
        with pytest.raises(ValueError, match=reason):
            TextWorldEnv.validate_spec(config, bad)


def test_rewrites_round_trip_and_the_rewritten_game_is_built(games):
    config = tw_config(games)
    spec = initial_specs(config, seed=0)[0]
    text = TextWorldEnv.rewrite_instructions(spec, "harder")
    assert "tw-make custom" in text and "quest_length" in text and "\\boxed{}" in text
    harder = TextWorldEnv.parse_rewrite(spec, TextWorldEnv.rule_rewrite(spec, "harder"))
    assert harder["options"] == {"world_size": 2, "nb_objects": 4, "quest_length": 3} and harder["seed"] == spec["seed"]
    TextWorldEnv.validate_spec(config, harder)  # generates the game and checks its walkthrough wins
    assert len(walkthrough(config, harder)) == 3
    easier = TextWorldEnv.parse_rewrite(spec, TextWorldEnv.rule_rewrite(spec, "easier"))
    assert easier["options"]["quest_length"] == 1
    moved = TextWorldEnv.parse_rewrite(spec, 'A new world: \\boxed{{"seed": 5, "world_size": 3}}')
    assert moved["seed"] == 5 and moved["options"]["world_size"] == 3 and moved["game"] == "custom"
    for bad, reason in [
        ("no box", "no \\\\boxed"),
        ("\\boxed{seed=5}", "not JSON"),
        ('\\boxed{{"theme": "space"}}', "unknown parameters"),
        ('\\boxed{{"world_size": 0.5}}', "invalid int value"),
    ]:
        with pytest.raises(ValueError, match=reason):
            TextWorldEnv.parse_rewrite(spec, bad)
    hunter = {"game": "tw-treasure_hunter", "options": {"level": 30}, "seed": 1}
    with pytest.raises(ValueError, match="level cannot go harder"):
        TextWorldEnv.rule_rewrite(hunter, "harder")


def test_a_challenge_game_type_plays_too(games, tiny_tokenizer):
    config = tw_config(games, game="tw-treasure_hunter", tw_make={"level": 1})
    spec = initial_specs(config, seed=0)[0]
    plan = [f"\\boxed{{{c}}}" for c in walkthrough(config, spec)]
    _, episodes, outcomes = run(config, tiny_tokenizer, [spec], {first_observations(config, [spec])[0]: plan}, 4)
    assert episodes[0]["termination"] == "done" and outcomes == [1]


# ---------------------------------------------------------------------------------------------
# TextWorld-Express


def twx_config(n=3):
    return build_config({"env": {"kind": "textworld_express", "num_problems": n, "max_steps": 6}}).env


def test_twx_gold_path_wins_and_wrong_play_loses(tiny_tokenizer):
    from rlanything.envs.textworld_express import gold_path

    config = twx_config()
    specs = initial_specs(config, seed=0)
    assert specs[0] == {
        "game": "twc",
        "params": {"numLocations": 1, "numItemsToPutAway": 1, "includeDoors": 0},
        "seed": 0,
        "fold": "train",
    }
    firsts = first_observations(config, specs)
    assert firsts[0].startswith("Goal: Your task is to pick up objects") and "Valid commands:\n1. " in firsts[0]
    plans = {f: ["\\boxed{fly away}"] + [f"\\boxed{{{c}}}" for c in gold_path(s)] for f, s in zip(firsts, specs)}
    rows, episodes, outcomes = run(config, tiny_tokenizer, specs, plans, max_steps=6)
    assert [e["termination"] for e in episodes] == ["done"] * 3 and outcomes == [1, 1, 1]
    assert rows[0]["observation"].startswith('Nothing happens: "fly away"')
    idle = {f: ["\\boxed{inventory}"] * 3 for f in firsts}
    _, episodes, outcomes = run(config, tiny_tokenizer, specs, idle, max_steps=3)
    assert [e["termination"] for e in episodes] == ["max_steps"] * 3 and outcomes == [-1, -1, -1]


def test_twx_specs_rewrites_and_refusals():
    from rlanything.envs.textworld_express import TextWorldExpressEnv as Env

    config = twx_config(1)
    spec = initial_specs(config, seed=0)[0]
    harder = Env.parse_rewrite(spec, Env.rule_rewrite(spec, "harder"))
    assert harder["params"]["numItemsToPutAway"] == 2
    Env.validate_spec(config, harder)
    with pytest.raises(ValueError, match="Number of locations must be less than"):
        Env.validate_spec(config, {**spec, "params": {**spec["params"], "numLocations": 30}})
    with pytest.raises(ValueError, match="unknown parameters"):
        Env.parse_rewrite(spec, '\\boxed{{"numRooms": 2}}')
    with pytest.raises(ValueError, match="must be an integer"):
        Env.parse_rewrite(spec, '\\boxed{{"numLocations": "two"}}')
    assert "numItemsToPutAway" in Env.rewrite_instructions(spec, "easier")


# Worked examples (options.worked_example)


def replay_wins(config, spec, turns) -> bool:
    """Play the example's boxed answers in `spec`'s game from reset: do they win it?"""
    env = make_env(config)
    try:
        first = env.reset(spec)
        assert first == turns[0][0]  # the example starts where that game starts
        for k, (_, answer) in enumerate(turns):
            result = env.step(answer.removeprefix("\\boxed{").removesuffix("}"))
            if k + 1 < len(turns):
                assert result.observation == turns[k + 1][0] and not result.done
        return result.done and env.outcome() == 1
    finally:
        env.close()


@pytest.mark.parametrize("kind", ["textworld", "textworld_express"])
def test_the_worked_example_is_a_won_game_of_the_same_settings_at_a_reserved_seed(games, tiny_tokenizer, kind):
    from scripted_policy import ScriptedPolicy, tasks_of

    from rlanything.agent.play import play
    from rlanything.envs.heldout import EXAMPLE_SEED, is_heldout_seed
    from rlanything.envs.textgame import boxed

    plain = tw_config(games) if kind == "textworld" else twx_config(2)
    config = build_config(
        {"env": {**plain.model_dump(), "options": {**plain.options.model_dump(), "worked_example": True}}}
    ).env
    specs = initial_specs(config, seed=0)
    assert first_observations(plain, specs[:1]) and make_env(plain).example is None  # off unless asked
    env = make_env(config)
    first = env.reset(specs[0])
    turns = env.example
    env.close()
    assert turns and all(answer.startswith("\\boxed{") for _, answer in turns)
    assert first not in [shown for shown, _ in turns]  # another game than the one played
    assert not is_heldout_seed(EXAMPLE_SEED) and EXAMPLE_SEED not in [s["seed"] for s in specs]
    assert replay_wins(plain, {**specs[0], "seed": EXAMPLE_SEED}, turns)
    # a rewritten (harder) task's example is a game of its own settings
    Env = type(env)
    harder = Env.parse_rewrite(specs[0], Env.rule_rewrite(specs[0], "harder"))
    env.reset(harder)
    assert env.example != turns and replay_wins(plain, {**harder, "seed": EXAMPLE_SEED}, env.example)
    env.close()
    # the rollout's prompt: the example's turns first, answered, then the game played
    seen = []
    policy = ScriptedPolicy(tiny_tokenizer, lambda observations: seen.append(observations) or boxed("look"))
    play(
        policy,
        tiny_tokenizer,
        lambda: make_env(config),
        tasks_of(specs[:1]),
        group_size=1,
        max_steps=1,
        max_new_tokens=8,
        temperature=1.0,
        top_p=1.0,
        seed=0,
    )
    assert seen[0] == [shown for shown, _ in turns] + [first]


@pytest.mark.parametrize("kind", ["textworld", "textworld_express"])
def test_a_wording_changes_the_words_and_the_example_game_not_the_game(games, kind):
    """`options.wording`: the same game in the held-out wording shows the same goal, feedback and
    commands under other labels, another system prompt and another reserved example game (whose
    turns use the held-out words too); answers are read alike; `varied` picks a training wording by
    the spec's seed, never the held-out one."""
    from rlanything.envs.heldout import EXAMPLE_SEED
    from rlanything.envs.textgame import TRAINING_WORDINGS, WORDINGS, judge_view, wording_name
    from rlanything.seeding import SLOT_STRIDE

    plain = tw_config(games) if kind == "textworld" else twx_config(2)

    def env_config(**options):
        return build_config(
            {
                "env": {
                    **plain.model_dump(),
                    "options": {**plain.options.model_dump(), "worked_example": True, **options},
                }
            }
        ).env

    spec = initial_specs(plain, seed=0)[0]
    shipped, held_out = make_env(env_config()), make_env(env_config(wording="held_out"))
    try:
        first, other = shipped.reset(spec), held_out.reset(spec)
        assert first.startswith("Goal: ") and "\nValid commands:\n1. " in first
        assert other.startswith("What to achieve: ") and "\nPossible actions:\n- (1) " in other
        assert judge_view(first).removeprefix("Goal: ") == judge_view(other).removeprefix("What to achieve: ")
        assert shipped.system_prompt != held_out.system_prompt == WORDINGS["held_out"].system_prompt
        assert held_out.example != shipped.example and held_out.example[0][0].startswith("What to achieve: ")
        # the held-out example is another reserved game: replayed in the shipped words at its seed
        seed = EXAMPLE_SEED + WORDINGS["held_out"].example_game * 4 * SLOT_STRIDE  # EXAMPLE_TRIES = 4
        shown = [(judge_view(o), a) for o, a in held_out.example]
        replayed = make_env(plain)
        try:
            assert judge_view(replayed.reset({**spec, "seed": seed})) == shown[0][0].replace(
                "What to achieve: ", "Goal: ", 1
            )
        finally:
            replayed.close()
        # an answer by number as the held-out list writes it, "(1)", plays the first command alike
        one, two = shipped.step("(1)"), held_out.step("1")
        assert judge_view(one.observation) == judge_view(two.observation).replace("What to achieve: ", "Goal: ", 1)
    finally:
        shipped.close(), held_out.close()
    picked = {wording_name("varied", {"seed": s}) for s in range(12)}
    assert picked == set(TRAINING_WORDINGS) and "held_out" not in TRAINING_WORDINGS


def test_the_multi_step_setting_as_shipped_can_be_made_easier_and_harder(games):
    """configs/smollm2-textworld-quest2.yaml: its games' wins take two actions, and each task has
    an easier (one-action) and a harder (three-action) rewrite by rule, both built and won by their
    walkthroughs; its OOD split is four rooms with four-action quests."""
    from rlanything.config import load_config
    from rlanything.envs.heldout import heldout_specs

    shipped = Path(__file__).resolve().parents[2] / "configs/smollm2-textworld-quest2.yaml"
    config = load_config(shipped, [f"env.options.games_dir={games}"]).env
    for spec in initial_specs(config, seed=0)[:2]:
        assert len(walkthrough(config, spec)) == 2
        for direction, actions in (("easier", 1), ("harder", 3)):
            rewritten = TextWorldEnv.parse_rewrite(spec, TextWorldEnv.rule_rewrite(spec, direction))
            TextWorldEnv.validate_spec(config, rewritten)
            assert len(walkthrough(config, rewritten)) == actions
    [ood] = heldout_specs(config, "ood", 1, 0)
    assert ood["options"]["world_size"] == 4 and ood["options"]["quest_length"] == 4
