"""One tiny training iteration on a plug-in environment (examples/custom_env, outside the
package) through the real Prefect flow: rollouts, verification by replay, judgments, both
updates and a rule rewrite, all through the class named by `env.kind`."""

import json
from pathlib import Path

import pytest

from rlanything.storage import schemas
from rlanything.storage.buffer import read_buffer
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_env"


@pytest.mark.slow
def test_one_iteration_on_the_example_plugin(prefect_server, tmp_path, monkeypatch):
    from rlanything.flows.training import train_flow

    monkeypatch.syspath_prepend(str(EXAMPLE))  # as `PYTHONPATH=examples/custom_env` does
    monkeypatch.setenv("PYTHONPATH", f"{EXAMPLE}:{__import__('os').environ.get('PYTHONPATH', '')}")
    result = train_flow(str(EXAMPLE / "addition.yaml"), [f"run.root={tmp_path}", "run.name=plugin"], 1)
    layout = RunLayout(Path(result["run_dir"]))
    assert layout.iteration_done(0).exists() and result["iterations"] == 1

    specs = read_buffer(layout.tasks_snapshot(0)).spec.map(json.loads)
    assert len(specs) == 3 and all(10 <= s["a"] <= 99 and 10 <= s["b"] <= 99 for s in specs)  # its Options
    episodes = read_table(layout.artifact(0, "episodes"), schemas.EPISODES)
    assert len(episodes) == 2 * 2 and episodes.first_observation.str.match(r"What is \d+ \+ \d+\?$").all()
    outcomes = read_table(layout.artifact(0, "outcomes"), schemas.OUTCOMES)
    assert outcomes.valid.all() and set(outcomes.outcome) <= {-1, 1} and outcomes.num_steps.eq(1).all()
    judgments = read_table(layout.artifact(0, "judgments"), schemas.JUDGMENTS)
    assert len(judgments) == 2 * 2 * 2  # one step per episode, m = 2
    for kind in ("policy", "rm"):
        assert layout.checkpoint(kind, 0).is_dir()

    adaptation = read_table(layout.artifact(0, "adaptation"), schemas.ADAPTATION)
    proposed = adaptation[adaptation.decision == "proposed"]
    assert len(proposed) == 2 and (proposed.direction == "easier").all()  # a random policy fails
    for row in proposed.itertuples():
        parent = specs[read_buffer(layout.tasks_snapshot(0)).task_id == row.task_id].iloc[0]
        assert json.loads(row.candidate_spec) == {"a": parent["a"] // 10, "b": parent["b"] // 10}  # rule_rewrite
    assert (read_buffer(layout.tasks_snapshot(1)).status == "pending").sum() == 2
