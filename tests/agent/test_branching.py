"""Monte-Carlo state values on a real TextWorld game (agent.branching), and the progress target
they give (algo.mc_progress): hand-computed from a scripted policy that follows the walkthrough."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("textworld", reason="textworld is not installed (pip install textworld==1.7.0)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))

from scripted_policy import ScriptedPolicy, listed_commands  # noqa: E402

from rlanything.agent.branching import BranchPoint, state_values  # noqa: E402
from rlanything.algo.mc_progress import branch_states, progress_targets  # noqa: E402
from rlanything.config import build_config  # noqa: E402
from rlanything.envs import initial_specs, make_env  # noqa: E402
from rlanything.envs.textworld import walkthrough  # noqa: E402

SAMPLING = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 1.0}


@pytest.fixture(scope="module")
def game(tmp_path_factory):
    options = {"game": "custom", "tw_make": {"world_size": 2, "nb_objects": 3, "quest_length": 2}}
    options["games_dir"] = str(tmp_path_factory.mktemp("tw-games"))
    config = build_config({"env": {"kind": "textworld", "num_problems": 1, "max_steps": 2, "options": options}}).env
    spec = initial_specs(config, seed=0)[0]
    return config, spec, walkthrough(config, spec)


def follower(tokenizer, plan: list[str]) -> ScriptedPolicy:
    """Plays the walkthrough's latest command the current observation lists: the quest's next
    action from any state the walkthrough passes through."""

    def reply(observations: list[str]) -> str:
        listed = listed_commands(observations[-1])
        return "\\boxed{" + next((c for c in reversed(plan) if c in listed), "look") + "}"

    return ScriptedPolicy(tokenizer, reply)


def point(config, spec, actions: list[str]) -> BranchPoint:
    """The state after `actions`, as an episode that took them recorded it."""
    env = make_env(config)
    try:
        seen = [env.reset(spec)] + [env.step(a).observation for a in actions]
    finally:
        env.close()
    return BranchPoint(spec, tuple(seen), tuple(f"\\boxed{{{a}}}" for a in actions), tuple(actions))


def test_values_count_the_steps_left_and_a_wasted_step_costs_the_game(game, tiny_tokenizer):
    """The quest takes 2 actions and the episode 2 steps. From the start the follower wins
    (V = +1); after the first walkthrough action one step is left and one needed (+1); after
    "look" one step is left and two needed: every continuation loses (−1). So the first step's
    progress is 0 when it was the walkthrough's and −2 when it was "look"."""
    config, spec, plan = game
    assert len(plan) == 2
    points = [point(config, spec, []), point(config, spec, plan[:1]), point(config, spec, ["look"])]
    policy = follower(tiny_tokenizer, plan)
    values, counts = state_values(
        policy, tiny_tokenizer, lambda: make_env(config), points, k=3, max_steps=2, sampling=SAMPLING, seed=0
    )
    assert values.tolist() == [1.0, 1.0, -1.0]
    # 3 continuations of 2 turns from the start, 3 x 1 turn from each of the two others.
    assert counts == {
        "continuations": 9,
        "steps_played": 12,
        "response_tokens": counts["response_tokens"],
        "env_errors": 0,
        "replay_mismatch": 0,
    }
    assert policy.calls == 2  # one batched generation per turn, every continuation in it
    ends = {0: (2, 1.0), 1: (2, -1.0)}  # episode 0 took the walkthrough, episode 1 looked first
    vals = {(0, 0): values[0], (0, 1): values[1], (1, 0): values[0], (1, 1): values[2]}
    assert branch_states(np.array([0, 1]), np.array([0, 0]), ends) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert progress_targets(np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]), vals, ends).tolist() == [
        0.0,
        0.0,
        -2.0,
        0.0,
    ]


def test_a_replay_that_disagrees_or_a_crashing_game_is_counted_not_valued(game, tiny_tokenizer):
    config, spec, plan = game
    good = point(config, spec, plan[:1])
    wrong = BranchPoint(spec, (good.observations[0], "not what the game said"), good.responses, good.actions)
    broken = BranchPoint({**spec, "seed": "not a seed"}, good.observations, good.responses, good.actions)
    values, counts = state_values(
        follower(tiny_tokenizer, plan),
        tiny_tokenizer,
        lambda: make_env(config),
        [good, wrong, broken],
        k=2,
        max_steps=2,
        sampling=SAMPLING,
        seed=0,
    )
    assert values[0] == 1.0 and np.isnan(values[1]) and np.isnan(values[2])
    assert counts["replay_mismatch"] == 4 and counts["env_errors"] == 2
