"""A held-out evaluation's files, split by split (`rlanything eval`): each split's part files
(`play_and_judge`: played and judged, or reused from an earlier evaluation of the same weights),
then the parts merged into the evaluation's folder with its summary rows and metrics
(`merge_parts`). The Prefect tasks around them are tasks/evaluate.py; what is played and how the
reuse is decided, agent/eval_play.py; what the RM judges and how it is scored, agent/eval_judge.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from rlanything.agent.eval_judge import PROCESS_MEASURES, eval_contexts, held_out_labels, judge_split, rm_measures
from rlanything.agent.eval_play import (
    earlier_split,
    heldout_problems,
    is_nan,
    merged_splits,
    play_key,
    play_split,
    rm_key,
    split_provenance,
    success_summary,
    trained_specs,
)
from rlanything.metric_names import RM_MEASURES
from rlanything.models.precision import precision_of
from rlanything.storage.parquet import write_table
from rlanything.storage.schemas import EVAL_EPISODES, EVAL_JUDGMENTS, EVAL_STEP_LABELS, EVAL_STEPS

SPLIT_MEASURES = (
    "accuracy",
    "ci_low",
    "ci_high",
    "strict_accuracy",
    "fallback_accuracy",
    "format_rate",
    "n",
    "env_errors",
)
"""The columns of `success_summary` logged per split as `eval/<split>/<measure>`."""


def play_and_judge(
    config,
    weights: str,
    label: str,
    run_dir: str | None,
    iteration: int | None,
    split: str,
    out: Path,
    rm_weights: str | None = None,
    rm_label: str = "",
    digests: dict[str, str | None] | None = None,
    earlier: list[str] | None = None,
) -> dict:
    """Play `config.eval.problems` held-out problems of `split` greedily -> `out` (EVAL_EPISODES)
    and `<split>.steps.parquet`; with `rm_weights`, that RM judges every step of the valid ones ->
    `<split>.judgments.parquet`, and the environment's step labels, where it knows them ->
    `<split>.labels.parquet`. Where an evaluation in `earlier` (folders) played the same
    problems with the same weights (`digests`: the policy's and the RM's `weights_digest`), its
    episodes are copied instead, and its judgments where the RM is unchanged too
    (`agent.eval_play.earlier_split`); the returned `provenance` says which.
    -> {split, paths, steps, judgments, labels (paths or None), metrics, provenance}."""
    specs, dropped = heldout_problems(config.env, split, config.eval.problems, config.run.seed, trained_specs(run_dir))
    # the run's generation precisions (its precision.json), or resolved here for a bare model
    precision = {name: precision_of(config, name, run_dir=run_dir) for name in ("policy", "rm")}
    keys = {"play_key": play_key(config, split, specs, (digests or {}).get("policy"), precision["policy"])}
    if rm_weights is not None:
        keys["rm_key"] = rm_key(config, (digests or {}).get("rm"), keys["play_key"], precision["rm"])
    source = earlier_split([Path(f) for f in earlier or []], split, specs, keys)
    episodes, steps = (
        play_split(config, weights, specs, split, precision["policy"])
        if source is None
        else (source.episodes(), source.steps())
    )
    path = write_table(episodes.assign(weights=label, iteration=iteration), EVAL_EPISODES, out)
    steps_path = write_table(steps, EVAL_STEPS, path.with_name(f"{split}.steps.parquet"))
    metrics = {f"eval/{split}/dropped_seen": dropped, f"eval/{split}/episodes_reused": float(source is not None)}
    provenance = {**keys, "episodes_from": source.played_in if source else None}
    result = {"split": split, "paths": [str(path)], "steps": str(steps_path), "judgments": None, "labels": None}
    if rm_weights is not None:
        start = time.perf_counter()
        labels = held_out_labels(config.env, episodes, split, path.with_name(f"{split}.labels.parquet"))
        result["labels"] = None if labels is None else str(labels)
        earlier_judgments = source.judgments(keys["rm_key"]) if source else None
        judged = path.with_name(f"{split}.judgments.parquet")
        if earlier_judgments is None:
            contexts = eval_contexts(episodes, steps, config.rm.history_steps)  # an invalid episode left out
            judge_split(config, Path(rm_weights), rm_label, contexts, split, iteration, judged, precision["rm"])
        else:
            write_table(earlier_judgments.assign(weights=rm_label, iteration=iteration), EVAL_JUDGMENTS, judged)
        result["judgments"] = str(judged)
        provenance["judgments_from"] = source.judged_in if earlier_judgments is not None else None
        metrics[f"eval/{split}/judgments_reused"] = float(earlier_judgments is not None)
        metrics[f"eval/{split}/rm_time_s"] = time.perf_counter() - start
    return result | {"metrics": metrics, "provenance": provenance}


def merge_parts(parts: list[dict], out: Path) -> tuple[list[Path], dict[str, float], list[dict], pd.DataFrame]:
    """The splits' part files (`parts`: what `play_and_judge` returned; removed) -> `out`/
    episodes.parquet, steps.parquet and, where the RM judged them, judgments.parquet and
    step_labels.parquet. An earlier evaluation in `out` keeps its other splits (evaluating `ood`
    after `in_domain` adds to the files, it does not replace them); without judgments now or kept
    (eval.rm off, no judging RM) an earlier judgments.parquet and step_labels.parquet are removed.
    -> (the paths written; the metrics `eval/<split>/<measure>`: `SPLIT_MEASURES`, and the RM's
    `RM_MEASURES` and, with step labels, `PROCESS_MEASURES`; the split rows of summary.json, with
    the RM's measures and their `PROVENANCE`; the `success_summary` table)."""
    evaluated = {part["split"] for part in parts}
    episodes = merged_splits(
        out / "episodes.parquet", EVAL_EPISODES, [p for part in parts for p in part["paths"]], evaluated
    )
    steps = merged_splits(out / "steps.parquet", EVAL_STEPS, [part["steps"] for part in parts], evaluated)
    judged = [part["judgments"] for part in parts if part["judgments"]]
    labelled = [part["labels"] for part in parts if part.get("labels")]
    provenance = split_provenance(out, parts, evaluated)
    paths = [write_table(episodes, EVAL_EPISODES, out / "episodes.parquet")]
    paths.append(write_table(steps, EVAL_STEPS, out / "steps.parquet"))
    summary = success_summary(episodes, ["env_kind", "split"])
    metrics = {f"eval/{r['split']}/{m}": float(r[m]) for _, r in summary.iterrows() for m in SPLIT_MEASURES}
    splits = json.loads(summary.to_json(orient="records"))  # NaN -> null
    judgments = merged_splits(out / "judgments.parquet", EVAL_JUDGMENTS, judged, evaluated)
    if judged or len(judgments):  # judged now (maybe nothing: no valid episode), or kept
        paths.append(write_table(judgments, EVAL_JUDGMENTS, out / "judgments.parquet"))
        labels = merged_splits(out / "step_labels.parquet", EVAL_STEP_LABELS, labelled, evaluated)
        if labelled or len(labels):
            paths.append(write_table(labels, EVAL_STEP_LABELS, out / "step_labels.parquet"))
        rm = rm_measures(episodes, judgments, labels if len(labels) else None)
        for row in splits:
            values = rm[row["split"]]
            row.update({k: None if is_nan(v) else v for k, v in values.items()})  # JSON: NaN -> null
            known = [k for k in (*RM_MEASURES, *PROCESS_MEASURES) if k in values]
            metrics |= {f"eval/{row['split']}/{k}": float(values[k]) for k in known}
    else:
        for name in ("judgments.parquet", "step_labels.parquet"):  # from an earlier evaluation with the RM
            (out / name).unlink(missing_ok=True)
    for row in splits:
        row.update({k: v for k, v in provenance.get(row["split"], {}).items() if v is not None})
    return paths, metrics, splits, summary
