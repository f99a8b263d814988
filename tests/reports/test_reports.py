"""What a person reads: the per-iteration plots, markdown and trajectories in the run folder and
in MLflow, and the inspection notebook executed against a real tiny run."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from nbclient import NotebookClient

from rlanything import metric_names as names
from rlanything.reports.iteration_report import (
    CURVES,
    HEADLINE,
    accepted_counts,
    adaptation_history,
    metric_history,
    pick_trajectories,
    plot_tasks,
    render_trajectories,
    slot_accuracy,
    summary_markdown,
)
from rlanything.storage.layout import RunLayout

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the pixel checks beside this file
from pictures import assert_every_panel_drawn, coloured, panels, share_of  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VIEWS = ["curves.png", "tasks.png", "iteration.png", "summary.md", "samples.md"]


def test_the_reports_read_the_mlflow_keys_the_steps_log():
    # the names come from one table (rlanything.metric_names); the keys users chart stay as they were
    read = {key for keys in CURVES.values() for key in keys} | set(HEADLINE)
    assert read == {
        *("accuracy", "mean_outcome", "samples/policy_kept", "samples/rm_kept"),
        *(f"adapt/{k}" for k in ("proposed", "accepted", "rejected", "accepted_total")),
        *(f"{kind}/{m}" for kind in ("policy", "rm") for m in ("loss", "kl", "clip_frac", "entropy", "grad_norm")),
        *(f"{kind}/{m}" for kind in ("policy", "rm") for m in ("lr_last", "optimizer_steps")),
        *(f"rm/{m}" for m in ("agreement", "outcome_accuracy", "outcome_auroc", "parse_rate", "process_accuracy")),
        "rm/score_gap",
        *(f"unit_tests/{m}" for m in ("correct_rate", "parse_rate", "verdict_agreement")),
    }
    assert CURVES["Losses"] == ["policy/loss", "rm/loss"] and names.step_time("rm_score") == "time/rm_score_s"
    with pytest.raises(ValueError, match="no update metric"):
        names.update_metric("policy", "kl_loss")  # a name no step writes fails where it is written
    with pytest.raises(ValueError, match="no adaptation decision"):
        names.adapt_metric("accept")


def test_pick_trajectories_prefers_successes_then_one_per_task():
    outcomes = pd.DataFrame(
        {"traj_id": [0, 1, 2, 3, 4, 5], "task_id": ["a", "a", "b", "b", "c", "c"], "outcome": [-1, 1, -1, -1, -1, 1]}
    )
    assert pick_trajectories(outcomes, 3) == [1, 5, 2]
    assert pick_trajectories(outcomes, 5) == [1, 5, 2, 0, 4]
    assert pick_trajectories(outcomes.iloc[:0], 3) == []


def test_slot_accuracy_and_accepted_counts_by_hand(tmp_path):
    # slot 0 is too easy at iteration 0, its harder v1 is accepted at iteration 1 and active at 2;
    # slot 1's easier rewrite is rejected at iteration 1; nothing is judged at iteration 2
    rows = [
        (0, 0, 0, "regular", 1.0, "proposed"),
        (0, 1, 0, "regular", 0.0, "proposed"),
        (1, 0, 0, "regular", 0.875, "slot_busy"),
        (1, 1, 0, "regular", 0.125, "slot_busy"),
        (1, 0, 1, "pending", 0.5, "accepted"),
        (1, 1, 1, "pending", 0.0, "rejected"),
        (2, 0, 1, "regular", 0.5, "in_band"),
        (2, 1, 0, "regular", 0.25, "in_band"),
    ]
    history = pd.DataFrame(rows, columns=["iteration", "slot", "version", "role", "accuracy", "decision"])
    accuracy = slot_accuracy(history)
    assert accuracy.to_dict() == {
        0: {0: 1.0, 1: 0.875, 2: 0.5},
        1: {0: 0.0, 1: 0.125, 2: 0.25},
    }  # pending rows left out
    counts = accepted_counts(history)
    assert counts.to_dict("list") == {"accepted": [0, 1, 0], "rejected": [0, 1, 0], "accepted_total": [0, 1, 1]}
    assert list(counts.index) == [0, 1, 2]
    out = tmp_path / "run" / "iter_0002" / "tasks.png"
    out.parent.mkdir(parents=True)
    slots, slots_too, decisions = panels(plot_tasks(history, (0.2, 0.8), out), (1200, 400), (1, 3))
    assert min(coloured(slots), coloured(slots_too)) > 0.002  # the slots' accuracy lines (2/3 of the width)
    # iteration 1's stacked bar: one accepted rewrite (tab:green) under one rejected (tab:red, alpha 0.6)
    assert share_of(decisions, (44, 160, 44)) > 0.02 and share_of(decisions, (230, 125, 126)) > 0.02


def test_every_iteration_has_plots_markdown_and_samples_in_the_folder_and_in_mlflow(small_run):
    layout = RunLayout(Path(small_run["run_dir"]))
    client = MlflowClient(small_run["mlflow_uri"])
    for iteration in (0, 1):
        folder = layout.iter_dir(iteration)
        # PNGs at their figures' sizes (figsize × 80 dpi). curves.png: every panel shows data (a panel
        # whose metrics no step recorded says "not recorded", in black), even at iteration 0's single points
        assert_every_panel_drawn(folder / "curves.png", (1600, 640), (2, 4), least=0.0005)
        panels(folder / "tasks.png", (1200, 400))  # what it draws: test_slot_accuracy_and_accepted_counts_by_hand
        # iteration.png: advantages, RM verdicts vs outcomes, lengths (accuracy per task: bars of height 0
        # for this random model)
        assert min(coloured(cell) for cell in panels(folder / "iteration.png", (1440, 320), (1, 4))[1:]) > 0.02
        logged = {Path(a.path).name for a in client.list_artifacts(small_run["mlflow_run_id"], f"iter_{iteration:04d}")}
        assert set(VIEWS) <= logged, logged
        written = {p.name for p in folder.iterdir()}
        assert {*VIEWS, "summary.json", "DONE"} <= written and not [n for n in written if n.endswith(".tmp")]  # atomic
    assert {"curves.png", "tasks.png"} <= {
        a.path for a in client.list_artifacts(small_run["mlflow_run_id"])
    }  # latest, up front
    adaptation = adaptation_history(layout, 1)
    assert list(slot_accuracy(adaptation).index) == [0, 1]
    assert slot_accuracy(adaptation).shape[1] == adaptation[adaptation.iteration == 0].slot.nunique()

    history = metric_history(layout, 1)
    assert list(history.index) == [0, 1] and {"accuracy", "rm/agreement", "policy/kl", "adapt/accepted"} <= set(history)
    assert [title for title, keys in CURVES.items() if not set(keys) & set(history)] == []  # the steps' names
    summary = (layout.iter_dir(1) / "summary.md").read_text()
    assert "| accuracy |" in summary and "rollout (Completed)" in summary and "## Task adaptation" in summary
    assert summary == summary_markdown(
        layout,
        1,
        history,
        {
            s: "Completed"
            for s in ("rollout", "verify", "rm_score", "advantages", "policy_update", "rm_update", "adapt_tasks")
        },
    )
    samples = render_trajectories(layout, 1)
    assert samples.count("## Trajectory") == 3 and "**Judgments** (3)" in samples and "Prompt the policy saw" in samples


def test_the_inspection_notebook_runs_against_a_tiny_run(small_run, monkeypatch):
    monkeypatch.setenv("RLANYTHING_RUN_DIR", small_run["run_dir"])
    notebook = nbformat.read(REPO / "notebooks" / "inspect_run.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 4  # the plots were drawn inline
    text = "".join(o.get("text", "") for o in outputs)
    assert "2 finished iteration(s)" in text and "status FINISHED" in text


def test_without_plots_only_the_markdown_views_are_written(small_run, tmp_path):
    """`run.plots: false` (what most tests' runs use, for time): summary.md and samples.md, no PNG."""
    import shutil

    from rlanything.reports.iteration_report import write_reports

    run = Path(shutil.copytree(small_run["run_dir"], tmp_path / "small"))
    for png in run.rglob("*.png"):
        png.unlink()
    views = write_reports(RunLayout(run), 1, {}, (0.2, 0.8), plots=False)
    assert [v.name for v in views] == ["summary.md", "samples.md"] and all(v.stat().st_size for v in views)
    assert not list(run.rglob("*.png"))
