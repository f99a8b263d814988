"""A whole run under `precision`: `auto` on a CPU without bf16 units is today's fp32 run file for
file; a bf16 sampler records its choice, recomputes the old log-probs and logs the mismatch."""

import json
from pathlib import Path

from mlflow.tracking import MlflowClient
from test_resume import TINY, assert_same_files  # helpers of the resume tests

from rlanything.flows.training import train_flow
from rlanything.models.precision import PRECISION_FILE
from rlanything.storage.artifacts import read_artifact
from rlanything.storage.layout import RunLayout

FP32 = ["policy.precision=fp32", "policy.optim.precision=fp32", "rm.precision=fp32", "rm.optim.precision=fp32"]


def test_auto_without_bf16_units_is_the_fp32_run_file_for_file(small_run, small_overrides, tmp_path):
    """small_run ran with every precision `auto` (the suite's CPU flags name no bf16 unit): its
    files equal those of a run that sets fp32 and the sampler's log-probs explicitly."""
    reference = Path(small_run["run_dir"])
    choices = json.loads((reference / PRECISION_FILE).read_text())
    assert {(use, c["precision"]) for uses in choices.values() for use, c in uses.items()} == {
        ("generation", "fp32"),
        ("update", "fp32"),
    }
    assert choices["policy"]["generation"]["reason"].startswith("auto: the CPU has no bf16 units")
    explicit = [f"run.root={tmp_path}", "run.name=small", *small_overrides, *FP32, "algo.old_logprobs=sampler"]
    result = train_flow(TINY, explicit, 1)
    assert assert_same_files(Path(result["run_dir"]), reference) >= 10
    assert read_artifact(RunLayout(reference), 0, "policy_update").mismatch_abs_mean.isna().all()


def test_a_bf16_sampler_is_recorded_and_its_mismatch_logged(prefect_server, small_overrides, tmp_path):
    sets = [f"run.root={tmp_path}", "run.name=bf16", *small_overrides, "policy.precision=bf16", "rm.precision=bf16"]
    result = train_flow(TINY, sets, 1)
    run_dir = Path(result["run_dir"])
    choices = json.loads((run_dir / PRECISION_FILE).read_text())
    assert choices["policy"]["generation"] == {"precision": "bf16", "reason": "set in the config"}
    assert choices["policy"]["update"]["precision"] == "fp32"  # auto, no bf16 units: fp32 update
    assert choices["env_model"]["generation"]["precision"] == "bf16"  # follows the policy
    client = MlflowClient(result["mlflow_uri"])
    mlrun = client.get_run(result["mlflow_run_id"])
    assert mlrun.data.params["precision.policy.generation"] == "bf16"
    assert mlrun.data.params["precision.rm.update"] == "fp32"
    layout = RunLayout(run_dir)
    for kind in ("policy", "rm"):
        steps = read_artifact(layout, 0, f"{kind}_update")
        assert len(steps) and steps.mismatch_abs_mean.notna().all(), kind
        # old log-probs recomputed by the trainer: its first step's ratios are exactly 1
        assert steps.kl.iloc[0] == 0.0, kind
        logged = client.get_metric_history(mlrun.info.run_id, f"mismatch/{kind}_abs_mean")
        assert [m.step for m in logged] == [0] and logged[0].value > 0, kind
        top = client.get_metric_history(mlrun.info.run_id, f"mismatch/{kind}_abs_max")[0].value
        assert top == float(steps[steps.epoch == 0].mismatch_abs_max.max()) >= logged[0].value
