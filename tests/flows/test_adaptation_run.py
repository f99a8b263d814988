"""Three tiny iterations where every task is out of the band: rewrites are proposed, rolled out
as pending versions next iteration (without training on them) and accepted or rejected."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlanything.models.rewriters import extractive_summary, failed_steps
from rlanything.storage import schemas
from rlanything.storage.buffer import lineage, read_buffer
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(prefect_server, tmp_path_factory):
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp("runs")
    overrides = [
        f"run.root={root}",
        "run.name=adapt",
        "run.iterations=3",
        "env.num_problems=3",
        "policy.tasks_per_iteration=2",
        "policy.group_size=2",
        "adapt.rewriter=rule",
        "adapt.critic=extractive",
        "env.options.dataset_config.max_terms=3",
        "env.options.dataset_config.max_digits=2",
    ]
    result = train_flow(str(REPO / "configs" / "tiny.yaml"), overrides)
    return RunLayout(Path(result["run_dir"])), result


def adaptation(layout, iteration):
    return read_table(layout.artifact(iteration, "adaptation"), schemas.ADAPTATION)


def test_out_of_band_tasks_get_a_pending_rewrite(run):
    layout, _ = run
    first = adaptation(layout, 0)
    assert (first.role == "regular").all() and len(first) == 2
    assert (first.accuracy == 0).all() and (first.direction == "easier").all()  # random policy: never solved
    assert (first.decision == "proposed").all()
    art = {
        n: read_table(layout.artifact(0, n), getattr(schemas, n.upper())) for n in ("outcomes", "judgments", "rollouts")
    }
    for row in first.itertuples():
        of = {n: frame[frame.task_id == row.task_id] for n, frame in art.items()}
        items = failed_steps(of["outcomes"], of["judgments"], of["rollouts"], limit=4)
        assert row.critic_summary == extractive_summary(items)  # the RM's reasoning on all-(−1) steps
        parent = json.loads(read_buffer(layout.tasks_snapshot(0)).set_index("task_id").spec[row.task_id])
        child = json.loads(row.candidate_spec)
        assert child["config"]["max_terms"] == parent["config"]["max_terms"] - 1  # the rule's easier step
    pending = read_buffer(layout.tasks_snapshot(1)).query("status == 'pending'")
    assert sorted(pending.task_id) == sorted(first.candidate_id)
    assert (pending.parent_accuracy == 0).all() and (pending.created_iter == 1).all()


def test_pending_versions_are_rolled_out_but_never_trained(run):
    layout, _ = run
    candidates = set(adaptation(layout, 0).candidate_id)
    outcomes = read_table(layout.artifact(1, "outcomes"), schemas.OUTCOMES)
    assert set(outcomes[outcomes.pending].task_id) == candidates
    assert (outcomes[outcomes.pending].groupby("task_id").size() == 2).all()  # G rollouts each
    judged = read_table(layout.artifact(1, "judgments"), schemas.JUDGMENTS)
    samples = read_table(layout.artifact(1, "advantages"), schemas.ADVANTAGES)
    assert not set(judged.task_id) & candidates and not set(samples.task_id) & candidates


def test_pending_versions_are_judged_with_their_numbers(run):
    layout, _ = run
    second = adaptation(layout, 1)
    judged = second[second.role == "pending"]
    assert sorted(judged.task_id) == sorted(adaptation(layout, 0).candidate_id)
    # a random policy solves nothing: acc(q') = 0 fails "acc(q') > 0"
    assert (judged.accuracy == 0).all() and (judged.parent_accuracy == 0).all()
    assert (judged.decision == "rejected").all() and (judged.reason == "zero_accuracy").all()
    buffer = read_buffer(layout.tasks_snapshot(2)).set_index("task_id")
    assert (buffer.loc[judged.task_id, "status"] == "rejected").all()
    assert (buffer.loc[judged.task_id, "decided_iter"] == 1).all()


def test_snapshots_reconstruct_the_buffer_at_every_iteration(run):
    layout, _ = run
    snapshots = [read_buffer(layout.tasks_snapshot(i)) for i in range(4)]
    assert len(snapshots[0]) == 3 and (snapshots[0].status == "active").all()
    for before, after in zip(snapshots, snapshots[1:]):
        assert set(before.task_id) <= set(after.task_id)  # versions are never dropped
        assert (after.groupby("slot").apply(lambda s: (s.status == "active").sum(), include_groups=False) == 1).all()
    slot = int(adaptation(layout, 0).slot.iloc[0])
    history = lineage(snapshots[3], slot)
    assert history.version.tolist() == list(range(len(history))) and len(history) >= 2
    assert (history.parent_id.iloc[1:] == history.task_id.iloc[0]).all()


def test_adaptation_metrics_reach_mlflow(run):
    _, result = run
    client = MlflowClient(result["mlflow_uri"])
    proposed = client.get_metric_history(result["mlflow_run_id"], "adapt/proposed")
    rejected = client.get_metric_history(result["mlflow_run_id"], "adapt/rejected_zero_accuracy")
    assert [m.value for m in sorted(proposed, key=lambda m: m.step)][0] == 2
    assert sum(m.value for m in rejected) >= 2
    assert {m.step for m in client.get_metric_history(result["mlflow_run_id"], "adapt/accepted_total")} == {0, 1, 2}
