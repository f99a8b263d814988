"""Held-out evaluation as Prefect tasks: one per split, then the report (`flows/evaluation.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from prefect import task

from rlanything.agent.evaluate import heldout_problems, play_greedy
from rlanything.algo.metrics import success_summary
from rlanything.config import load_config
from rlanything.models.engine import make_engine
from rlanything.reports.eval import plot_splits, summary_markdown
from rlanything.storage.buffer import read_buffer
from rlanything.storage.parquet import read_table, write_table
from rlanything.storage.schemas import EVAL_EPISODES


def trained_specs(run_dir: str | None) -> list[dict]:
    """Every spec a run's task buffer ever held (every snapshot, every version and status)."""
    if run_dir is None:
        return []
    specs = {}
    for snapshot in sorted((Path(run_dir) / "tasks").glob("v*.parquet")):
        for spec in read_buffer(snapshot).spec:
            specs[spec] = json.loads(spec)
    return list(specs.values())


@task(name="eval-split", task_run_name="eval {split}")
def evaluate_split(
    config_path: str,
    overrides: list[str],
    weights: str,
    label: str,
    run_dir: str | None,
    iteration: int | None,
    split: str,
    out: str,
) -> dict:
    """Play `eval.problems` held-out problems of `split` greedily -> `out` (EVAL_EPISODES)."""
    config = load_config(config_path, overrides)
    specs, dropped = heldout_problems(config.env, split, config.eval.problems, config.run.seed, trained_specs(run_dir))
    engine, tokenizer = make_engine(config.policy, "policy", Path(weights))
    rows = play_greedy(
        engine,
        tokenizer,
        config.env,
        specs,
        split,
        max_new_tokens=config.eval.max_new_tokens or config.policy.max_new_tokens,
    )
    rows = [{**row, "weights": label, "iteration": iteration} for row in rows]
    path = write_table(rows, EVAL_EPISODES, Path(out))
    return {"paths": [str(path)], "metrics": {f"eval/{split}/dropped_seen": dropped}}


@task(name="eval-report")
def eval_report(split_paths: list[str], out_dir: str, title: str, details: dict[str, str]) -> dict:
    """The splits' episodes -> episodes.parquet, summary.md, eval.png, summary.json; the
    metrics `eval/<split>/<measure>` (accuracy, ci_low, ci_high, strict_accuracy,
    fallback_accuracy, format_rate, n, env_errors)."""
    out = Path(out_dir)
    episodes = pd.concat([read_table(Path(p), EVAL_EPISODES) for p in split_paths], ignore_index=True)
    paths = [write_table(episodes, EVAL_EPISODES, out / "episodes.parquet")]
    for part in split_paths:  # now inside episodes.parquet
        Path(part).unlink()
    summary = success_summary(episodes, ["env_kind", "split"])
    (out / "summary.md").write_text(summary_markdown(summary, title, details))
    paths += [out / "summary.md", plot_splits(summary, title, out / "eval.png")]
    measures = (
        "accuracy",
        "ci_low",
        "ci_high",
        "strict_accuracy",
        "fallback_accuracy",
        "format_rate",
        "n",
        "env_errors",
    )
    metrics = {f"eval/{r['split']}/{m}": float(r[m]) for _, r in summary.iterrows() for m in measures}
    splits = json.loads(summary.to_json(orient="records"))  # NaN -> null
    return {"paths": [str(p) for p in paths], "metrics": metrics, "splits": splits}
