"""The advantages step's glue, on hand-computed numbers: which samples train, with what rewards."""

import pandas as pd
import pytest

from rlanything.agent.advantage_rows import compute_samples
from rlanything.agent.update_data import to_samples

# the paper's payment of the RM's judgments (algo.rm_balance off, algo.rm_advantage zscore)
PAPER_RM = {"rm_balance": False, "rm_advantage": "zscore"}


def frames():
    # task a: trajectories 0 (won, 2 steps) and 1 (lost, 1 step); task b: trajectory 2 (lost)
    outcomes = pd.DataFrame({"traj_id": [0, 1, 2], "task_id": ["a", "a", "b"], "outcome": [1, -1, -1]})
    keys = [(0, 0), (0, 1), (1, 0), (2, 0)]
    scores = [[1, 1], [1, -1], [-1, 0], [1, 1]]  # m = 2; 0 = unparseable
    judgments = pd.DataFrame(
        [
            {"traj_id": t, "step_idx": s, "judge_idx": j, "step_score": sc, "parsed": sc != 0}
            for (t, s), row in zip(keys, scores)
            for j, sc in enumerate(row)
        ]
    )
    return outcomes, judgments.sample(frac=1, random_state=0)  # order must not matter


def test_policy_and_rm_samples_by_hand():
    outcomes, judgments = frames()
    out = compute_samples(
        outcomes, judgments, m=2, lam=1.0, band=(0.2, 0.8), policy_band=(0.125, 0.875), outcome_weight=1.0, **PAPER_RM
    )
    policy = out[out.kind == "policy"].set_index(["traj_id", "step_idx"])
    # R = O + mean S: (0,0) 1+1 = 2; (0,1) 1+0 = 1; (1,0) -1 + (-1+0)/2 = -1.5; (2,0) -1+1 = 0
    assert policy.reward.to_dict() == {(0, 0): 2.0, (0, 1): 1.0, (1, 0): -1.5, (2, 0): 0.0}
    # (a, step 0): {2, -1.5}: mean 0.25, sample std 2.4749 -> ±0.7071; (a, step 1) and (b, step 0) alone -> raw R
    assert policy.advantage[(0, 0)] == pytest.approx(0.70711, abs=1e-4)
    assert policy.advantage[(1, 0)] == pytest.approx(-0.70711, abs=1e-4)
    assert policy.advantage[(0, 1)] == 1.0 and policy.advantage[(2, 0)] == 0.0
    # task a has accuracy 0.5 (in both bands), task b 0.0 (outside both)
    assert policy.kept.to_dict() == {(0, 0): True, (0, 1): True, (1, 0): True, (2, 0): False}
    assert policy.drop_reason[(2, 0)] == "out_of_band"

    rm = out[out.kind == "rm"].set_index(["traj_id", "step_idx", "judge_idx"])
    # R·S_j, −2 when unparseable: (0,0) [2, 2] std 0 -> skipped; (0,1) [1, -1]; (1,0) [1.5, -2]
    assert rm.reward.to_dict() == {
        (0, 0, 0): 2.0,
        (0, 0, 1): 2.0,
        (0, 1, 0): 1.0,
        (0, 1, 1): -1.0,
        (1, 0, 0): 1.5,
        (1, 0, 1): -2.0,
        (2, 0, 0): 0.0,
        (2, 0, 1): 0.0,
    }
    assert rm.advantage[(0, 1, 0)] == pytest.approx(0.70711, abs=1e-4)
    assert rm.advantage[(1, 0, 1)] == pytest.approx(-0.70711, abs=1e-4)
    assert rm.kept.to_dict() == {
        (0, 0, 0): False,
        (0, 0, 1): False,
        (0, 1, 0): True,
        (0, 1, 1): True,
        (1, 0, 0): True,
        (1, 0, 1): True,
        (2, 0, 0): False,
        (2, 0, 1): False,
    }
    assert rm.drop_reason[(0, 0, 0)] == "zero_std" and rm.drop_reason[(2, 0, 0)] == "out_of_band"


def test_lambda_zero_is_the_outcome_only_baseline():
    outcomes, judgments = frames()
    out = compute_samples(
        outcomes, judgments, m=2, lam=0.0, band=(0, 1), policy_band=(0, 1), outcome_weight=1.0, **PAPER_RM
    )
    policy = out[out.kind == "policy"].set_index(["traj_id", "step_idx"])
    assert policy.reward.to_dict() == {(0, 0): 1.0, (0, 1): 1.0, (1, 0): -1.0, (2, 0): -1.0}


def test_multi_turn_samples_mask_only_the_step_tokens():
    rows = pd.DataFrame(
        {
            "prompt_ids": [[1, 2, 3], [1, 2, 3, 7, 8, 4, 5]],  # step 2's context holds step 1's response
            "response_ids": [[7, 8], [9]],
            "logprobs": [[-0.1, -0.2], [-0.3]],
            "advantage": [1.5, -0.5],
        }
    )
    first, second = to_samples(rows)
    assert first.input_ids == [1, 2, 3, 7, 8] and first.response_len == 2 and first.old_logprobs == [-0.1, -0.2]
    assert second.input_ids == [1, 2, 3, 7, 8, 4, 5, 9] and second.response_len == 1 and second.advantage == -0.5


def test_rm_samples_can_leave_the_forced_verdict_tokens_out():
    from rlanything.models.engines.generation import Choice

    choice = Choice([7, 8], {1: [3], -1: [4, 3]}, [9])  # opener, options, closer
    rows = pd.DataFrame(
        {
            "prompt_ids": [[1, 2], [1, 2]],
            "response_ids": [[5, 7, 8, 3, 9], [7, 8, 4, 3, 9]],  # reasoning [5] then +1; a direct -1
            "logprobs": [[-0.5] * 5, [-0.5] * 5],
            "advantage": [1.0, -1.0],
            "step_score": [1, -1],
        }
    )
    every, chosen = to_samples(rows), to_samples(rows, choice)
    assert [s.trained for s in every] == [None, None]
    assert [s.trained for s in chosen] == [[True, False, False, True, False], [False, False, True, False, False]]
    assert [s.input_ids for s in chosen] == [s.input_ids for s in every]


def test_judging_only_the_trainable_tasks_leaves_every_kept_sample_as_it_was():
    from pathlib import Path

    from rlanything.agent.judging import judged_outcomes
    from rlanything.config import load_config

    outcomes, judgments = frames()
    outcomes = outcomes.assign(valid=True, pending=False)
    bands = dict(band=(0.2, 0.8), policy_band=(0.125, 0.875))
    weights = dict(outcome_weight=1.0, **PAPER_RM)
    path = Path(__file__).resolve().parents[2] / "configs" / "smollm2-textworld.yaml"
    sets = [f"algo.band={list(bands['band'])}", f"algo.policy_band={list(bands['policy_band'])}"]
    config = lambda only: load_config(path, [*sets, f"rm.judge_trainable_only={only}"])  # noqa: E731
    assert judged_outcomes(outcomes, config(False)) is outcomes
    judged = judged_outcomes(outcomes, config(True))
    assert judged.traj_id.tolist() == [0, 1]  # task a (accuracy 0.5); task b (0.0) is in neither band
    full = compute_samples(outcomes, judgments, m=2, lam=1.0, **bands, **weights)
    part = compute_samples(
        outcomes, judgments[judgments.traj_id.isin(judged.traj_id)], m=2, lam=1.0, **bands, **weights
    )
    key = ["kind", "traj_id", "step_idx", "judge_idx"]
    kept = lambda out: out[out.kept].drop(columns="drop_reason").sort_values(key).reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(kept(full), kept(part))  # kept rows have no drop reason
    assert len(kept(part)) == 7 and not part.drop_reason.eq("out_of_band").any()


def test_judging_only_the_trainable_tasks_needs_an_adaptation_that_reads_no_verdict():
    from pathlib import Path

    from rlanything.config import ConfigError, load_config

    path = Path(__file__).resolve().parents[2] / "configs" / "smollm2-textworld.yaml"
    with pytest.raises(ConfigError, match="adapt.critic: extractive"):
        load_config(path, ["rm.judge_trainable_only=true", "adapt.rewriter=model"])
    ok = ["rm.judge_trainable_only=true", "adapt.rewriter=rule", "adapt.critic=extractive"]
    assert load_config(path, ok).rm.judge_trainable_only
    assert load_config(path, ["rm.judge_trainable_only=true", "adapt.enabled=false"]).rm.judge_trainable_only
