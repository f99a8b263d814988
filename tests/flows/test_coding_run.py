"""The paper's coding setting through real Prefect, MLflow and the sandbox: configs/tiny-coding.yaml
(rm.role unit_tests, the problems shipped with rlanything), one iteration."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlanything.envs.coding import load_problem
from rlanything.envs.unit_tests import unit_test_example
from rlanything.storage import schemas
from rlanything.storage.buffer import read_buffer
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table

REPO = Path(__file__).resolve().parents[2]
K = 2  # tests per task


@pytest.fixture(scope="module")
def run(prefect_server, tmp_path_factory):
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp("coding")
    overrides = [f"run.root={root}", "run.name=coding", "env.num_problems=2", "policy.tasks_per_iteration=2",
                 "policy.group_size=2", f"rm.tests_per_task={K}"]  # fmt: skip
    return train_flow(str(REPO / "configs" / "tiny-coding.yaml"), overrides, 1)


def test_unit_tests_and_pass_matrix_are_written_with_their_schemas(run):
    layout = RunLayout(Path(run["run_dir"]))
    tables = {n: read_table(layout.artifact(0, n), getattr(schemas, n.upper())) for n in
              ("outcomes", "judgments", "unit_tests", "pass_matrix", "advantages")}  # fmt: skip
    outcomes, tests = tables["outcomes"], tables["unit_tests"]
    specs = read_buffer(layout.tasks_snapshot(0)).set_index("task_id").spec
    # verify counts every ground-truth test of the problem
    for row in outcomes.itertuples():
        assert row.tests_total == len(load_problem(json.loads(specs[row.task_id]))["tests"])
        assert 0 <= row.tests_passed <= row.tests_total and (row.outcome == 1) == (row.tests_passed == row.tests_total)
    assert tables["judgments"].empty  # the RM judged no step: it wrote tests
    tasks = sorted(outcomes.task_id.unique())
    assert sorted(tests.task_id.unique()) == tasks and len(tests) == K * len(tasks)
    assert (tests.groupby("task_id").test_idx.apply(sorted) == [list(range(K))] * len(tasks)).all()
    assert set(tests["style"]) == {"stdio"}  # the sample problems read stdin
    assert (tests.response_ids.map(len) == tests.logprobs.map(len)).all() and (tests.response_ids.map(len) > 0).all()
    assert all(f"## Problem\n{load_problem(json.loads(specs[t]))['prompt'].strip()}" in p
               for t, p in zip(tests.task_id, tests.prompt))  # fmt: skip
    request, reply = unit_test_example("stdio")  # a solved request comes first
    assert all(p.index(request) < p.index(reply) < p.rindex("## Problem") for p in tests.prompt)
    # a random-init RM writes no parseable test: each says why and earns the unparsed reward
    unparsed = tests[~tests.parsed]
    assert unparsed.parse_error.notna().all() and (unparsed.reward == -2).all() and unparsed.test.isna().all()
    parsed = tests[tests.parsed]
    assert len(tables["pass_matrix"]) == len(parsed) * 2  # one row per parsed test and solution
    rm = tables["advantages"].query("kind == 'rm'")
    assert len(rm) == len(tests) and (rm.traj_id == -1).all()
    assert sorted(zip(rm.task_id, rm.judge_idx)) == sorted(zip(tests.task_id, tests.test_idx))
    policy = tables["advantages"].query("kind == 'policy'")
    assert sorted(policy.traj_id) == sorted(outcomes.traj_id)


def test_metrics_reach_the_summary_and_mlflow(run):
    layout = RunLayout(Path(run["run_dir"]))
    summary = json.loads((layout.iter_dir(0) / "summary.json").read_text())
    tests = read_table(layout.artifact(0, "unit_tests"), schemas.UNIT_TESTS)
    assert summary["unit_tests/generated"] == len(tests)
    assert summary["unit_tests/parse_rate"] == tests.parsed.mean()
    assert "rm/agreement" not in summary  # no judgment: no made-up number
    client = MlflowClient(run["mlflow_uri"])
    logged = client.get_run(run["mlflow_run_id"]).data.metrics
    assert logged["unit_tests/generated"] == len(tests)
    names = {a.path for a in client.list_artifacts(run["mlflow_run_id"], "iter_0000")}
    assert {"iter_0000/unit_tests.parquet", "iter_0000/pass_matrix.parquet"} <= names
