"""Steps 3–4 when the RM writes unit tests (rm.role unit_tests, the coding setting): the Parquet
glue around `models.judge.write_unit_tests`, `envs.unit_tests` and `algo.unit_test_rewards`.

rm_score writes unit_tests.parquet (one row per generated test) and pass_matrix.parquet (one
row per parsed test and trainable solution of its task); judgments.parquet stays empty. The
advantages step reads them back. The step tasks reach it through `agent.rm_roles.RM_ROLES`.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from rlanything import metric_names as names
from rlanything.agent.run_context import model_path, weights_label
from rlanything.algo.unit_test_rewards import correct_test_pass_fraction, unit_test_samples, unit_test_scores
from rlanything.config import Config
from rlanything.envs.unit_tests import parse_unit_test, pass_matrix, unit_test_form
from rlanything.models.engines.generation import PrefixCache
from rlanything.models.engines.make import make_engine
from rlanything.models.judge import write_unit_tests
from rlanything.models.precision import precision_of
from rlanything.progress import progress
from rlanything.seeding import derive_seed
from rlanything.storage.layout import RunLayout
from rlanything.storage.schemas import ADVANTAGES, PASS_MATRIX, UNIT_TESTS


def solutions(steps: pd.DataFrame, outcomes: pd.DataFrame) -> pd.DataFrame:
    """rollouts and outcomes rows -> the trainable trajectories with their answer (the last
    step's action) and whether it passes the ground truth: traj_id, task_id, answer, outcome,
    correct, test_fraction (ground-truth tests passed / run; 0 when none ran)."""
    trainable = outcomes[outcomes.valid & ~outcomes.pending]
    last = steps.sort_values("step_idx").groupby("traj_id").action.last()
    out = trainable[["traj_id", "task_id", "outcome", "tests_passed", "tests_total"]].copy()
    answers = [a if isinstance(a, str) else None for a in out.traj_id.map(last)]
    out["answer"] = pd.Series(answers, index=out.index, dtype=object)  # None stays None, not NaN
    out["correct"] = out.outcome == 1
    total = out.tests_total.astype("float64")
    out["test_fraction"] = (out.tests_passed.astype("float64") / total.where(total > 0)).fillna(0.0)
    return out.sort_values("traj_id").reset_index(drop=True)


def score_with_unit_tests(config: Config, layout: RunLayout, iteration: int, frames: dict[str, pd.DataFrame]):
    """rm_score for rm.role unit_tests. `frames`: the iteration's rollouts, outcomes and `specs`
    (the task buffer's spec column by task_id) -> ({artifact: rows} in the order they are
    written, the last marking the step done; metrics)."""
    sols = solutions(frames["rollouts"], frames["outcomes"])
    specs = frames["specs"]
    task_ids = list(dict.fromkeys(sols.task_id))  # tasks with a trainable solution, first-seen order
    forms = {t: unit_test_form(json.loads(specs[t])) for t in task_ids}  # (style, request, example)
    requests = [(t, request, example) for t, (_, request, example) in forms.items()]
    rm = config.rm
    with progress(f"iter {iteration}: rm_score (unit tests)", len(requests) * rm.tests_per_task) as advance:
        path, precision = (
            model_path(config, layout, "rm", iteration),
            precision_of(config, "rm", run_dir=layout.run_dir),
        )
        engine, tokenizer = make_engine(rm, "rm", path, precision, advance, layout.run_dir / "vllm-rm.log")
        rows = write_unit_tests(
            engine,
            tokenizer,
            requests,
            tests_per_task=rm.tests_per_task,
            max_new_tokens=rm.max_new_tokens,
            temperature=rm.temperature,
            top_p=rm.top_p,
            seed=derive_seed(config.run.seed, iteration, "rm_score"),
            prefix_cache=PrefixCache(),
        )
        weights = weights_label(layout, engine.weights)
    tests, matrix_rows = [], []
    for task_id in task_ids:
        mine = [r for r in rows if r["task_id"] == task_id]
        style = forms[task_id][0]
        parsed = [parse_unit_test(r["response"], style) for r in mine]
        task_sols = sols[sols.task_id == task_id]
        matrix = pass_matrix(config.env, json.loads(specs[task_id]), [t for t, _ in parsed], list(task_sols.answer))
        ok = np.array([t is not None for t, _ in parsed], dtype=bool)
        scores = unit_test_scores(matrix, task_sols.correct.to_numpy(), ok)
        for k, (row, (test, error)) in enumerate(zip(mine, parsed)):
            tests.append(
                {
                    **row,
                    "style": style,
                    "test": None if test is None else json.dumps(test),
                    "parsed": test is not None,
                    "parse_error": error,
                    "correct": bool(scores["correct"][k]),
                    "incorrect_caught": int(scores["incorrect_caught"][k]),
                    "reward": float(scores["reward"][k]),
                    "weights": weights,
                }
            )
            if test is not None:
                for s, sol in enumerate(task_sols.itertuples(index=False)):
                    matrix_rows.append(
                        {
                            "task_id": task_id,
                            "test_idx": row["test_idx"],
                            "traj_id": sol.traj_id,
                            "passed": bool(matrix[k, s]),
                            "solution_correct": bool(sol.correct),
                        }
                    )
    metrics = unit_test_metrics(
        pd.DataFrame(tests, columns=UNIT_TESTS.names), pd.DataFrame(matrix_rows, columns=PASS_MATRIX.names)
    )
    # the RM judges no step in this role; pass_matrix last: it marks the step done
    return {"progress": [], "judgments": [], "unit_tests": tests, "pass_matrix": matrix_rows}, metrics


def unit_test_metrics(tests: pd.DataFrame, matrix: pd.DataFrame) -> dict[str, float]:
    """unit_tests/*: generated, parse_rate, verdict_agreement (the share of solutions on which
    "passes every parsed generated test" equals "passes the ground truth": the coding analogue of
    RM outcome accuracy), and over the parsed tests of problems with a right solution (elsewhere
    every test is "correct" by definition and catches whatever it fails, a vacuous number):
    correct_rate, incorrect_caught (mean per test) and graded_tests (how many that is)."""
    metrics = {"unit_tests/generated": len(tests), "tokens/rm_response": int(tests.response_ids.map(len).sum())}
    if len(tests):
        metrics[names.UNIT_TESTS_PARSE_RATE] = float(tests.parsed.mean())
    graded_tasks = set(matrix.task_id[matrix.solution_correct.astype(bool)])  # works on an empty frame too
    graded = tests[tests.parsed & tests.task_id.isin(graded_tasks)]
    metrics["unit_tests/graded_tests"] = len(graded)
    if len(graded):
        metrics[names.UNIT_TESTS_CORRECT_RATE] = float(graded.correct.mean())
        metrics["unit_tests/incorrect_caught"] = float(graded.incorrect_caught.mean())
    if len(matrix):
        verdicts = matrix.groupby(["task_id", "traj_id"]).agg(
            passes=("passed", "all"), truth=("solution_correct", "first")
        )
        metrics[names.UNIT_TESTS_VERDICT_AGREEMENT] = float((verdicts.passes == verdicts.truth).mean())
    return metrics


def unit_test_advantage_rows(
    sols: pd.DataFrame,
    tests: pd.DataFrame,
    matrix: pd.DataFrame,
    *,
    lam: float,
    band: tuple,
    policy_band: tuple,
    outcome_weight: float,
) -> pd.DataFrame:
    """`solutions(...)`, unit_tests and pass_matrix rows -> advantages.parquet rows for rm.role
    unit_tests (policy rows first, then RM rows): the frame glue around
    `algo.unit_test_rewards.correct_test_pass_fraction` and `unit_test_samples`."""
    correct = tests.set_index(["task_id", "test_idx"]).correct
    generated = {}
    for task_id, rows in matrix.groupby("task_id"):
        table = rows.pivot(index="test_idx", columns="traj_id", values="passed").sort_index()
        is_correct = correct.loc[task_id].loc[table.index].to_numpy(bool)
        generated.update(zip(table.columns, correct_test_pass_fraction(table.to_numpy(bool), is_correct)))
    cols = lambda frame, names: {n: frame[n].to_numpy() for n in names}  # noqa: E731
    trajectories = {
        **cols(sols, ("traj_id", "task_id", "outcome", "test_fraction")),
        "generated_fraction": sols.traj_id.map(generated).fillna(0.0).to_numpy(float),
    }
    policy, rm = unit_test_samples(
        cols(tests, ("task_id", "test_idx", "reward")),
        trajectories,
        lam=lam,
        band=band,
        policy_band=policy_band,
        outcome_weight=outcome_weight,
    )
    if not len(policy["traj_id"]):
        return pd.DataFrame(columns=ADVANTAGES.names)
    frames = [pd.DataFrame({"kind": "policy", **policy, "judge_idx": -1}), pd.DataFrame({"kind": "rm", **rm})]
    return pd.concat(frames, ignore_index=True)[ADVANTAGES.names]


def failed_test_judgments(tests: pd.DataFrame, matrix: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """What the critic summary of task adaptation reads when the RM writes tests: for every
    solution, one -1 "judgment" of its last step per *correct* generated test it fails, the
    reasoning naming the test (`models.rewriters.failed_steps` reads the judgment columns)."""
    failed = matrix[~matrix.passed].merge(
        tests[tests.correct][["task_id", "test_idx", "test"]], on=["task_id", "test_idx"]
    )
    last = steps.groupby("traj_id").step_idx.max()
    rows = [
        {
            "traj_id": r.traj_id,
            "task_id": r.task_id,
            "step_idx": int(last[r.traj_id]),
            "judge_idx": int(r.test_idx),
            "step_score": -1,
            "reasoning": f"This solution fails the test {r.test}, which every correct solution passes.",
        }
        for r in failed.sort_values(["traj_id", "test_idx"]).itertuples(index=False)
    ]
    return pd.DataFrame(rows, columns=["traj_id", "task_id", "step_idx", "judge_idx", "step_score", "reasoning"])
