"""The reward-hacking alarm through a real iteration: metrics, the λ switch, summary and MLflow."""

import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from rlanything.storage import schemas
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table

REPO = Path(__file__).resolve().parents[2]


def test_a_flagged_rm_switches_the_policy_to_outcomes_and_says_so(prefect_server, tmp_path, small_overrides):
    from rlanything.flows.training import train_flow

    # a gap above -2.5 always holds (gaps lie in [-2, 2]): every iteration is flagged
    guard = ["algo.rm_guard.max_score_gap=-2.5", "algo.rm_guard.min_trajectories=1"]
    fallback = "algo.rm_guard.outcome_only_when_flagged=true"
    config = str(REPO / "configs" / "tiny.yaml")
    result = train_flow(config, [f"run.root={tmp_path}", "run.name=guard", *small_overrides, *guard, fallback], 1)
    layout = RunLayout(Path(result["run_dir"]))
    summary = json.loads((layout.iter_dir(0) / "summary.json").read_text())
    assert summary["rm_guard/alarm"] == 1 and summary["rm_guard/lam"] == 0.0

    outcomes = read_table(layout.artifact(0, "outcomes"), schemas.OUTCOMES).set_index("traj_id").outcome
    judged = read_table(layout.artifact(0, "judgments"), schemas.JUDGMENTS)
    policy = read_table(layout.artifact(0, "advantages"), schemas.ADVANTAGES).query("kind == 'policy'")
    assert (policy.reward == policy.traj_id.map(outcomes)).all()  # λ = 0: R = O
    # the trajectory outcome accuracy, by a plain loop over the Parquet rows
    right = []
    for traj_id, rows in judged.groupby("traj_id"):
        means = [g.step_score[g.parsed].mean() if g.parsed.any() else 0.0 for _, g in rows.groupby("step_idx")]
        mean = sum(means) / len(means)
        right.append((mean > 0 and outcomes[traj_id] == 1) or (mean < 0 and outcomes[traj_id] == -1))
    assert summary["rm/outcome_accuracy"] == sum(right) / len(right)
    assert "Reward model flagged" in (layout.iter_dir(0) / "summary.md").read_text()
    client = MlflowClient(result["mlflow_uri"])
    assert [m.value for m in client.get_metric_history(result["mlflow_run_id"], "rm_guard/alarm")] == [1.0]
