"""The unit-test role's frame glue (agent/unit_test_scoring.py), on hand-computed numbers: solutions,
advantages rows, metrics and what the critic summary reads."""

import numpy as np
import pandas as pd

from rlanything.agent.unit_test_scoring import (
    failed_test_judgments,
    solutions,
    unit_test_advantage_rows,
    unit_test_metrics,
)
from rlanything.models.rewriters import extractive_summary, failed_steps


def frames():
    # task a: solutions 0 (right, 4/4 ground-truth tests), 1 (wrong, 2/4), 2 (no answer, 0/4);
    # task b: solution 3 (right); 4 is pending (a rewrite under evaluation) and 5 invalid: not trainable
    outcomes = pd.DataFrame(
        {
            "traj_id": [0, 1, 2, 3, 4, 5],
            "task_id": ["a", "a", "a", "b", "b", "b"],
            "outcome": [1, -1, -1, 1, 1, -1],
            "tests_passed": [4, 2, 0, 3, 3, 0],
            "tests_total": [4, 4, 4, 3, 3, 3],
            "valid": [True] * 5 + [False],
            "pending": [False] * 4 + [True, False],
        }
    )
    steps = pd.DataFrame({"traj_id": [0, 1, 2, 3, 4, 5], "step_idx": [0] * 6,
                          "action": ["print(1)", "print(2)", None, "print(3)", "x", "y"],
                          "response": ["r0", "r1", "r2", "r3", "r4", "r5"]})  # fmt: skip
    # a: test 0 correct (passes 0, fails 1); test 1 wrong (fails 0, passes 1); test 2 unparsed
    tests = pd.DataFrame(
        {
            "task_id": ["a", "a", "a", "b"],
            "test_idx": [0, 1, 2, 0],
            "test": ['{"input": "1\\n", "output": "1"}', '{"input": "2\\n", "output": "9"}', None, '{"code": "x"}'],
            "parsed": [True, True, False, True],
            "correct": [True, False, False, True],
            "incorrect_caught": [2, 1, 0, 0],
            "reward": [2.0, -1.0, -2.0, 1.0],
            "response_ids": [[1, 2], [3], [4, 5, 6], [7]],
        }
    )
    matrix = pd.DataFrame(
        {
            "task_id": ["a"] * 6 + ["b"],
            "test_idx": [0, 0, 0, 1, 1, 1, 0],
            "traj_id": [0, 1, 2, 0, 1, 2, 3],
            "passed": [True, False, False, False, True, False, True],
            "solution_correct": [True, False, False, True, False, False, True],
        }
    )
    return steps, outcomes, tests, matrix


def test_solutions_keep_the_trainable_ones_with_their_answer_and_test_fraction():
    steps, outcomes, _, _ = frames()
    sols = solutions(steps, outcomes)
    assert sols.traj_id.tolist() == [0, 1, 2, 3]
    assert sols.answer.tolist() == ["print(1)", "print(2)", None, "print(3)"]
    assert sols.correct.tolist() == [True, False, False, True]
    assert sols.test_fraction.tolist() == [1.0, 0.5, 0.0, 1.0]


def test_advantage_rows_by_hand():
    steps, outcomes, tests, matrix = frames()
    rows = unit_test_advantage_rows(
        solutions(steps, outcomes), tests, matrix, lam=1.0, band=(0.2, 0.8), policy_band=(0.2, 0.8), outcome_weight=1.0
    )
    policy = rows[rows.kind == "policy"].set_index("traj_id")
    # a's correct tests: {0}; R = fraction + 1·(correct tests passed): 1 + 1, .5 + 0, 0 + 0
    assert policy.reward.to_dict() == {0: 2.0, 1: 0.5, 2: 0.0, 3: 2.0}
    r = np.array([2.0, 0.5, 0.0])
    expected = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(policy.loc[[0, 1, 2], "advantage"], expected, rtol=1e-6)
    assert policy.kept.tolist() == [True, True, True, False]  # b: accuracy 1, out of band
    rm = rows[rows.kind == "rm"]
    assert rm.traj_id.tolist() == [-1] * 4 and rm.judge_idx.tolist() == [0, 1, 2, 0]
    t = np.array([2.0, -1.0, -2.0])
    np.testing.assert_allclose(rm.advantage[:3], (t - t.mean()) / (t.std(ddof=1) + 1e-6), rtol=1e-6)
    assert rm.drop_reason.isna().tolist() == [True, True, True, False] and rm.drop_reason.iloc[3] == "out_of_band"


def test_metrics_by_hand():
    _, _, tests, matrix = frames()
    m = unit_test_metrics(tests, matrix)
    assert m["unit_tests/generated"] == 4 and m["unit_tests/parse_rate"] == 0.75
    assert m["unit_tests/correct_rate"] == 2 / 3 and m["unit_tests/incorrect_caught"] == 1.0
    # "passes every parsed test" vs the truth: a0 fails test 1 (disagrees), a1 fails test 0
    # (agrees), a2 fails both (agrees), b3 passes (agrees) -> 3/4
    assert m["unit_tests/verdict_agreement"] == 0.75
    assert m["tokens/rm_response"] == 7
    assert m["unit_tests/graded_tests"] == 3


def test_tests_of_problems_without_a_right_solution_are_not_graded():
    _, _, tests, matrix = frames()
    matrix = matrix.assign(solution_correct=False)  # nobody solved anything: "correct" is vacuous
    m = unit_test_metrics(tests, matrix)
    assert m["unit_tests/graded_tests"] == 0
    assert "unit_tests/correct_rate" not in m and "unit_tests/incorrect_caught" not in m
    assert m["unit_tests/verdict_agreement"] == 0.75  # a0, a1, a2 fail a test (agree); b3 passes its test (not)


def test_the_critic_reads_the_correct_tests_a_failed_solution_fails():
    steps, outcomes, tests, matrix = frames()
    judged = failed_test_judgments(tests, matrix, steps)
    assert judged[["traj_id", "judge_idx", "step_score"]].values.tolist() == [[1, 0, -1], [2, 0, -1]]
    items = failed_steps(outcomes[outcomes.task_id == "a"], judged[judged.task_id == "a"], steps, limit=4)
    assert [i["traj_id"] for i in items] == [1, 2]
    assert '{"input": "1\\n", "output": "1"}' in extractive_summary(items)


def test_metrics_of_an_iteration_without_a_parsed_test():
    from rlanything.storage.schemas import PASS_MATRIX

    _, _, tests, _ = frames()
    m = unit_test_metrics(tests.assign(parsed=False), pd.DataFrame([], columns=PASS_MATRIX.names))
    assert m["unit_tests/parse_rate"] == 0.0 and m["unit_tests/graded_tests"] == 0
    assert "unit_tests/verdict_agreement" not in m
