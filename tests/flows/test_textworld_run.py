"""Two iterations of configs/tiny-textworld.yaml through real Prefect, MLflow and Parquet:
multi-step TextWorld episodes, one rollouts row per step, m judgments per step."""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("textworld", reason="textworld is not installed (pip install textworld==1.7.0)")

from rlanything.algo.rm_accuracy import auroc, process_auroc  # noqa: E402
from rlanything.storage import schemas  # noqa: E402
from rlanything.storage.layout import RunLayout  # noqa: E402
from rlanything.storage.parquet import read_table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(prefect_server, tmp_path_factory):
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp("runs")
    overrides = [
        f"run.root={root}",
        "run.name=tw",
        "env.num_problems=2",
        "policy.tasks_per_iteration=2",
        "policy.group_size=2",
        "rm.judgments_per_step=2",
        "env.max_steps=3",
        "rm.train_forced_tokens=false",  # the text games' RM trains the tokens it chose
    ]
    return train_flow(str(REPO / "configs" / "tiny-textworld.yaml"), overrides)


def first_prompts(steps, later) -> int:
    """Tokens of each later step's previous prompt: at least what its prompt reuses."""
    prev = steps.set_index(["traj_id", "step_idx"]).prompt_tokens
    return int(sum(prev[(t, k - 1)] for t, k in zip(later.traj_id, later.step_idx)))


def test_multi_step_rows_and_per_step_judgments(run):
    layout = RunLayout(Path(run["run_dir"]))
    for iteration in (0, 1):
        steps = read_table(layout.artifact(iteration, "rollouts"), schemas.ROLLOUTS)
        outcomes = read_table(layout.artifact(iteration, "outcomes"), schemas.OUTCOMES)
        judgments = read_table(layout.artifact(iteration, "judgments"), schemas.JUDGMENTS)
        assert (~outcomes.pending).sum() == 2 * 2 and outcomes.valid.all() and set(outcomes.outcome) <= {-1, 1}
        assert len(steps) == outcomes.num_steps.sum()
        per_traj = steps.groupby("traj_id").step_idx.apply(sorted)
        assert all(idx == list(range(len(idx))) for idx in per_traj)  # 0, 1, 2, ... per trajectory
        assert per_traj.map(len).max() >= 2  # multi-step episodes (a random policy rarely wins at once)
        assert steps.observation.str.contains("Valid commands:|Nothing happens|The End", regex=True).all()
        assert steps.prompt.str.contains("Goal: ").all()
        # A later step's prompt holds the earlier observations and responses: the context grows.
        two = steps[steps.step_idx == 1].iloc[0]
        first = steps[(steps.traj_id == two.traj_id) & (steps.step_idx == 0)].iloc[0]
        assert first.observation in two.prompt and len(two.prompt_ids) > len(first.prompt_ids)
        per_step = judgments.groupby(["traj_id", "step_idx"]).size()
        assert len(per_step) == (~steps.pending).sum() and (per_step == 2).all()  # m judgments of every step
        adv = read_table(layout.artifact(iteration, "advantages"), schemas.ADVANTAGES)
        assert (adv.kind == "policy").sum() == len(steps[~steps.pending])
        # from the second turn on, a prompt's history came from the KV kept from the turn before
        metrics = json.loads((layout.iter_dir(iteration) / "summary.json").read_text())
        later = steps[steps.step_idx > 0]
        assert metrics["tokens/policy_prompt"] == steps.prompt_tokens.sum()
        assert later.prompt_tokens.sum() > metrics["tokens/policy_prompt_reused"] >= first_prompts(steps, later)
        assert metrics["tokens/rm_prompt"] == judgments.prompt_ids.map(len).sum()
        assert all(0.05 < metrics[f"memory/{step}_peak_rss_gb"] < 24 for step in ("rollout", "rm_score", "rm_update"))
        assert all(
            0.05
            < metrics[f"memory/{s}_start_rss_gb"]
            < metrics[f"memory/{s}_peak_rss_gb"] + 0.1  # taken before the reset
            for s in ("rollout", "verify")
        )
        # verify labelled every judged step (TextWorld's rule); advantages scored the RM on them
        labels = read_table(layout.artifact(iteration, "step_labels"), schemas.STEP_LABELS)
        judged = judgments[["traj_id", "step_idx"]].drop_duplicates()
        assert len(labels.merge(judged, on=["traj_id", "step_idx"])) == len(judged) == len(labels)
        assert set(labels.label) <= {-1, 1} and set(labels.rule) <= {"closer", "unchanged", "farther", "invalid"}
        verdicts = judgments[judgments.parsed].groupby(["traj_id", "step_idx"]).step_score.mean().map(np.sign)
        scored = labels.set_index(["traj_id", "step_idx"]).label
        right = (verdicts.reindex(scored.index).fillna(0) == scored).mean()  # a step nothing parsed: wrong
        assert metrics["rm/process_labels"] == len(labels) and metrics["rm/process_accuracy"] == pytest.approx(right)
        last = dict(zip(outcomes.traj_id, outcomes.num_steps - 1))
        early = labels[[last[t] != k for t, k in zip(labels.traj_id, labels.step_idx)]]
        truth = dict(zip(zip(early.traj_id, early.step_idx), early.label))
        cols = [judgments[c].to_numpy() for c in ("traj_id", "step_idx", "step_score", "parsed")]
        expected = process_auroc(*cols, truth)["auroc"]
        assert metrics.get("rm/process_auroc_before_last", np.nan) == pytest.approx(expected, nan_ok=True)
        progress = {k: r for k, r in zip(zip(early.traj_id, early.step_idx), early.rule) if r != "unchanged"}
        good = {k for k, r in progress.items() if r == "closer"}
        means = judgments[judgments.parsed].groupby(["traj_id", "step_idx"]).step_score.mean()
        pairs = [(means.get(k, 0.0), k in good) for k in progress]  # a step nothing parsed scores 0
        ranked = auroc(np.array([m for m, _ in pairs]), np.array([g for _, g in pairs]))
        assert metrics.get("rm/progress_auroc_before_last", np.nan) == pytest.approx(ranked, nan_ok=True)
        # what the RM answered, and the share of its samples left without advantage (m verdicts agreed)
        rm = adv[adv.kind == "rm"]
        agreed = judgments.groupby(["traj_id", "step_idx"]).step_score.transform("nunique") == 1
        assert metrics["rm/zero_advantage_share"] == pytest.approx(agreed.mean())
        assert metrics["rm/zero_advantage_share"] == pytest.approx((rm.drop_reason == "zero_std").mean())
        assert metrics["rm/plus_share"] == pytest.approx((judgments[judgments.parsed].step_score > 0).mean())
    # Every task failed, so the rule rewrite made each game easier (quest_length 2 -> 1): the
    # environment generated and validated the new games, rolled out as pending in iteration 1.
    adaptation = read_table(layout.artifact(0, "adaptation"), schemas.ADAPTATION)
    assert set(adaptation.direction) == {"easier"} and adaptation.candidate_spec.notna().all()
    assert all('"quest_length": 1' in spec for spec in adaptation.candidate_spec)
    assert read_table(layout.artifact(1, "outcomes"), schemas.OUTCOMES).pending.sum() == 2 * 2
    assert layout.tasks_snapshot(2).exists()


def test_the_rm_update_trains_only_the_tokens_its_rm_chose(run):
    """rm.train_forced_tokens false: each kept judgment trains its reasoning and its verdict's
    first token, not the appended "\n\boxed{", the "1" of "-1" or "}"."""
    from rlanything.models.judge import verdict_choice
    from rlanything.models.loading import load_tokenizer, resolve_model_path

    layout = RunLayout(Path(run["run_dir"]))
    choice = verdict_choice(load_tokenizer(resolve_model_path("builtin:tiny-random?seed=1")))
    for iteration in (0, 1):
        adv = read_table(layout.artifact(iteration, "advantages"), schemas.ADVANTAGES)
        judgments = read_table(layout.artifact(iteration, "judgments"), schemas.JUDGMENTS)
        kept = adv[(adv.kind == "rm") & adv.kept].merge(judgments, on=["traj_id", "step_idx", "judge_idx"])
        forced = len(choice.opener) + len(choice.closer) + (kept.step_score == -1)  # "-1" is 2 tokens here
        trained = read_table(layout.artifact(iteration, "rm_update"), schemas.UPDATE).num_tokens.sum()
        assert len(kept) > 0 and trained == (kept.response_ids.map(len) - forced).sum()


def test_eval_measures_the_rm_against_the_step_labels_with_the_last_steps_apart(run, run_benchmark):
    """`rlanything eval` of the run's checkpoint on 3 held-out games: every judged step of every
    valid episode is labelled by TextWorld's rule, the last steps marked, and the RM's process
    accuracy and AUROC are those of the steps before the last."""
    from rlanything.algo.rm_accuracy import process_accuracy
    from rlanything.flows.evaluation import eval_flow

    result = eval_flow(run["run_dir"], None, [], "in_domain", 3)
    out = Path(result["out_dir"])
    episodes = read_table(out / "episodes.parquet", schemas.EVAL_EPISODES)
    judgments = read_table(out / "judgments.parquet", schemas.EVAL_JUDGMENTS)
    labels = read_table(out / "step_labels.parquet", schemas.EVAL_STEP_LABELS)
    judged = judgments[["problem_idx", "step_idx"]].drop_duplicates()
    assert len(labels) == len(judged) == episodes[episodes.valid].num_steps.sum() > 0
    last = dict(zip(episodes.problem_idx, episodes.num_steps - 1))
    assert labels["last"].tolist() == [last[p] == k for p, k in zip(labels.problem_idx, labels.step_idx)]
    early = labels[~labels["last"]]
    truth = dict(zip(zip(early.problem_idx, early.step_idx), early.label))
    cols = [judgments[c].to_numpy() for c in ("problem_idx", "step_idx", "step_score", "parsed")]
    row = result["summary"][0]
    assert row["rm_process_good"] + row["rm_process_bad"] == len(early)
    expected = process_accuracy(*cols, truth)["process_accuracy"]
    assert row["rm_process_accuracy"] == pytest.approx(expected)
    assert result["metrics"]["eval/in_domain/rm_process_accuracy"] == pytest.approx(expected)
    assert sum(n for _, n in row["rm_verdict_shares"].values()) == 2 * judgments.parsed.sum()  # by outcome, by rule
    assert "## Reward model against the step labels" in (out / "summary.md").read_text()
    # benchmarks/rm_reward_target.py reads the same steps before the last from this folder
    import re

    done = run_benchmark("rm_reward_target", str(out))
    assert int(re.search(r"(\d+) labelled steps before the last", done).group(1)) == len(early)
    # ... and, where an evaluation did not judge (no step_labels.parquet), replays the same labels
    import shutil

    bare = out.parent / "unjudged"
    bare.mkdir()
    shutil.copy(out / "episodes.parquet", bare / "episodes.parquet")
    again = run_benchmark("rm_reward_target", str(bare))
    assert again.split("\n", 2)[2] == done.split("\n", 2)[2].replace(str(out), str(bare))
    # benchmarks/rejudge.py: the evaluation's own RM, given again, judges its steps as it did
    # (same contexts, same seeds), and prints the same measures for both
    own = f"{run['run_dir']}@{int(out.name.split('_')[1])}"
    rejudged = run_benchmark("rejudge", str(out), "--rm", own)
    (path,) = out.glob("rejudged-*.judgments.parquet")
    again_judged = read_table(path, schemas.EVAL_JUDGMENTS)
    for column in ("problem_idx", "step_idx", "judge_idx", "prompt", "step_score", "parsed"):
        assert again_judged[column].tolist() == judgments[column].tolist(), column
    rows = re.findall(r"^\| (own RM .*?|--rm .*?) \| (.+) \|$", rejudged, re.M)
    assert len(rows) == 2 and rows[0][1] == rows[1][1], rejudged


def test_eval_in_the_held_out_wording_plays_the_same_games_in_other_words_beside_the_runs_own(run):
    """`rlanything eval --wording held_out`: the same held-out games (same specs, same first
    game text) under the held-out labels, written to <run>/eval-held_out/ and logged as
    eval-held_out/<split>/..., leaving the run's own evaluation folder and curves alone."""
    from rlanything.flows.evaluation import eval_flow

    own = eval_flow(run["run_dir"], None, ["eval.rm=false"], "in_domain", 2)
    own_summary = (Path(own["out_dir"]) / "summary.json").read_text()
    other = eval_flow(run["run_dir"], None, ["eval.rm=false"], "in_domain", 2, wording="held_out")
    assert Path(other["out_dir"]).parent == Path(run["run_dir"]) / "eval-held_out"
    assert Path(other["out_dir"]).name == Path(own["out_dir"]).name
    assert (Path(own["out_dir"]) / "summary.json").read_text() == own_summary  # the run's own: untouched
    mine, theirs = (read_table(Path(r["out_dir"]) / "episodes.parquet", schemas.EVAL_EPISODES) for r in (own, other))
    assert mine.spec.tolist() == theirs.spec.tolist()
    assert all(o.startswith("Goal: ") for o in mine.first_observation)
    assert all(o.startswith("What to achieve: ") for o in theirs.first_observation)
    assert "eval-held_out/in_domain/accuracy" in other["metrics"]
    assert not any(k.startswith("eval/") for k in other["metrics"]) and other["curves"] is None


def test_judging_only_trainable_tasks_skips_an_iteration_where_every_task_left_the_band(prefect_server, tmp_path):
    """A random policy loses every game: with the paper's bands no task can train, so with
    rm.judge_trainable_only nothing is judged, and the iteration still completes, recording it."""
    from rlanything.flows.training import train_flow

    overrides = [f"run.root={tmp_path}", "run.name=only", "env.num_problems=2", "policy.tasks_per_iteration=2"]
    overrides += ["policy.group_size=2", "env.max_steps=2", "run.iterations=1", "adapt.enabled=false"]
    overrides += ["rm.judge_trainable_only=true", "algo.band=[0.2, 0.8]", "algo.policy_band=[0.2, 0.8]"]
    result = train_flow(str(REPO / "configs" / "tiny-textworld.yaml"), overrides)
    layout = RunLayout(Path(result["run_dir"]))
    outcomes = read_table(layout.artifact(0, "outcomes"), schemas.OUTCOMES)
    assert (outcomes.outcome == -1).all() and len(outcomes) == 4
    assert read_table(layout.artifact(0, "judgments"), schemas.JUDGMENTS).empty
    assert read_table(layout.artifact(0, "advantages"), schemas.ADVANTAGES).empty
    metrics = json.loads((layout.run_dir / "iter_0000" / "summary.json").read_text())
    assert metrics["rm/trajectories_unjudged"] == 4


def test_the_reward_target_benchmark_reads_the_runs_labelled_steps(run, run_benchmark):
    """benchmarks/rm_reward_target.py on the run: per rule, the steps before each episode's last
    and their share in won episodes, as counted here from the run's own artifacts."""
    import re

    import pandas as pd

    layout = RunLayout(Path(run["run_dir"]))
    frames = []
    for iteration in (0, 1):
        outcomes = read_table(layout.artifact(iteration, "outcomes"), schemas.OUTCOMES)
        labels = read_table(layout.artifact(iteration, "step_labels"), schemas.STEP_LABELS)
        merged = labels.merge(outcomes[outcomes.valid][["traj_id", "outcome", "num_steps"]], on="traj_id")
        frames.append(merged[merged.step_idx < merged.num_steps - 1])
    before = pd.concat(frames)
    assert len(before) > 0
    every = run_benchmark("rm_reward_target", run["run_dir"]).split("mixed tasks only")[0]
    assert int(re.search(r"(\d+) labelled steps before the last", every).group(1)) == len(before)
    rows = re.findall(r"^  (\w+) +([+-]1) +(\d+) +([\d.]+)% \[", every, re.M)
    expected = before.groupby("rule").outcome.agg(lambda o: 100 * (o > 0).mean())
    assert {r: int(n) for r, _, n, _ in rows} == before.rule.value_counts().to_dict()
    assert {r: float(s) for r, _, _, s in rows} == pytest.approx(expected.round(1).to_dict(), abs=0.051)
    assert "AUROC of the episode's outcome for the label" in every
    assert "AUROC of the rule's share in won episodes for the label" in every
