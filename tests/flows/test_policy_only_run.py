"""A policy-only run (the ablation's policy-only arm: `rm.judgments_per_step 0`, the RM frozen,
λ 0, no adaptation) never loads or trains its RM, so it writes no RM weights: no
checkpoints/rm/. Its checkpoints are still evaluated (an evaluation that asks for an RM gets the
config's RM model, the weights such a checkpoint would have held), and it still resumes
(rm_update comes back Cached with no RM checkpoint beside its Parquet file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlanything.storage.artifacts import read_artifact
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table
from rlanything.storage.schemas import EVAL_EPISODES, EVAL_JUDGMENTS

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")
POLICY_ONLY = ["rm.judgments_per_step=0", "rm.optim.frozen=true", "algo.lam=0", "adapt.enabled=false"]


@pytest.fixture(scope="module")
def policy_only_run(prefect_server, tmp_path_factory, small_overrides) -> tuple[dict, list[str]]:
    """Two iterations of tiny.yaml at its smallest, as the policy-only arm runs it."""
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp("policy-only")
    overrides = [f"run.root={root}", "run.name=policy-only", *small_overrides, *POLICY_ONLY]
    return train_flow(TINY, overrides, 2), overrides


def test_no_rm_weights_are_written(policy_only_run):
    result, _ = policy_only_run
    layout = RunLayout(Path(result["run_dir"]))
    checkpoints = layout.run_dir / "checkpoints"
    assert sorted(p.relative_to(checkpoints).as_posix() for p in checkpoints.glob("*/iter_*")) == [
        "policy/iter_0000",
        "policy/iter_0001",
    ]
    assert {p.relative_to(checkpoints).parts[0] for p in checkpoints.rglob("*.safetensors")} == {"policy"}
    assert not (checkpoints / "rm").exists()
    for iteration in (0, 1):
        summary = json.loads((layout.iter_dir(iteration) / "summary.json").read_text())
        assert summary["checkpoint/rm_bytes_written"] == 0 and summary["rm/samples"] == 0
        assert summary["checkpoint/policy_bytes_written"] > 12 * 2**20  # fp32 weights + AdamW moments
        assert read_artifact(layout, iteration, "rm_update").empty


def test_a_checkpoint_is_evaluated_with_the_configs_rm(policy_only_run):
    """As the run's config says, no RM judges; asked to (`--set rm.judgments_per_step=1`), the
    config's RM model does: the weights the run never changed."""
    from rlanything.flows.evaluation import eval_flow

    result, _ = policy_only_run
    run_dir = Path(result["run_dir"])
    plain = eval_flow(f"{run_dir}@1", split="in_domain", problems=2)
    out = Path(plain["out_dir"])
    assert out == run_dir / "eval" / "iter_0001" and not (out / "judgments.parquet").exists()
    assert "rm_outcome_accuracy" not in plain["summary"][0]
    judged = eval_flow(f"{run_dir}@1", overrides=["rm.judgments_per_step=1"], split="in_domain", problems=2)
    episodes = read_table(out / "episodes.parquet", EVAL_EPISODES)
    judgments = read_table(out / "judgments.parquet", EVAL_JUDGMENTS)
    assert set(episodes.weights) == {"checkpoints/policy/iter_0001"}
    assert len(judgments) == episodes[episodes.valid].num_steps.sum() > 0  # every step, m = 1
    assert set(judgments.weights) == {"builtin:tiny-random?seed=1"}  # tiny.yaml's rm.model
    assert judged["summary"][0]["rm_judged"] == episodes.valid.sum()


def test_the_resume_takes_rm_update_from_its_record(policy_only_run):
    """Iteration 1 undone from its last step: the resume runs adapt_tasks only."""
    from rlanything.flows.training import train_flow

    result, overrides = policy_only_run
    layout = RunLayout(Path(result["run_dir"]))
    layout.iteration_done(1).unlink()
    layout.artifact(1, "adaptation").unlink()
    train_flow(TINY, overrides, 2)
    summary = (layout.iter_dir(1) / "summary.md").read_text()
    assert "rm_update (Cached)" in summary and "adapt_tasks (Completed)" in summary
    assert layout.iteration_done(1).exists() and not (layout.run_dir / "checkpoints" / "rm").exists()
