"""Verification (step 2's library code): replay in a fresh environment, the step cap, errors."""

import json

from rlanything.config import build_config
from rlanything.envs import initial_specs
from rlanything.envs.reasoning import build_entry
from rlanything.envs.verification import OUTCOME_IDS, replay_outcome, verify_episode
from rlanything.storage.schemas import EPISODES, OUTCOMES

ENV = build_config({"env": {"num_problems": 2}}).env


def episode(termination, error=None, live_outcome=None):
    return {
        "traj_id": 4,
        "task_id": "s0001v00",
        "slot": 1,
        "version": 0,
        "rollout_idx": 2,
        "first_observation": "q",
        "num_steps": 1,
        "termination": termination,
        "error": error,
        "pending": False,
        "first_screenshot": None,
        "live_outcome": live_outcome,
    }


def test_the_outcome_row_carries_every_id_column_of_outcomes_parquet():
    assert set(OUTCOME_IDS) <= set(OUTCOMES.names) & set(EPISODES.names)
    row = verify_episode(ENV, episode("max_steps"), "{}", [])
    assert set(row) == set(OUTCOMES.names)


def test_a_finished_episode_is_replayed_and_its_verifier_asked():
    spec = initial_specs(ENV, seed=0)[1]
    answer = build_entry(spec)["entry"]["answer"]
    assert replay_outcome(ENV, spec, [answer]) == 1
    won = verify_episode(ENV, episode("done"), json.dumps(spec), [answer])
    assert (won["outcome"], won["valid"], won["verified_by"], won["error"]) == (1, True, "replay", None)
    lost = verify_episode(ENV, episode("done"), json.dumps(spec), [str(int(answer) + 1)])
    assert (lost["outcome"], lost["valid"]) == (-1, True)


def test_step_cap_fails_without_asking_and_an_env_error_is_invalid():
    capped = verify_episode(ENV, episode("max_steps"), "not even json", [])
    assert (capped["outcome"], capped["valid"], capped["verified_by"]) == (-1, True, "step_cap")
    broken = verify_episode(ENV, episode("env_error", error="boom"), "{}", [])
    assert (broken["valid"], broken["error"], broken["verified_by"]) == (False, "boom", "env_error")


def test_a_crashing_verifier_is_recorded_not_a_silent_minus_one():
    row = verify_episode(
        ENV, episode("done"), json.dumps({"dataset": "no_such_dataset", "seed": 1, "config": {}}), ["1"]
    )
    assert row["valid"] is False and row["error"].startswith("verifier: ")
