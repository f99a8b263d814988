"""`rlanything eval` through real Prefect and a real MLflow store: inside a tiny training run
(`eval.every: 1`), on a chosen checkpoint, on a bare model, and from the command line."""

import json
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from rlanything.algo.rm_accuracy import outcome_prediction
from rlanything.cli import app
from rlanything.metric_names import RM_MEASURES
from rlanything.reports.eval_report import eval_history
from rlanything.storage.parquet import read_table
from rlanything.storage.schemas import EVAL_EPISODES, EVAL_JUDGMENTS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reports"))  # the reports' pixel checks
from pictures import assert_every_panel_drawn, panels  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(scope="module")
def evaluated_run(prefect_server, tmp_path_factory, small_overrides):
    """tiny.yaml at its smallest, two iterations, held-out evaluation of the base model and after each."""
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp("eval-run")
    overrides = [f"run.root={root}", "run.name=evaluated", *small_overrides, "eval.every=1", "eval.problems=3"]
    return train_flow(str(REPO / "configs" / "tiny.yaml"), overrides, 2)


def test_training_evaluates_every_iteration_and_draws_the_curves(evaluated_run):
    run_dir = Path(evaluated_run["run_dir"])
    walls = []
    for iteration, folder, weights in (
        (-1, "base", "builtin:tiny-random"),
        (0, "iter_0000", "checkpoints/policy/iter_0000"),
        (1, "iter_0001", "checkpoints/policy/iter_0001"),
    ):
        out = run_dir / "eval" / folder
        episodes = read_table(out / "episodes.parquet", EVAL_EPISODES)  # the declared schema, checked
        assert episodes.groupby("split").size().to_dict() == {"in_domain": 3, "ood": 3}
        assert set(episodes.weights) == {weights}
        assert (episodes.iteration == iteration).all() and episodes.valid.all()
        assert (episodes.num_steps == 1).all() and (episodes.response_tokens > 0).all()
        summary = (out / "summary.md").read_text()
        assert "| in_domain | reasoning_gym | 3 |" in summary and "| ood | reasoning_gym | 3 |" in summary
        panels(out / "eval.png", (560, 320))  # a PNG at its figure's size (the bars' heights: test_eval_report)
        assert not (out / "in_domain.parquet").exists()  # merged into episodes.parquet
        walls.append(json.loads((out / "summary.json").read_text())["wall_time_s"])
    assert walls[0] == 0 < walls[1] < walls[2]  # training seconds: the curve's x against wall time
    for folder in ("base", "iter_0000", "iter_0001"):  # the policy trained: every evaluation played its episodes
        rows = json.loads((run_dir / "eval" / folder / "summary.json").read_text())["splits"]
        assert len({row["play_key"] for row in rows}) == 2 and not [row for row in rows if "episodes_from" in row]
    # accuracy against iteration and against wall time: each panel draws the splits' lines and CI bands
    assert_every_panel_drawn(run_dir / "eval_curves.png", (1040, 360), (1, 2))
    client = MlflowClient(evaluated_run["mlflow_uri"])
    run_id = evaluated_run["mlflow_run_id"]
    for key in (
        "eval/in_domain/accuracy",
        "eval/ood/accuracy",
        "eval/in_domain/strict_accuracy",
        "eval/in_domain/ci_high",
        "eval/ood/format_rate",
        "eval/in_domain/n",
    ):
        history = client.get_metric_history(run_id, key)
        assert sorted(m.step for m in history) == [-1, 0, 1], key
    assert {m.value for m in client.get_metric_history(run_id, "eval/in_domain/n")} == {3.0}
    assert {m.value for m in client.get_metric_history(run_id, "eval/ood/episodes_reused")} == {0.0}
    ci_high = client.get_metric_history(run_id, "eval/in_domain/ci_high")
    assert all(0.5 < m.value <= 1.0 for m in ci_high)  # Wilson upper bound of ≤ 3 successes in 3
    names = {Path(a.path).name for a in client.list_artifacts(run_id, "eval/iter_0001")}
    assert {"episodes.parquet", "summary.md", "eval.png", "summary.json"} <= names
    assert "eval_curves.png" in {a.path for a in client.list_artifacts(run_id)}


def test_the_rm_of_each_checkpoint_judges_the_held_out_episodes(evaluated_run):
    run_dir = Path(evaluated_run["run_dir"])
    client = MlflowClient(evaluated_run["mlflow_uri"])
    for folder, rm in (
        ("base", "builtin:tiny-random?seed=1"),  # tiny.yaml's rm.model
        ("iter_0000", "checkpoints/rm/iter_0000"),
        ("iter_0001", "checkpoints/rm/iter_0001"),
    ):
        out = run_dir / "eval" / folder
        episodes = read_table(out / "episodes.parquet", EVAL_EPISODES)
        judgments = read_table(out / "judgments.parquet", EVAL_JUDGMENTS)  # the declared schema, checked
        assert len(judgments) == episodes[episodes.valid].num_steps.sum() * 3  # every step, m = 3 times
        assert set(judgments.weights) == {rm} and not list(out.glob("*.judgments.parquet"))  # parts merged
        rows = {row["split"]: row for row in json.loads((out / "summary.json").read_text())["splits"]}
        for split, eps in episodes.groupby("split"):
            judged = judgments[judgments.split == split]
            expected = outcome_prediction(
                judged.problem_idx.to_numpy(),
                judged.step_idx.to_numpy(),
                judged.step_score.to_numpy(),
                judged.parsed.to_numpy(),
                dict(zip(eps.problem_idx, eps.outcome)),
            )
            expected = {
                "rm_step_accuracy": expected["step_accuracy"],
                "rm_outcome_accuracy": expected["trajectory_accuracy"],
                "rm_outcome_auroc": expected["auroc"],  # NaN (null) while no episode succeeds
                "rm_outcome_auroc_low": expected["auroc_low"],  # NaN (null): 3 episodes, too few
                "rm_outcome_auroc_high": expected["auroc_high"],
                "rm_score_gap": expected["score_gap"],
                "rm_judged": expected["trajectories"],
                "rm_solved_judged": expected["positives"],
                "rm_unsolved_judged": expected["negatives"],
                "rm_parse_rate": judged.parsed.mean(),
            }
            last = judged.problem_idx.map(dict(zip(eps.problem_idx, eps.num_steps - 1)))
            early = judged[judged.step_idx < last]  # the steps before each episode's last: the win message left out
            before = outcome_prediction(
                *(early[c].to_numpy() for c in ("problem_idx", "step_idx", "step_score", "parsed")),
                dict(zip(eps.problem_idx, eps.outcome)),
            )
            expected |= {f"rm_outcome_before_last_{k}": before[k] for k in ("auroc", "auroc_low", "auroc_high")}
            expected["rm_judged_before_last"] = before["trajectories"]
            known = judged.p_plus.dropna()  # tiny.yaml's verdicts are decoded in the pass: none recorded
            expected["rm_p_plus_mean"] = known.mean() if len(known) else float("nan")
            assert {k: rows[split][k] for k in RM_MEASURES} == {
                k: None if v != v else pytest.approx(v) for k, v in expected.items()
            }
            assert rows[split]["rm_judged"] == 3
        assert "## Reward model" in (out / "summary.md").read_text()
    history = eval_history(run_dir)
    assert len(history) == 6 and history.rm_outcome_accuracy.notna().all() and history.rm_judged.eq(3).all()
    for key in ("eval/in_domain/rm_outcome_accuracy", "eval/ood/rm_step_accuracy", "eval/ood/rm_parse_rate"):
        assert sorted(m.step for m in client.get_metric_history(evaluated_run["mlflow_run_id"], key)) == [-1, 0, 1]
    names = {Path(a.path).name for a in client.list_artifacts(evaluated_run["mlflow_run_id"], "eval/iter_0001")}
    assert "judgments.parquet" in names


def test_the_same_problems_for_every_checkpoint_and_none_from_training(evaluated_run):
    from rlanything.agent.eval_play import trained_specs

    run_dir = Path(evaluated_run["run_dir"])
    base, first, second = (
        read_table(run_dir / "eval" / name / "episodes.parquet", EVAL_EPISODES)
        for name in ("base", "iter_0000", "iter_0001")
    )
    assert base.spec.tolist() == first.spec.tolist() == second.spec.tolist()  # comparable points on the curve
    seen = {s["seed"] for s in trained_specs(str(run_dir))}
    assert seen and not seen & {json.loads(spec)["seed"] for spec in first.spec}


def test_eval_of_a_bare_model_gets_its_own_mlflow_run(evaluated_run, tmp_path):
    from rlanything.flows.evaluation import eval_flow

    config = Path(evaluated_run["run_dir"]) / "config.yaml"
    result = eval_flow("builtin:tiny-random", str(config), [], "ood", 2)
    assert result["mlflow_run_id"] != evaluated_run["mlflow_run_id"]
    episodes = read_table(Path(result["out_dir"]) / "episodes.parquet", EVAL_EPISODES)
    assert episodes.split.tolist() == ["ood", "ood"] and episodes.iteration.isna().all()
    client = MlflowClient(result["mlflow_uri"])
    assert [m.step for m in client.get_metric_history(result["mlflow_run_id"], "eval/ood/accuracy")] == [0]
    judgments = read_table(Path(result["out_dir"]) / "judgments.parquet", EVAL_JUDGMENTS)
    assert set(judgments.weights) == {"builtin:tiny-random?seed=1"} and judgments.iteration.isna().all()  # rm.model
    assert len(judgments) == 2 * 3 and result["summary"][0]["rm_judged"] == 2

    off = eval_flow("builtin:tiny-random", str(config), ["eval.rm=false"], "ood", 2)  # the policy alone
    out = Path(off["out_dir"])
    assert out == Path(result["out_dir"]) and not (out / "judgments.parquet").exists()  # the earlier one removed
    assert not [k for k in off["summary"][0] if k.startswith("rm_")] and not [k for k in off["metrics"] if "/rm_" in k]
    assert "## Reward model" not in (out / "summary.md").read_text()
    assert off["mlflow_run_id"] == result["mlflow_run_id"]  # the same model and config: its run
    history = lambda key: client.get_metric_history(off["mlflow_run_id"], key)  # noqa: E731
    assert len(history("eval/ood/accuracy")) == 2 and len(history("eval/ood/rm_outcome_accuracy")) == 1


@pytest.fixture
def wide_console(monkeypatch):
    from rlanything import cli

    monkeypatch.setattr(cli.console, "width", 250)  # rich wraps at 80 columns without a terminal


@pytest.fixture
def narrow_console(monkeypatch):
    from rlanything import cli

    monkeypatch.setattr(cli.console, "width", 80)  # an 80-column terminal, or a pipe (rich's default)


def test_cli_prints_the_table(evaluated_run, narrow_console):
    run_dir = evaluated_run["run_dir"]
    result = runner.invoke(app, ["eval", f"{run_dir}@0", "--split", "in_domain", "--problems", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "…" not in result.output and max(map(len, lines)) <= 80, result.output  # nothing cut
    assert any("accuracy [95% CI]" in line for line in lines) and "in_domain" in result.output
    # the RM judged (eval.rm): 2 episodes, none solved
    for cell in ("RM outcome accuracy", "RM AUROC [95% CI]", "n/a (too few)", "2 (0 solved)"):
        assert any(cell in line for line in lines), (cell, result.output)
    # 2 problems: one of the three Wilson intervals of k/2 (by hand: 0/2 -> [0, 0.6576], 1/2 -> [0.0945, 0.9055])
    assert any(
        cell in line
        for line in lines
        for cell in ("0.0% [0.0%, 65.8%]", "50.0% [9.5%, 90.5%]", "100.0% [34.2%, 100.0%]")
    )
    episodes = read_table(Path(run_dir) / "eval" / "iter_0000" / "episodes.parquet", EVAL_EPISODES)
    assert (episodes.split == "in_domain").sum() == 2  # replaced by this evaluation's 2 problems
    assert (episodes.split == "ood").sum() == 3  # training's evaluation of the other split, kept


def test_cli_names_what_is_missing(evaluated_run, tmp_path, wide_console):
    run_dir = evaluated_run["run_dir"]
    cases = [
        ([f"{tmp_path}/nowhere"], "no run at"),
        ([f"{run_dir}@7"], "has no policy checkpoint of iteration 7 (checkpoints: [0, 1])"),
        ([f"{run_dir}@last"], "must be a number"),
        (["builtin:tiny-random"], "give the environment with -c CONFIG"),
        (["builtin:no-such-model", "-c", str(REPO / "configs" / "tiny.yaml")], "unknown builtin model"),
        ([run_dir, "--split", "test"], "--split must be in_domain, ood or all"),
    ]
    empty = tmp_path / "fresh"
    empty.mkdir()
    (empty / "config.yaml").write_text((Path(run_dir) / "config.yaml").read_text())
    cases.append(([str(empty)], "has no policy checkpoint yet"))
    for args, message in cases:
        result = runner.invoke(app, ["eval", *args], terminal_width=300)
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)
