"""The RM on held-out episodes (agent/eval_judge.py): its measures by hand, and its judgments of
greedy episodes made the way the rm_score step makes them (tiny random RM)."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))  # the scripted policy of the env tests

from scripted_policy import ScriptedPolicy  # noqa: E402

from rlanything.agent.advantage_rows import p_plus_mean, rm_process_metrics  # noqa: E402
from rlanything.agent.eval_judge import judge_split, rm_measures  # noqa: E402
from rlanything.agent.eval_play import play_greedy, play_greedy_steps  # noqa: E402
from rlanything.agent.judging import steps_to_judge  # noqa: E402
from rlanything.algo.rm_accuracy import auroc_interval  # noqa: E402
from rlanything.config import build_config  # noqa: E402
from rlanything.envs.heldout import heldout_specs  # noqa: E402
from rlanything.metric_names import RM_MEASURES  # noqa: E402
from rlanything.storage.parquet import read_table  # noqa: E402
from rlanything.storage.schemas import EVAL_JUDGMENTS  # noqa: E402

ARITH = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
}


def test_rm_measures_by_hand():
    # in_domain: episode 0 (O = +1) steps 0: S = +1, +1, -1 and 1: S = -1, -1, -1 (step means
    # +1/3, -1: majority verdicts +1 right, -1 wrong); episode 1 (O = -1) one step S = -1, unparsed,
    # +1 (mean of the parsed: 0, a tie: wrong); episode 2 invalid, never judged.
    # Episode means -1/3 (sign wrong for O = +1) and 0 (a tie: wrong) -> outcome accuracy 0;
    # AUROC: -1/3 < 0 -> 0; gap mean(-1/3, 0) - mean(+1, -1) = -1/6; parse rate 8/9.
    # ood: both episodes failed (one outcome: AUROC NaN), each one step S = -1 -> accuracies 1.
    episodes = pd.DataFrame(
        {
            "split": ["in_domain"] * 3 + ["ood"] * 2,
            "problem_idx": [0, 1, 2, 0, 1],
            "outcome": [1, -1, -1, -1, -1],
            "num_steps": [2, 1, 1, 1, 1],
        }
    )
    judgments = pd.DataFrame(
        {
            "split": ["in_domain"] * 9 + ["ood"] * 2,
            "problem_idx": [0] * 6 + [1] * 3 + [0, 1],
            "step_idx": [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0],
            "step_score": [1, 1, -1, -1, -1, -1, -1, 0, 1, -1, -1],
            "parsed": [True] * 7 + [False] + [True] * 3,
        }
    )
    measures = rm_measures(episodes, judgments)
    assert list(measures["in_domain"]) == [*RM_MEASURES, "rm_verdict_shares"]
    ind = measures["in_domain"]
    # +1 shares of the parsed verdicts: episode 0 (won) 2 of 6, episode 1 (lost) 1 of 2
    assert ind["rm_verdict_shares"] == {"episode lost": [0.5, 2], "episode won": [pytest.approx(1 / 3), 6]}
    assert ind["rm_step_accuracy"] == pytest.approx(1 / 3)
    assert ind["rm_outcome_accuracy"] == 0.0 and ind["rm_outcome_auroc"] == 0.0
    assert ind["rm_score_gap"] == pytest.approx(-1 / 6)
    assert ind["rm_judged"] == 2 and ind["rm_parse_rate"] == pytest.approx(8 / 9)
    assert ind["rm_solved_judged"] == 1 and ind["rm_unsolved_judged"] == 1  # episode 2, invalid, not counted
    assert math.isnan(ind["rm_outcome_auroc_low"]) and math.isnan(ind["rm_outcome_auroc_high"])  # 1 and 1: too few
    ood = measures["ood"]
    assert ood["rm_step_accuracy"] == ood["rm_outcome_accuracy"] == 1.0 and math.isnan(ood["rm_outcome_auroc"])
    assert ood["rm_score_gap"] == 0.0 and ood["rm_judged"] == 2 and ood["rm_parse_rate"] == 1.0
    assert ood["rm_solved_judged"] == 0 and ood["rm_unsolved_judged"] == 2
    # before the last step: only episode 0's first step (mean +1/3): one episode, no AUROC
    assert ind["rm_judged_before_last"] == 1 and math.isnan(ind["rm_outcome_before_last_auroc"])
    assert ood["rm_verdict_shares"] == {"episode lost": [0.0, 2]}


# Two labelled episodes, m = 2 judgments a step, for the hand-computed measures below: episode 0
# won in 3 steps (closer, farther, closer), episode 1 lost in 2 (invalid, unchanged).
EPISODES = pd.DataFrame({"split": ["ood"] * 2, "problem_idx": [0, 1], "outcome": [1, -1], "num_steps": [3, 2]})
LABELS = pd.DataFrame(
    {
        "split": ["ood"] * 5,
        "problem_idx": [0, 0, 0, 1, 1],
        "step_idx": [0, 1, 2, 0, 1],
        "label": [1, -1, 1, -1, 1],
        "rule": ["closer", "farther", "closer", "invalid", "unchanged"],
        "last": [False, False, True, False, True],
    }
)


def two_episodes_judged(step_score: list[int], **columns) -> pd.DataFrame:
    """EPISODES' 10 judgments, step-major: (0, 0) twice, (0, 1) twice, ..., with these verdicts."""
    return pd.DataFrame(
        {
            "split": ["ood"] * 10,
            "problem_idx": [0] * 6 + [1] * 4,
            "step_idx": [0, 0, 1, 1, 2, 2, 0, 0, 1, 1],
            "step_score": step_score,
            "parsed": [True] * 10,
            **columns,
        }
    )


def test_process_measures_by_hand_with_the_last_steps_apart():
    # Episode 0 (won, 3 steps) and 1 (lost, 2 steps), m = 2. Labels, step means (majority):
    #   (0, 0) closer    +1, means +1    (right)   (0, 1) farther -1, mean 0 (a tie: wrong)
    #   (0, 2) closer    +1, mean +1, the last step (apart)
    #   (1, 0) invalid   -1, mean -1     (right)   (1, 1) unchanged +1, mean -1, last (wrong)
    # Before the last: accuracy 2/3; AUROC of good {+1} over bad {0, -1}: both pairs right -> 1.
    # Last steps: accuracy 1/2; good {+1, -1}, no bad step -> AUROC n/a.
    judgments = two_episodes_judged([1, 1, 1, -1, 1, 1, -1, -1, -1, -1])
    episodes, labels = EPISODES, LABELS
    ood = rm_measures(episodes, judgments, labels)["ood"]
    assert ood["rm_process_accuracy"] == pytest.approx(2 / 3) and ood["rm_process_auroc"] == 1.0
    assert (ood["rm_process_good"], ood["rm_process_bad"]) == (1, 2)
    assert math.isnan(ood["rm_process_auroc_low"])  # 1 good step: too few for an interval
    assert ood["rm_last_accuracy"] == 0.5 and math.isnan(ood["rm_last_auroc"])
    assert (ood["rm_last_good"], ood["rm_last_bad"]) == (2, 0)
    shares = ood["rm_verdict_shares"]
    assert shares["closer"] == [1.0, 2] and shares["farther"] == [0.5, 2] and shares["invalid"] == [0.0, 2]
    assert shares["last step closer"] == [1.0, 2] and shares["last step unchanged"] == [0.0, 2]
    assert shares["episode won"] == [pytest.approx(5 / 6), 6] and shares["episode lost"] == [0.0, 4]


def test_progress_auroc_ranks_progress_against_setbacks_with_no_ops_apart():
    # Three episodes, m = 1, steps before the last only (the last steps are labelled too: left out).
    #   ep 0 (won, 4 steps): (0,0) closer S=+1, (0,1) unchanged S=+1, (0,2) farther S=-1, (0,3) closer last
    #   ep 1 (lost, 3 steps): (1,0) unchanged S=-1, (1,1) invalid S=+1, (1,2) lost last
    #   ep 2 (lost, 2 steps): (2,0) closer S=-1, (2,1) invalid last
    # Progress: good {(0,0) +1, (2,0) -1}, bad {(0,2) -1, (1,1) +1}: pairs (+1 > -1) right, (+1 = +1)
    # tie, (-1 = -1) tie, (-1 < +1) wrong -> (1 + 0.5 + 0.5) / 4 = 0.5. No-ops apart: 2 steps, mean 0.
    # The old process AUROC counts the no-ops as good: good {+1, +1, -1, -1}, bad {-1, +1}: of 8 pairs
    # right 2 (+1 > -1 twice), ties 2 + 2 (+1 = +1 twice, -1 = -1 twice) -> (2 + 2) / 8 = 0.5 as well.
    # Outcome before the last: mean verdicts ep 0 (+1 +1 -1)/3 = 1/3, ep 1 0, ep 2 -1 -> won above both
    # lost: AUROC 1; with the last steps (ep 0's +1 win message) it would be 1 too, so the test also
    # checks an episode whose only step is its last has no mean before the last (2 episodes judged).
    episodes = pd.DataFrame(
        {"split": ["ood"] * 4, "problem_idx": [0, 1, 2, 3], "outcome": [1, -1, -1, 1], "num_steps": [4, 3, 2, 1]}
    )
    steps = [(0, 0, 1), (0, 1, 1), (0, 2, -1), (0, 3, 1), (1, 0, -1), (1, 1, 1), (1, 2, -1), (2, 0, -1), (2, 1, -1)]
    steps.append((3, 0, 1))  # ep 3 won in one step: nothing before its last
    judgments = pd.DataFrame(
        {
            "split": ["ood"] * len(steps),
            "problem_idx": [p for p, _, _ in steps],
            "step_idx": [k for _, k, _ in steps],
            "step_score": [s for _, _, s in steps],
            "parsed": [True] * len(steps),
        }
    )
    rules = ["closer", "unchanged", "farther", "closer", "unchanged", "invalid", "lost", "closer", "invalid", "closer"]
    labels = pd.DataFrame(
        {
            "split": ["ood"] * len(steps),
            "problem_idx": judgments.problem_idx,
            "step_idx": judgments.step_idx,
            "label": [1 if r in ("closer", "unchanged") else -1 for r in rules],
            "rule": rules,
            "last": [(p, k) in {(0, 3), (1, 2), (2, 1), (3, 0)} for p, k, _ in steps],
        }
    )
    ood = rm_measures(episodes, judgments, labels)["ood"]
    assert ood["rm_progress_auroc"] == 0.5 and (ood["rm_progress_good"], ood["rm_progress_bad"]) == (2, 2)
    assert (ood["rm_unchanged_steps"], ood["rm_unchanged_mean"]) == (2, 0.0)
    assert ood["rm_process_auroc"] == 0.5 and (ood["rm_process_good"], ood["rm_process_bad"]) == (4, 2)
    assert ood["rm_outcome_before_last_auroc"] == 1.0 and ood["rm_judged_before_last"] == 3
    assert math.isnan(ood["rm_progress_auroc_low"])  # 2 of each: too few for an interval
    # a judge that says +1 to exactly the progress steps scores 1 on progress
    judgments.loc[[0, 7], "step_score"], judgments.loc[[2, 5], "step_score"] = 1, -1
    assert rm_measures(episodes, judgments, labels)["ood"]["rm_progress_auroc"] == 1.0


def test_rm_measures_give_the_auroc_interval_from_ten_episodes_of_each_outcome():
    # 10 solved episodes scoring +1 (one step, S = +1) and 12 unsolved: 9 scoring -1, 3 scoring +1.
    # AUROC: pairs (solved, unsolved) 10 × 9 wins and 10 × 3 ties -> (90 + 15) / 120 = 0.875; the
    # interval is `auroc_interval` of the episodes' scores, below 1 (a resample can hold more +1 unsolved)
    outcome = [1] * 10 + [-1] * 12
    score = [1] * 10 + [-1] * 9 + [1] * 3
    episodes = pd.DataFrame({"split": "in_domain", "problem_idx": range(22), "outcome": outcome, "num_steps": 1})
    judgments = pd.DataFrame(
        {"split": "in_domain", "problem_idx": range(22), "step_idx": 0, "step_score": score, "parsed": True}
    )
    m = rm_measures(episodes, judgments)["in_domain"]
    assert m["rm_outcome_auroc"] == pytest.approx(0.875)
    assert m["rm_solved_judged"] == 10 and m["rm_unsolved_judged"] == 12
    interval = auroc_interval(np.array(score, float), np.array(outcome) > 0)
    assert (m["rm_outcome_auroc_low"], m["rm_outcome_auroc_high"]) == interval
    assert 0.5 < interval[0] < 0.875 < interval[1] == 1.0
    nine = rm_measures(episodes[1:], judgments[1:])["in_domain"]  # 9 solved: too few
    assert nine["rm_solved_judged"] == 9 and math.isnan(nine["rm_outcome_auroc_low"])


def test_a_split_with_nothing_judged_has_nan_rates():
    episodes = pd.DataFrame({"split": ["ood"], "problem_idx": [0], "outcome": [-1], "num_steps": [1]})
    measures = rm_measures(episodes, pd.DataFrame(columns=EVAL_JUDGMENTS.names))["ood"]
    counts = ("rm_judged", "rm_solved_judged", "rm_unsolved_judged", "rm_judged_before_last")
    assert all(measures[k] == 0 for k in counts)
    assert all(math.isnan(measures[k]) for k in RM_MEASURES if k not in counts)


def test_held_out_steps_are_judged_as_the_rm_score_step_judges_them(tiny_tokenizer, tmp_path):
    config = build_config(
        {},
        [
            f"env.dataset_config={json.dumps(ARITH)}",
            "rm.model=builtin:tiny-random?seed=1",
            "rm.max_new_tokens=4",
            "rm.verdict=constrained",
        ],
    )
    bad = {"dataset": "basic_arithmetic", "config": {"max_terms": "x"}, "seed": 99_003}  # the environment crashes
    specs = [*heldout_specs(config.env, "in_domain", 2, 0), bad]
    policy = ScriptedPolicy(tiny_tokenizer, lambda observations: "so \\boxed{3}")
    rows, steps = play_greedy_steps(policy, tiny_tokenizer, config.env, specs, "in_domain", max_new_tokens=8)
    assert rows == play_greedy(policy, tiny_tokenizer, config.env, specs, "in_domain", max_new_tokens=8)
    assert [r["valid"] for r in rows] == [True, True, False]
    assert [(s["traj_id"], s["step_idx"], s["response"]) for s in steps] == [
        (0, 0, "so \\boxed{3}"),
        (1, 0, "so \\boxed{3}"),
    ]
    episodes = pd.DataFrame(rows).rename(columns={"problem_idx": "traj_id"}).assign(pending=False)
    contexts = steps_to_judge(pd.DataFrame(steps), episodes, episodes)
    assert [(c["traj_id"], c["task"]) for c in contexts] == [(k, rows[k]["first_observation"]) for k in (0, 1)]

    from rlanything.models.loading import resolve_model_path

    rm = resolve_model_path(config.rm_model)
    parts = [
        judge_split(config, rm, "the rm", contexts, "in_domain", 3, tmp_path / f"{n}.parquet", "fp32") for n in "ab"
    ]
    first, again = (read_table(p, EVAL_JUDGMENTS) for p in parts)
    assert len(first) == 2 * config.rm.judgments_per_step  # two valid one-step episodes, m = 3 each
    assert first.problem_idx.tolist() == [0, 0, 0, 1, 1, 1] and first.judge_idx.tolist() == [0, 1, 2] * 2
    assert first.parsed.all() and set(first.step_score) <= {-1, 1}  # constrained verdicts (the default)
    assert (first.weights == "the rm").all() and (first.iteration == 3).all()
    assert "so \\boxed{3}" in first.prompt[0] and rows[0]["first_observation"] in first.prompt[0]
    pd.testing.assert_frame_equal(first, again)  # a seed derived from (run.seed, iteration, split)


def test_the_judges_p_plus_ranks_steps_apart_from_its_drawn_verdicts_held_out_and_in_the_loop():
    # Episode 0 (won, 3 steps), episode 1 (lost, 2 steps), m = 2; a step's judgments share P(+1).
    #   (0, 0) closer   S -1, -1  P(+1) 0.9     (0, 1) farther  S +1, +1  P(+1) 0.4
    #   (1, 0) invalid  S +1, -1  P(+1) 0.6     last steps (0, 2) 0.99 and (1, 1) not recorded
    # Progress before the last, by the drawn verdicts: good {-1} below bad {+1, 0} -> 0.
    # By P(+1): good {0.9} above bad {0.4, 0.6} -> 1. Mean P(+1) over the judgments that recorded
    # it: (0.9 + 0.4 + 0.99 + 0.6) / 4 = 0.7225 (each step counted once: its m share it).
    judgments = two_episodes_judged(
        [-1, -1, 1, 1, 1, 1, 1, -1, -1, -1], p_plus=[0.9, 0.9, 0.4, 0.4, 0.99, 0.99, 0.6, 0.6, None, None]
    )
    episodes, labels = EPISODES, LABELS
    ood = rm_measures(episodes, judgments, labels)["ood"]
    assert ood["rm_progress_auroc"] == 0.0 and ood["rm_progress_p_auroc"] == 1.0
    assert ood["rm_p_plus_mean"] == pytest.approx(0.7225)
    assert math.isnan(ood["rm_progress_p_auroc_low"])  # 1 progress step: too few for an interval
    # in the loop, the same frames under training's column names (agent.advantage_rows)
    in_training = {"problem_idx": "traj_id"}
    frame = judgments.rename(columns=in_training)
    loop = rm_process_metrics(frame, labels.rename(columns=in_training), episodes.rename(columns=in_training))
    assert loop["rm/progress_auroc_before_last"] == 0.0 and loop["rm/progress_auroc_p_before_last"] == 1.0
    assert p_plus_mean(frame) == pytest.approx(0.7225)
    # judgments without the column (free verdicts, an older run): no P(+1) figure, never a made-up one
    assert math.isnan(p_plus_mean(frame.drop(columns="p_plus")))
    assert math.isnan(rm_measures(episodes, judgments.drop(columns="p_plus"), labels)["ood"]["rm_progress_p_auroc"])
