"""Held-out evaluation as Prefect tasks: one per split (the policy plays, the RM judges), then
the report (`flows/evaluation.py`)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pandas as pd
from prefect import task

from rlanything.agent.eval_judge import judge_split, merge_judgments, rm_measures
from rlanything.agent.evaluate import heldout_problems, play_greedy_steps
from rlanything.algo.metrics import success_summary
from rlanything.config import load_config
from rlanything.envs.heldout import SPLITS
from rlanything.models.engine_factory import make_engine
from rlanything.reports.eval import RM_MEASURES, plot_splits, summary_markdown
from rlanything.storage.buffer import read_buffer
from rlanything.storage.parquet import read_table, write_table
from rlanything.storage.schemas import EVAL_EPISODES, EVAL_JUDGMENTS
from rlanything.tasks.common import inject_fault, noting_stops
from rlanything.tasks.scoring import steps_to_judge

BASE_ITERATION = -1  # how the fault hook names a model that no iteration of a run wrote


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
) -> dict:
    """Play `eval.problems` held-out problems of `split` greedily -> `out` (EVAL_EPISODES); with
    `rm_weights`, that RM judges every step of the valid ones -> `<split>.judgments.parquet`."""
    inject_fault("eval", BASE_ITERATION if iteration is None else iteration, "start")
    config = load_config(config_path, overrides)
    specs, dropped = heldout_problems(config.env, split, config.eval.problems, config.run.seed, trained_specs(run_dir))
    engine, tokenizer = make_engine(config.policy, "policy", Path(weights))
    max_new_tokens = config.eval.max_new_tokens or config.policy.max_new_tokens
    rows, steps = play_greedy_steps(engine, tokenizer, config.env, specs, split, max_new_tokens=max_new_tokens)
    del engine  # before the RM loads
    rows = [{**row, "weights": label, "iteration": iteration} for row in rows]
    path = write_table(rows, EVAL_EPISODES, Path(out))
    result = {"paths": [str(path)], "judgments": None, "metrics": {f"eval/{split}/dropped_seen": dropped}}
    if rm_weights is not None:
        start = time.perf_counter()
        # the rm_score step's context builder; traj_id = problem_idx, an invalid episode left out
        episodes = pd.DataFrame(rows).rename(columns={"problem_idx": "traj_id"}).assign(pending=False)
        step_frame = pd.DataFrame(steps, columns=["traj_id", "task_id", "step_idx", "response", "observation"])
        contexts = steps_to_judge(step_frame, episodes, episodes)
        judged = path.with_name(f"{split}.judgments.parquet")
        result["judgments"] = str(judge_split(config, Path(rm_weights), rm_label, contexts, split, iteration, judged))
        result["metrics"][f"eval/{split}/rm_time_s"] = time.perf_counter() - start
    return result


def _other_splits(path: Path, schema, evaluated: set[str]) -> pd.DataFrame:
    """The rows of an earlier evaluation's file (episodes or judgments) whose split is not
    evaluated again now: kept beside the new ones."""
    if not path.exists():
        return pd.DataFrame(columns=schema.names)
    frame = read_table(path, schema)
    return frame[~frame.split.isin(evaluated)]


@task(name="eval-report")
@noting_stops
def eval_report(
    split_paths: list[str], judgment_paths: list[str], out_dir: str, title: str, details: dict[str, str]
) -> dict:
    """The splits' episodes (and, where the RM judged them, their judgments) -> episodes.parquet,
    judgments.parquet, summary.md, eval.png; the split rows of summary.json and the metrics
    `eval/<split>/<measure>` (accuracy, ci_low, ci_high, strict_accuracy, fallback_accuracy,
    format_rate, n, env_errors, and the RM's `RM_MEASURES`). An earlier evaluation of the same
    weights keeps its other splits (evaluating `ood` after `in_domain` adds to the files, it does
    not replace them); without judgments now or kept (eval.rm off, no judging RM) an earlier
    judgments.parquet is removed."""
    out = Path(out_dir)
    new = pd.concat([read_table(Path(p), EVAL_EPISODES) for p in split_paths], ignore_index=True)
    evaluated = set(new.split)
    kept = _other_splits(out / "episodes.parquet", EVAL_EPISODES, evaluated)
    episodes = pd.concat([f for f in (kept, new) if len(f)] or [new], ignore_index=True)
    episodes = episodes.sort_values("split", key=lambda s: s.map(SPLITS.index), kind="stable", ignore_index=True)
    kept_judgments = _other_splits(out / "judgments.parquet", EVAL_JUDGMENTS, evaluated)
    paths = [write_table(episodes, EVAL_EPISODES, out / "episodes.parquet")]
    for part in split_paths:  # now inside episodes.parquet
        Path(part).unlink()
    summary = success_summary(episodes, ["env_kind", "split"])
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
    table = summary
    if judgment_paths or len(kept_judgments):
        judgments = kept_judgments
        if judgment_paths:
            merged = merge_judgments([Path(p) for p in judgment_paths], out / "judgments.parquet")
            fresh = read_table(merged, EVAL_JUDGMENTS)
            judgments = pd.concat([f for f in (kept_judgments, fresh) if len(f)] or [fresh], ignore_index=True)
        paths.append(write_table(judgments, EVAL_JUDGMENTS, out / "judgments.parquet"))
        rm = rm_measures(episodes, judgments)
        for row in splits:
            values = rm[row["split"]]
            row.update({k: None if math.isnan(v) else v for k, v in values.items()})  # JSON: NaN -> null
            metrics |= {f"eval/{row['split']}/{k}": float(values[k]) for k in RM_MEASURES}
        table = pd.DataFrame(splits)
    else:
        (out / "judgments.parquet").unlink(missing_ok=True)  # from an earlier evaluation with the RM
    (out / "summary.md").write_text(summary_markdown(table, title, details))
    paths += [out / "summary.md", plot_splits(summary, title, out / "eval.png")]
    return {"paths": [str(p) for p in paths], "metrics": metrics, "splits": splits}
