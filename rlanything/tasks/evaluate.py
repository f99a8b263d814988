"""Held-out evaluation as Prefect tasks: one per split (the policy plays, the RM judges; or
where an earlier evaluation played the same problems with the same weights, its episodes are
copied and judged only by an RM that changed: `agent.eval_parts.play_and_judge`), then the
report (`agent.eval_parts.merge_parts`, summary.md and eval.png; `flows/evaluation.py`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import task

from rlanything import memory
from rlanything.agent.eval_parts import merge_parts, play_and_judge
from rlanything.config import load_config
from rlanything.debug_faults import inject_fault
from rlanything.reports.eval_report import plot_splits, summary_markdown
from rlanything.tasks.common import noting_stops

BASE_ITERATION = -1  # how the fault hook names a model that no iteration of a run wrote


@task(name="eval-split", task_run_name="eval {split}")
@noting_stops
def evaluate_split(
    config_path: str,
    overrides: list[str],
    weights: str,
    label: str,
    run_dir: str | None,
    iteration: int | None,
    split: str,
    out: str,
    rm_weights: str | None = None,
    rm_label: str = "",
    digests: dict[str, str | None] | None = None,
    earlier: list[str] | None = None,
) -> dict:
    """One split of the evaluation -> its part files beside `out`, their metrics and provenance
    (`agent.eval_parts.play_and_judge`)."""
    inject_fault("eval", BASE_ITERATION if iteration is None else iteration, "start")
    config = load_config(config_path, overrides)
    memory.set_budget(config.run.memory_gb)
    memory.map_large_blocks(config.run.mmap_threshold_mb)
    return play_and_judge(
        config, weights, label, run_dir, iteration, split, Path(out), rm_weights, rm_label, digests, earlier
    )


@task(name="eval-report")
@noting_stops
def eval_report(parts: list[dict], out_dir: str, title: str, details: dict[str, str]) -> dict:
    """The splits' part files (`parts`: what `evaluate_split` returned) merged into `out_dir`
    (`agent.eval_parts.merge_parts`) -> summary.md and eval.png beside them; the paths written,
    the metrics `eval/<split>/<measure>` and the split rows of summary.json."""
    out = Path(out_dir)
    paths, metrics, splits, summary = merge_parts(parts, out)
    (out / "summary.md").write_text(summary_markdown(pd.DataFrame(splits), title, details))
    paths += [out / "summary.md", plot_splits(summary, title, out / "eval.png")]
    return {"paths": [str(p) for p in paths], "metrics": metrics, "splits": splits}
