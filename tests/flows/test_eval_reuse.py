"""No held-out evaluation played twice: an evaluation whose policy weights, problems and settings
an earlier evaluation of the run already played reuses its episodes (and its RM's judgments
where the RM did not change either). Real tiny runs through Prefect and MLflow."""

import json
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from rlanything.models.loading import resolve_model_path
from rlanything.storage.checkpoints import weights_digest
from rlanything.storage.parquet import read_table
from rlanything.storage.schemas import EVAL_EPISODES, EVAL_JUDGMENTS, EVAL_STEPS

REPO = Path(__file__).resolve().parents[2]
LABELS = ["weights", "iteration"]  # what names the weights that played: the rest is the play


@pytest.fixture(scope="module")
def frozen_run(prefect_server, tmp_path_factory, small_overrides):
    """tiny.yaml with a frozen policy (the RM trains), evaluated on the base and after each of
    two iterations."""
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp("frozen-run")
    overrides = [f"run.root={root}", "run.name=frozen", *small_overrides, "policy.optim.frozen=true"]
    return train_flow(str(REPO / "configs" / "tiny.yaml"), [*overrides, "eval.every=1", "eval.problems=2"], 2)


def summary_rows(run_dir: Path, folder: str) -> dict[str, dict]:
    record = json.loads((run_dir / "eval" / folder / "summary.json").read_text())
    return {row["split"]: row for row in record["splits"]}


def split_files(run_dir: Path, folder: str):
    out = run_dir / "eval" / folder
    return (
        read_table(out / "episodes.parquet", EVAL_EPISODES),
        read_table(out / "steps.parquet", EVAL_STEPS),
        read_table(out / "judgments.parquet", EVAL_JUDGMENTS),
    )


def test_a_frozen_policy_is_played_once_and_its_episodes_judged_by_each_new_rm(frozen_run):
    run_dir = Path(frozen_run["run_dir"])
    first, second = (weights_digest(run_dir / "checkpoints" / "policy" / f"iter_000{i}") for i in (0, 1))
    base = weights_digest(resolve_model_path("builtin:tiny-random"))
    assert base == first == second  # the frozen update wrote the start's files again
    played = summary_rows(run_dir, "base")
    assert not [row for row in played.values() if "episodes_from" in row]  # the first evaluation plays
    _, _, judgments_base = split_files(run_dir, "base")
    for folder, iteration in (("iter_0000", 0), ("iter_0001", 1)):
        reused = summary_rows(run_dir, folder)
        for split in ("in_domain", "ood"):
            assert reused[split]["episodes_from"] == "eval/base", (folder, reused[split])
            assert reused[split]["play_key"] == played[split]["play_key"]
            assert "judgments_from" not in reused[split]  # the RM changed: its judgments are new
            assert reused[split]["rm_key"] != played[split]["rm_key"]
        episodes, steps, judgments = split_files(run_dir, folder)
        before, steps_before, _ = split_files(run_dir, "base")
        pd.testing.assert_frame_equal(episodes.drop(columns=LABELS), before.drop(columns=LABELS))
        pd.testing.assert_frame_equal(steps, steps_before)
        assert set(episodes.weights) == {f"checkpoints/policy/{folder}"} and (episodes.iteration == iteration).all()
        assert set(judgments.weights) == {f"checkpoints/rm/{folder}"} and (judgments.iteration == iteration).all()
        assert len(judgments) == len(judgments_base) == episodes[episodes.valid].num_steps.sum() * 3
        summary = (run_dir / "eval" / folder / "summary.md").read_text()
        assert (
            "- in_domain: episodes reused from eval/base" in summary and "RM judgments new (the RM changed)" in summary
        )
    client = MlflowClient(frozen_run["mlflow_uri"])
    for key, reused in (("eval/ood/episodes_reused", [0.0, 1.0, 1.0]), ("eval/ood/judgments_reused", [0.0] * 3)):
        history = client.get_metric_history(frozen_run["mlflow_run_id"], key)
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == reused, key


def test_the_same_checkpoint_evaluated_again_reuses_the_judgments_too(frozen_run):
    from rlanything.flows.evaluation import eval_flow

    run_dir = Path(frozen_run["run_dir"])
    _, _, judgments_before = split_files(run_dir, "iter_0001")
    result = eval_flow(f"{run_dir}@1", split="ood")
    rows = {row["split"]: row for row in result["summary"]}
    assert rows["ood"]["judgments_from"] == "eval/iter_0001" and result["metrics"]["eval/ood/judgments_reused"] == 1
    _, _, judgments = split_files(run_dir, "iter_0001")
    pd.testing.assert_frame_equal(judgments, judgments_before)  # the in_domain ones kept, the ood ones reused
    assert "reused from eval/iter_0001 (the same RM)" in (run_dir / "eval" / "iter_0001" / "summary.md").read_text()


def test_more_problems_than_before_are_played(frozen_run):
    from rlanything.flows.evaluation import eval_flow

    run_dir = Path(frozen_run["run_dir"])
    result = eval_flow(f"{run_dir}@1", None, ["eval.rm=false"], "in_domain", 3)
    rows = {row["split"]: row for row in result["summary"]}
    assert "episodes_from" not in rows["in_domain"] and result["metrics"]["eval/in_domain/episodes_reused"] == 0
    assert rows["in_domain"]["n"] == 3
