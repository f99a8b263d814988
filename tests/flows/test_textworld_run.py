"""Two iterations of configs/tiny-textworld.yaml through real Prefect, MLflow and Parquet:
multi-step TextWorld episodes, one rollouts row per step, m judgments per step."""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("textworld", reason="textworld is not installed (pip install textworld==1.7.0)")

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
        # verify labelled every judged step (TextWorld's rule); advantages scored the RM on them
        labels = read_table(layout.artifact(iteration, "step_labels"), schemas.STEP_LABELS)
        judged = judgments[["traj_id", "step_idx"]].drop_duplicates()
        assert len(labels.merge(judged, on=["traj_id", "step_idx"])) == len(judged) == len(labels)
        assert set(labels.label) <= {-1, 1} and set(labels.rule) <= {"closer", "unchanged", "farther", "invalid"}
        verdicts = judgments[judgments.parsed].groupby(["traj_id", "step_idx"]).step_score.mean().map(np.sign)
        scored = labels.set_index(["traj_id", "step_idx"]).label
        right = (verdicts.reindex(scored.index).fillna(0) == scored).mean()  # a step nothing parsed: wrong
        assert metrics["rm/process_labels"] == len(labels) and metrics["rm/process_accuracy"] == pytest.approx(right)
    # Every task failed, so the rule rewrite made each game easier (quest_length 2 -> 1): the
    # environment generated and validated the new games, rolled out as pending in iteration 1.
    adaptation = read_table(layout.artifact(0, "adaptation"), schemas.ADAPTATION)
    assert set(adaptation.direction) == {"easier"} and adaptation.candidate_spec.notna().all()
    assert all('"quest_length": 1' in spec for spec in adaptation.candidate_spec)
    assert read_table(layout.artifact(1, "outcomes"), schemas.OUTCOMES).pending.sum() == 2 * 2
    assert layout.tasks_snapshot(2).exists()
