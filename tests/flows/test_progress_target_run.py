"""One iteration of configs/tiny-textworld.yaml with `algo.rm_target: progress`, through real
Prefect, MLflow and Parquet: rm_score values a sample of steps by playing on from the states
around them (agent.branching), writes progress.parquet, and the RM is paid for those steps only."""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("textworld", reason="textworld is not installed (pip install textworld==1.7.0)")

from rlanything.storage import schemas  # noqa: E402
from rlanything.storage.layout import RunLayout  # noqa: E402
from rlanything.storage.parquet import read_table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def progress_run(root: Path, name: str, *overrides: str) -> dict:
    """One iteration of configs/tiny-textworld.yaml with the RM paid for progress."""
    from rlanything.flows.training import train_flow

    base = [
        f"run.root={root}",
        f"run.name={name}",
        "run.iterations=1",
        "env.num_problems=2",
        "policy.tasks_per_iteration=2",
        "rm.judgments_per_step=2",
        "env.max_steps=3",
        "adapt.enabled=false",
        "algo.rm_target=progress",
    ]
    return train_flow(str(REPO / "configs" / "tiny-textworld.yaml"), [*base, *overrides])


@pytest.fixture(scope="module")
def run(prefect_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return progress_run(root, "tw-progress", "policy.group_size=2", "algo.progress_steps=3", "algo.progress_k=2")


def test_sampled_steps_are_valued_and_only_their_judgments_are_paid(run):
    layout = RunLayout(Path(run["run_dir"]))
    steps = read_table(layout.artifact(0, "rollouts"), schemas.ROLLOUTS)
    outcomes = read_table(layout.artifact(0, "outcomes"), schemas.OUTCOMES).set_index("traj_id")
    progress = read_table(layout.artifact(0, "progress"), schemas.PROGRESS)
    metrics = json.loads((layout.iter_dir(0) / "summary.json").read_text())
    # up to 3 steps before their episode's last whose 2 verdicts differ, each valued before and after
    judgments = read_table(layout.artifact(0, "judgments"), schemas.JUDGMENTS)
    kinds = judgments.groupby(["traj_id", "step_idx"])[["step_score", "parsed"]].nunique().max(axis=1)
    split = {(t, s) for (t, s), n in kinds.items() if n > 1 and s < outcomes.num_steps[t] - 1}
    assert 1 <= len(progress) == min(3, len(split)) == metrics["progress/steps"]
    assert all((t, s) in split for t, s in zip(progress.traj_id, progress.step_idx))
    assert (progress.step_idx < progress.traj_id.map(outcomes.num_steps) - 1).all()
    assert len(progress.merge(steps, on=["traj_id", "step_idx"])) == len(progress)
    both = progress.dropna()
    assert np.allclose(both.progress, both.value_after - both.value_before)
    assert set(np.r_[progress.value_before, progress.value_after]) <= {-1.0, -0.0, 0.0, 1.0}  # K = 2: ±1 or 0
    # each state (a step's before and after, shared ones once) played K = 2 times, no replay off course
    states = {(t, k) for t, s in zip(progress.traj_id, progress.step_idx) for k in (s, s + 1)}
    assert metrics["progress/continuations"] == 2 * len(states)
    assert metrics["progress/replay_mismatch"] == 0 and metrics["progress/env_errors"] == 0
    # the RM's samples: only valued steps with a progress other than 0 can train
    adv = read_table(layout.artifact(0, "advantages"), schemas.ADVANTAGES)
    rm = adv[adv.kind == "rm"]
    paid = {(t, s) for t, s, g in zip(progress.traj_id, progress.step_idx, progress.progress) if g == g and g != 0}
    unpaid = ~np.array([(t, s) in paid for t, s in zip(rm.traj_id, rm.step_idx)])
    assert (rm.drop_reason[unpaid] == "no_target").all() and not rm.kept[unpaid].any()
    assert metrics["samples/rm_kept"] == int(rm.kept.sum())


@pytest.fixture(scope="module")
def siblings_run(prefect_server, tmp_path_factory):
    """The values read from the episodes themselves: no continuation played, and
    `progress_steps` does not apply (set to 1, below the steps that can train). The RM paid its
    reward itself (`algo.rm_advantage`), so steps whose verdicts agree can train too, and balanced
    (tiny random models lose every game here: its advantages are checked by hand in
    tests/algo/test_samples.py)."""
    root = tmp_path_factory.mktemp("runs")
    overrides = ["algo.progress_source=siblings", "algo.progress_steps=1", "algo.rm_advantage=reward"]
    return progress_run(root, "tw-siblings", "policy.group_size=4", "algo.rm_balance=true", *overrides)


def test_siblings_value_every_trainable_step_from_the_episodes_that_passed_its_states(siblings_run):
    from rlanything.algo.curriculum import tasks_in_bands
    from rlanything.config import load_config

    layout = RunLayout(Path(siblings_run["run_dir"]))
    config = load_config(layout.run_dir / "config.yaml")
    steps = read_table(layout.artifact(0, "rollouts"), schemas.ROLLOUTS).sort_values(["traj_id", "step_idx"])
    outcomes = read_table(layout.artifact(0, "outcomes"), schemas.OUTCOMES).set_index("traj_id")
    progress = read_table(layout.artifact(0, "progress"), schemas.PROGRESS)
    judgments = read_table(layout.artifact(0, "judgments"), schemas.JUDGMENTS)
    metrics = json.loads((layout.iter_dir(0) / "summary.json").read_text())
    assert not any(key.startswith("progress/continuations") for key in metrics)  # nothing played
    # every judged step before its episode's last in a task inside the band, unanimous verdicts too
    band = tasks_in_bands(outcomes.outcome.to_numpy(), outcomes.task_id.to_numpy(), config.algo.band)
    judged = set(zip(judgments.traj_id, judgments.step_idx))
    trainable = {(t, s) for t, s in judged if s < outcomes.num_steps[t] - 1 and outcomes.task_id[t] in band}
    kinds = judgments.groupby(["traj_id", "step_idx"])[["step_score", "parsed"]].nunique().max(axis=1)
    assert any(kinds[key] == 1 for key in trainable)  # a step whose verdicts agree is valued too
    assert set(zip(progress.traj_id, progress.step_idx)) == trainable
    assert len(progress) == metrics["progress/steps"] and len(trainable) > 1  # more than progress_steps
    # V(after k steps): the mean outcome of the task's episodes whose first k (action, observation)
    # pairs are this episode's, recomputed here by brute force (tiny random models lose every
    # game, so the values here are all -1: tests/agent/test_sibling_progress.py has won ones)
    events = {t: list(zip(g.action, g.observation)) for t, g in steps.groupby("traj_id")}

    def value(t: int, k: int) -> float:
        if k == outcomes.num_steps[t]:
            return float(outcomes.outcome[t])
        same = [u for u in events if outcomes.task_id[u] == outcomes.task_id[t] and events[u][:k] == events[t][:k]]
        return float(np.mean([outcomes.outcome[u] for u in same if outcomes.valid[u]]))

    for t, s, before, after, gain in progress.itertuples(index=False):
        assert (before, after) == (value(t, s), value(t, s + 1))
        assert gain == after - before
