"""Step 7: forge the environment (task adaptation, `agent.adapt_tasks.adapt`): judge the
pending rewrites, propose new ones for tasks outside the band. Writes adaptation.parquet and the
buffer with full lineage to tasks/v(N+1).parquet."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from rlanything.agent.adapt_tasks import adapt
from rlanything.agent.rm_roles import critic_judgments
from rlanything.agent.run_context import open_run
from rlanything.envs import env_class
from rlanything.metric_names import ADAPT_ACCEPTED_TOTAL, ADAPT_DECISIONS, adapt_metric
from rlanything.models.precision import precision_of
from rlanything.storage.artifacts import read_artifact, write_artifact
from rlanything.storage.buffer import read_buffer, write_buffer
from rlanything.storage.schemas import ADAPTATION
from rlanything.tasks.common import step_task


@step_task("adapt_tasks")
def adapt_tasks(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    names = ("outcomes", "judgments", "rollouts", "episodes", "unit_tests", "pass_matrix")
    frames = {n: read_artifact(layout, iteration, n) for n in names}
    before = read_buffer(layout.tasks_snapshot(iteration))
    rows, buffer = adapt(
        config,
        env_class(config.env.kind),
        iteration,
        before,
        frames["outcomes"],
        critic_judgments(config, frames),  # what the critic summary reads
        frames["rollouts"],
        frames["episodes"],
        env_precision=precision_of(config, "env_model", run_dir=layout.run_dir),
    )
    paths = [
        write_artifact(pd.DataFrame(rows, columns=ADAPTATION.names), layout, iteration, "adaptation"),
        write_buffer(buffer, layout.tasks_snapshot(iteration + 1)),
    ]
    decisions = Counter(r["decision"] for r in rows)
    metrics = {adapt_metric(k): decisions.get(k, 0) for k in ADAPT_DECISIONS}
    for r in rows:
        if r["decision"] == "rejected":
            metrics[f"adapt/rejected_{r['reason']}"] = metrics.get(f"adapt/rejected_{r['reason']}", 0) + 1
    metrics[ADAPT_ACCEPTED_TOTAL] = int((buffer.decision == "accepted").sum())
    return paths, metrics
