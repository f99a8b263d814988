"""Two iterations of the tiny MiniWoB++ config through real Prefect, MLflow, Parquet and Chromium:
multi-step web episodes, one rollouts.parquet row per step with its screenshot, every step judged."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from rlanything.storage import schemas
from rlanything.storage.buffer import read_buffer
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(prefect_server, tmp_path_factory):
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp("runs")
    overrides = [f"run.root={root}", "run.name=miniwob", "policy.tasks_per_iteration=2", "policy.group_size=2"]
    return train_flow(str(REPO / "configs" / "tiny-miniwob.yaml"), overrides)


def test_multi_step_web_episodes_leave_one_row_per_step(run):
    layout = RunLayout(Path(run["run_dir"]))
    for iteration in (0, 1):
        steps = read_table(layout.artifact(iteration, "rollouts"), schemas.ROLLOUTS)
        outcomes = read_table(layout.artifact(iteration, "outcomes"), schemas.OUTCOMES)
        judgments = read_table(layout.artifact(iteration, "judgments"), schemas.JUDGMENTS)
        regular = outcomes[~outcomes.pending]
        assert len(regular) == 2 * 2 and outcomes.valid.all()  # no browser failed
        assert set(outcomes.termination) <= {"done", "max_steps"}
        assert len(steps) == outcomes.num_steps.sum() and outcomes.num_steps.max() == 3  # max_steps
        assert set(steps.step_idx) == {0, 1, 2}
        assert steps.observation.str.startswith("Task: ").all()
        assert steps.observation.str.contains("Last action: ").all()
        later = steps[steps.step_idx == 2]
        # the policy's context at step 3 holds the page it saw after step 2
        for prompt, traj in zip(later.prompt, later.traj_id):
            seen = steps[(steps.traj_id == traj) & (steps.step_idx == 1)].observation.iloc[0]
            assert seen in prompt
        assert len(judgments.groupby(["traj_id", "step_idx"])) == (~steps.pending).sum()  # pending: not judged
    assert layout.iteration_done(1).exists()


def test_every_step_has_its_screenshot_in_the_run_folder_and_in_mlflow(run):
    layout, client = RunLayout(Path(run["run_dir"])), MlflowClient(run["mlflow_uri"])
    for iteration in (0, 1):
        folder = layout.iter_dir(iteration)
        steps = read_table(layout.artifact(iteration, "rollouts"), schemas.ROLLOUTS)
        episodes = read_table(layout.artifact(iteration, "episodes"), schemas.EPISODES)
        expected = {f"screenshots/t{t:05d}_s{s:02d}.png" for t, s in zip(steps.traj_id, steps.step_idx)}
        assert set(steps.screenshot) == expected  # one per step, none missing
        assert set(episodes.first_screenshot) == {f"screenshots/t{t:05d}_start.png" for t in episodes.traj_id}
        for name in expected | set(episodes.first_screenshot):
            assert Image.open(folder / name).size == (160, 210)
        logged = {
            Path(a.path).name for a in client.list_artifacts(run["mlflow_run_id"], f"iter_{iteration:04d}/screenshots")
        }
        assert logged == {Path(n).name for n in expected | set(episodes.first_screenshot)}
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["rollout/screenshots"] == len(logged) and summary["rollout/screenshot_errors"] == 0
        outcomes = read_table(layout.artifact(iteration, "outcomes"), schemas.OUTCOMES)
        assert set(outcomes.verified_by) <= {"replay", "step_cap"} and episodes.live_outcome.isna().all()
        assert "![the screen after step 0](screenshots/t" in (folder / "samples.md").read_text()


def test_rule_rewrites_become_pending_miniwob_variants_rolled_out_next_iteration(run):
    from rlanything.envs.miniwob import MiniWoBEnv

    layout = RunLayout(Path(run["run_dir"]))
    first = read_table(layout.artifact(0, "adaptation"), schemas.ADAPTATION)
    proposed = first[first.decision == "proposed"]
    assert len(proposed) == 2 and (proposed.direction == "easier").all()  # a random policy solves nothing
    specs = read_buffer(layout.tasks_snapshot(0)).set_index("task_id").spec
    for row in proposed.itertuples():
        parent, child = json.loads(specs[row.task_id]), json.loads(row.candidate_spec)
        easier = [new for way, _, new in MiniWoBEnv.variants(parent) if way == "easier"]
        assert child == easier[0]  # one rung down the family ladder, or the hint
    pending = read_table(layout.artifact(1, "outcomes"), schemas.OUTCOMES).query("pending")
    assert set(pending.task_id) == set(proposed.candidate_id) and pending.valid.all()
