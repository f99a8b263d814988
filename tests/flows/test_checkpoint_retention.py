"""`run.keep_checkpoints`: a three-iteration tiny run keeps only the newest checkpoints, reports
the bytes it wrote and keeps, and a run killed with `kill -9` after old checkpoints were deleted
still resumes to exactly the uninterrupted run's files."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from test_resume import TINY, assert_complete_like, cli, finish, logged_states  # helpers of the resume tests

from rlanything.pipeline import STEPS
from rlanything.storage.checkpoints import folder_bytes
from rlanything.storage.layout import RunLayout


@pytest.fixture(scope="module")
def kept_run(prefect_server, tmp_path_factory, small_overrides) -> tuple[dict, list[str]]:
    """Three uninterrupted iterations keeping one checkpoint: the reference of the resume test."""
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp("keep")
    overrides = [f"run.root={root}", "run.name=keep1", "run.keep_checkpoints=1", *small_overrides]
    # One judgment per step instead of tiny.yaml's 3: a third of the RM's scoring and training
    # rows, about a third less time per iteration. The RM still judges, trains and checkpoints
    # (with its AdamW state) every iteration, which is all these tests look at.
    overrides.append("rm.judgments_per_step=1")
    return train_flow(TINY, overrides, 3), overrides


def test_only_the_newest_checkpoint_and_optimizer_state_stay(kept_run):
    result, _ = kept_run
    layout = RunLayout(Path(result["run_dir"]))
    checkpoints = layout.run_dir / "checkpoints"
    for kind in ("policy", "rm"):
        assert sorted(p.name for p in (checkpoints / kind).iterdir()) == ["iter_0002"]
    assert sorted(p.relative_to(checkpoints).as_posix() for p in checkpoints.rglob("optimizer.pt")) == [
        "policy/iter_0002/optimizer.pt",
        "rm/iter_0002/optimizer.pt",
    ]
    removed = [json.loads(line) for line in (checkpoints / "pruned.jsonl").read_text().splitlines()]
    assert [(r["after_iteration"], r["removed"]) for r in removed] == [
        (1, "checkpoints/policy/iter_0000"),
        (1, "checkpoints/rm/iter_0000"),
        (2, "checkpoints/policy/iter_0001"),
        (2, "checkpoints/rm/iter_0001"),
    ]

    # Bytes written per kind: in each iteration's summary (the newest still on disk, exactly).
    for iteration in range(3):
        summary = json.loads((layout.iter_dir(iteration) / "summary.json").read_text())
        for kind in ("policy", "rm"):
            written = summary[f"checkpoint/{kind}_bytes_written"]
            assert written > 12 * 2**20  # fp32 weights (12.3 MiB) + AdamW moments (2 × that)
            if iteration == 2:
                assert written == folder_bytes(layout.checkpoint(kind, 2))
    client = MlflowClient(result["mlflow_uri"])
    run_id = result["mlflow_run_id"]
    on_disk = {m.step: m.value for m in client.get_metric_history(run_id, "checkpoint/bytes_on_disk")}
    assert sorted(on_disk) == [0, 1, 2] and on_disk[2] == folder_bytes(checkpoints)
    assert on_disk[1] == pytest.approx(on_disk[2], rel=0.01)  # bounded: one iteration's worth after each
    removed_bytes = {m.step: m.value for m in client.get_metric_history(run_id, "checkpoint/bytes_removed")}
    assert removed_bytes[0] == 0 and removed_bytes[1] > 0 and removed_bytes[2] > 0
    written = client.get_metric_history(run_id, "checkpoint/policy_bytes_written")
    assert sorted(m.step for m in written) == [0, 1, 2]


@pytest.mark.slow
def test_killed_after_old_checkpoints_were_deleted_resumes_exactly(kept_run, prefect_api_url):
    """kill -9 in iteration 2's policy_update after it wrote its checkpoint (iteration 0's are
    gone by then): the resume re-runs the update from iteration 1's weights and AdamW state and
    ends with exactly the uninterrupted run's Parquet tables and checkpoint."""
    from rlanything.flows.training import train_flow

    result, overrides = kept_run
    reference = Path(result["run_dir"])
    root = reference.parent
    overrides = [o.replace("run.name=keep1", "run.name=killed") for o in overrides]
    layout = RunLayout(root / "killed")
    sets = [a for o in overrides for a in ("--set", o)]
    proc = cli(["train", "-c", TINY, *sets, "-n", "3"], prefect_api_url, fault="sigkill:policy_update@2:end")
    out = finish(proc, timeout=600)
    assert proc.returncode == -signal.SIGKILL, out[-3000:]
    assert logged_states(out, 2) == {s: "Completed" for s in STEPS[:4]}, out[-3000:]  # died in policy_update
    for kind in ("policy", "rm"):
        assert not layout.checkpoint(kind, 0).exists()  # pruned after iteration 1
        assert (layout.checkpoint(kind, 1) / "optimizer.pt").is_file()  # what iteration 2 resumes from
    assert (layout.checkpoint("policy", 2) / "config.json").is_file()  # written, but the step never finished

    train_flow(TINY, overrides, 3)
    assert_complete_like(layout.run_dir, reference)  # every Parquet table, the checkpoint and AdamW state
    for kind in ("policy", "rm"):
        assert sorted(p.name for p in (layout.run_dir / "checkpoints" / kind).iterdir()) == ["iter_0002"]
