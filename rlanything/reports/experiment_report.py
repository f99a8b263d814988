"""The comparison of an experiment's arms: a markdown table and the paper's figures, in shape.

An experiment (`rlanything experiment ablation`) is a set of normal runs, one per (arm, seed).
This module reads what those runs wrote, and nothing else: each iteration's
`iter_NNNN/summary.json` (training metrics, step times) and each held-out evaluation's
`eval/*/summary.json` (`reports.eval_report.eval_history`). Prefect-free, like every report.

Numbers in the table, per arm:
- held-out accuracy per split at each run's *last evaluated iteration*, seeds pooled: successes
  and n summed over the seeds, one 95% Wilson interval over the pool (it treats the seeds'
  problems as independent draws; each seed's own value is in the per-seed table below it);
- the RM's outcome accuracy and AUROC (and process accuracy, where the environment labels
  steps) on the last iteration's training rollouts, the mean over seeds, and on the held-out
  episodes where the evaluation judged them;
- accepted tasks: `adapt/accepted_total` at the last iteration, mean over seeds;
- training minutes: each seed's sum of the steps' own times (`reports.eval_report.step_seconds`) over
  its iterations. Under a wall-time budget every number is read at the budget (`cut_at_budget`):
  each run's iterations that ended within it and its evaluation of the last of them, what the arm
  had when its time was up; beside the minutes, each seed's minutes left in the iteration that was
  unfinished then.
An arm without an RM in the loop (the policy-only arm) has no RM measures: NaN, shown as n/a and
neither drawn nor logged. The starting model's row takes each seed's evaluation from the first arm
whose RM judged it, where one did.

Plots (bare `Figure`s, Agg): held-out accuracy against iteration and against training wall time,
integrated vs outcome-only (training-batch and held-out accuracy of the arms that differ only in
the policy's reward), the RM's accuracy over iterations on the training rollouts, the RM's
held-out outcome AUROC (95% interval bars) beside the policy's held-out accuracy, and accepted
tasks over iterations. Every point is a measurement of one run; nothing is smoothed or averaged in
the curves.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rlanything import metric_names as names
from rlanything.algo.metrics import wilson_interval
from rlanything.reports.eval_report import auroc_text, eval_history, pct, step_seconds

RM_ACCURACY = (names.RM_OUTCOME_ACCURACY, names.RM_OUTCOME_AUROC, names.RM_PROCESS_ACCURACY)  # rm_accuracy.png
# Training metrics the comparison reads from iter_NNNN/summary.json (absent ones stay NaN).
TRAINING_METRICS = (names.ACCURACY, *RM_ACCURACY, names.ADAPT_ACCEPTED_TOTAL)
FIGURES = (
    "heldout_vs_iteration",
    "heldout_vs_wall_time",
    "integrated_vs_outcome",
    "rm_accuracy",
    "heldout_rm",
    "accepted_tasks",
)


def _iteration_records(run_dir: Path):
    """Each finished iteration's summary.json, in order, with the training time up to its end (the
    steps' own times, as `reports.eval_report.training_wall_time`)."""
    wall = 0.0
    for path in sorted(Path(run_dir).glob("iter_*/summary.json")):
        record = json.loads(path.read_text())
        wall += step_seconds(record)
        yield record, wall


def iteration_history(run_dir: Path) -> pd.DataFrame:
    """One row per finished iteration of a run: `iteration`, `wall_time_s` (training time up to
    its end: the steps' own times, as `reports.eval_report.training_wall_time`) and `TRAINING_METRICS`."""
    rows = [
        {"iteration": int(record["iteration"]), "wall_time_s": wall}
        | {k: float(record.get(k, math.nan)) for k in TRAINING_METRICS}
        for record, wall in _iteration_records(run_dir)
    ]
    return pd.DataFrame(rows, columns=["iteration", "wall_time_s", *TRAINING_METRICS])


def iteration_table(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` (arm, seed, run_dir) -> one row per finished iteration of each run: arm, seed,
    iteration, `wall_time_s` (as `iteration_history`), and every number of its summary.json (step
    times `time/*_s`, sample counts, RM measures...): the data behind a comparison's curves."""
    rows = []
    for run in runs.itertuples():
        for record, wall in _iteration_records(run.run_dir):
            numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "iteration"}
            tag = {"arm": run.arm, "seed": int(run.seed), "iteration": int(record["iteration"])}
            rows.append(tag | {"wall_time_s": wall, **numbers})
    return pd.DataFrame(rows)


def collect(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`runs` (arm, seed, run_dir) -> (training, heldout): the runs' iteration histories and
    evaluation histories, each row tagged with its arm and seed."""
    training, heldout = [], []
    for run in runs.itertuples():
        tag = {"arm": run.arm, "seed": int(run.seed)}
        training.append(iteration_history(Path(run.run_dir)).assign(**tag))
        history = eval_history(Path(run.run_dir))
        if len(history):
            heldout.append(history.assign(**tag))
    cat = lambda frames: pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()  # noqa: E731
    return cat(training), cat(heldout)


def pooled_accuracy(last: pd.DataFrame, column: str = "strict_accuracy") -> dict[str, float]:
    """Seeds pooled: `last` has one row per seed (n, and the rate in `column`) -> successes, n,
    rate and its 95% Wilson interval over the pool.

    >>> frame = pd.DataFrame({"n": [10, 10], "strict_accuracy": [0.5, 0.7]})
    >>> {k: round(v, 4) for k, v in pooled_accuracy(frame).items()}
    {'successes': 12, 'n': 20, 'rate': 0.6, 'ci_low': 0.3866, 'ci_high': 0.7812}
    """
    n = int(last.n.sum())
    successes = int(round(float((last[column] * last.n).sum())))
    low, high = wilson_interval(successes, n)
    return {"successes": successes, "n": n, "rate": successes / n if n else math.nan, "ci_low": low, "ci_high": high}


def _last_eval(heldout: pd.DataFrame) -> pd.DataFrame:
    """Each (arm, seed, split)'s row of its newest evaluated iteration, or of its compared one
    where the frame was `cut_at_budget`."""
    if heldout.empty:
        return heldout
    if "compared" in heldout:
        return heldout[heldout.compared]
    newest = heldout.groupby(["arm", "seed"]).iteration.transform("max")
    return heldout[heldout.iteration == newest]


BASE_ROW = ("base", "starting model (before training)")


def _base_eval(heldout: pd.DataFrame) -> pd.DataFrame:
    """One evaluation of the starting model per (seed, split): the first arm's whose RM judged
    it, if any did (an arm without an RM in the loop has the same accuracies and no RM measures)."""
    if heldout.empty:
        return heldout
    base = heldout[heldout.iteration < 0]
    judged = base.rm_outcome_accuracy.notna() if "rm_outcome_accuracy" in base else False
    base = base.assign(_judged=judged).sort_values("_judged", ascending=False, kind="stable")
    return base.drop_duplicates(["seed", "split"]).drop(columns="_judged")


def at_budget(history: pd.DataFrame, budget_minutes: float) -> int:
    """The iteration whose checkpoint a run had when `budget_minutes` of training were up: the
    last in `history` (`iteration_history`: training time up to each iteration's end) that ended
    within them; -1 (the starting model, as evaluations number it) when none did. The experiment
    evaluates this iteration and the comparison reads every run there.

    >>> h = pd.DataFrame({"iteration": [0, 1, 2], "wall_time_s": [30.0, 70.0, 120.0]})
    >>> at_budget(h, 2.0), at_budget(h, 119.9 / 60), at_budget(h, 0.25), at_budget(h.head(0), 1.0)
    (2, 1, -1, -1)
    """
    within = history.iteration[history.wall_time_s <= budget_minutes * 60]
    return int(within.max()) if len(within) else -1


def cut_at_budget(training: pd.DataFrame, heldout: pd.DataFrame, budget_minutes: float) -> tuple:
    """(training, heldout) as each run stood when `budget_minutes` of training were up: its
    iterations up to the one it is compared at (`at_budget`), and its evaluations of that one and
    of its starting model (the only one compared when no iteration ended within the budget). A run
    whose compared iteration has no evaluation has no held-out numbers: no older evaluation stands
    in for it. `compared` marks the evaluations compared.

    >>> t = pd.DataFrame({"arm": "a", "seed": 0, "iteration": [0, 1, 2], "wall_time_s": [50.0, 100.0, 160.0]})
    >>> h = pd.DataFrame({"arm": "a", "seed": 0, "iteration": [-1, 1, 2]})
    >>> [f.iteration.tolist() for f in cut_at_budget(t, h, 2.0)], cut_at_budget(t, h, 2.0)[1].compared.tolist()
    ([[0, 1], [-1, 1]], [False, True])
    >>> [f.iteration.tolist() for f in cut_at_budget(t, h, 0.5)]
    [[-1], [-1]]
    """
    if training.empty:
        return training, heldout
    at = {run: at_budget(history, budget_minutes) for run, history in training.groupby(["arm", "seed"])}
    kept = [iteration <= at[run] for run, iteration in zip(zip(training.arm, training.seed), training.iteration)]
    # a run none of whose iterations ended within the budget stands at its start: iteration -1, 0 s
    start = [{"arm": arm, "seed": seed, "iteration": -1, "wall_time_s": 0.0} for (arm, seed), i in at.items() if i < 0]
    training = pd.concat([training[kept], pd.DataFrame(start)], ignore_index=True) if start else training[kept]
    if heldout.empty:
        return training, heldout
    compared = heldout.iteration == [at.get((arm, seed), -1) for arm, seed in zip(heldout.arm, heldout.seed)]
    heldout = heldout.assign(compared=compared)  # read by `_last_eval`; the starts stay for the base row
    return training, heldout[heldout.compared | (heldout.iteration < 0)]


def budget_numbers(minutes: list[float], budget_minutes: float) -> dict:
    """`budget_left`: for each seed's training `minutes` up to its compared checkpoint, the
    minutes of a wall-time budget its unfinished iteration had run when the budget was up.

    >>> budget_numbers([7.5, 8.0], 8.0)
    {'budget_left': [0.5, 0.0]}
    """
    return {"budget_left": [budget_minutes - m for m in minutes]}


def comparison_table(
    arms: dict[str, str],
    training: pd.DataFrame,
    heldout: pd.DataFrame,
    splits: list[str],
    budget_minutes: float | None = None,
) -> pd.DataFrame:
    """One row for the starting model (arm "base": its evaluation, once per seed), then one per
    arm (in `arms` order; `arms`: name -> label) with the numbers of the module docstring;
    `strict_<split>`, `accuracy_<split>` are pooled dicts (`pooled_accuracy`), `training_min_seeds`
    each seed's minutes (seed order), and with `budget_minutes` the `budget_numbers` column (the
    frames already `cut_at_budget`)."""
    last, base = _last_eval(heldout), _base_eval(heldout)
    rows = [{"arm": BASE_ROW[0], "label": BASE_ROW[1], "seeds": int(base.seed.nunique()) if len(base) else 0}]
    rows[0] |= {"iterations": 0, "training_min": 0.0, "training_min_seeds": [], **_heldout_numbers(base, splits)}
    rows[0] |= {metric: math.nan for metric in TRAINING_METRICS[1:]}
    if budget_minutes is not None:
        rows[0] |= {"budget_left": None}  # nothing trained
    for arm, label in arms.items():
        train = training[training.arm == arm] if len(training) else training
        final = train[train.iteration == train.groupby("seed").iteration.transform("max")] if len(train) else train
        row = {"arm": arm, "label": label, "seeds": int(final.seed.nunique()) if len(final) else 0}
        row["iterations"] = int(final.iteration.max() + 1) if len(final) else 0
        row["training_min"] = float(final.wall_time_s.mean() / 60) if len(final) else math.nan
        row["training_min_seeds"] = [float(w) / 60 for w in final.sort_values("seed").wall_time_s]
        if budget_minutes is not None:
            row |= budget_numbers(row["training_min_seeds"], budget_minutes)
        row |= _heldout_numbers(last[last.arm == arm] if len(last) else last, splits)
        for metric in TRAINING_METRICS[1:]:
            values = final[metric] if len(final) else pd.Series(dtype=float)
            row[metric] = float(values.mean()) if values.notna().any() else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _heldout_numbers(evals: pd.DataFrame, splits: list[str]) -> dict:
    """Pooled held-out accuracies and mean RM measures per split of one row's evaluations."""
    row = {}
    for split in splits:
        rows_split = evals[evals.split == split] if len(evals) else evals
        for column in ("strict_accuracy", "accuracy"):
            key = f"{column.split('_')[0]}_{split}"
            row[key] = pooled_accuracy(rows_split, column) if len(rows_split) else None
        for column in ("rm_outcome_accuracy", "rm_outcome_auroc"):
            values = rows_split[column] if len(rows_split) and column in rows_split else pd.Series(dtype=float)
            row[f"heldout_{column}_{split}"] = float(values.mean()) if values.notna().any() else math.nan
    return row


def _ci(pool: dict | None) -> str:
    if not pool:
        return "n/a"
    return f"{pct(pool['rate'])} [{pct(pool['ci_low'])}, {pct(pool['ci_high'])}] (n={pool['n']})"


def _num(value: float, digits: int = 2) -> str:
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


def _minutes(row: dict) -> str:
    """Each seed's training minutes, "8.21, 8.60"; the starting model's 0."""
    seeds = row["training_min_seeds"]
    return ", ".join(f"{m:.2f}" for m in seeds) if seeds else _num(row["training_min"])


def _budget(row: dict) -> str:
    """Each seed's minutes left in its unfinished iteration at the budget, "1.20, 0.35"."""
    if not row["budget_left"]:
        return "n/a"
    return ", ".join(f"{m:.2f}" for m in row["budget_left"])


def comparison_markdown(
    title: str, details: dict[str, str], table: pd.DataFrame, heldout: pd.DataFrame, splits: list[str]
) -> str:
    """comparison.md: the main table, then every seed's last held-out evaluation. A table with a
    wall-time budget's column (`budget_numbers`) gets it after the minutes."""
    budget = "budget_left" in table
    lines = [f"# {title}", "", *[f"- {k}: {v}" for k, v in details.items()], ""]
    head = ["arm", "seeds", "iterations", "training min (per seed)"]
    head += ["min unfinished at the budget (per seed)"] if budget else []
    head += [f"held-out {s} strict [95% CI]" for s in splits] + [f"held-out {s} with fallback" for s in splits]
    head += ["RM outcome acc (train)", "RM outcome AUROC (train)", "RM process acc (train)"]
    head += [f"RM outcome acc (held-out {s})" for s in splits]
    head += [f"RM outcome AUROC (held-out {s})" for s in splits] + ["accepted tasks"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table.to_dict("records"):
        cells = [r["label"], str(r["seeds"]), str(r["iterations"]), _minutes(r)] + ([_budget(r)] if budget else [])
        cells += [_ci(r[f"strict_{s}"]) for s in splits] + [_ci(r[f"accuracy_{s}"]) for s in splits]
        cells += [_num(r[metric]) for metric in RM_ACCURACY]
        cells += [_num(r[f"heldout_rm_outcome_accuracy_{s}"]) for s in splits]
        cells += [_num(r[f"heldout_rm_outcome_auroc_{s}"]) for s in splits]
        cells += [_num(r[names.ADAPT_ACCEPTED_TOTAL], 1)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Held-out: greedy, each run's last evaluated iteration; seeds pooled (successes and n summed, "
        "one Wilson interval). RM numbers: the last training iteration's rollouts (mean over seeds), "
        "and the held-out episodes where the evaluation judged them (the starting model: by the first "
        "arm whose RM judged; held-out AUROC: the mean over seeds, each seed's interval below). n/a: "
        "not measured (an arm without an RM in the loop; an environment without step labels has no "
        "process accuracy). Training min: each seed's steps' own times summed over its iterations "
        "(evaluations and resume gaps excluded)."
        + (
            " Under the wall-time budget every number is the arm's when its minutes were up: its last "
            "iteration that ended within them (training min, held-out, RM), and the minutes its next "
            "iteration had run by then (unfinished at the budget)."
            if budget
            else ""
        ),
        "",
        "## Every seed",
        "",
        "| arm | seed | iteration | split | strict [95% CI] | with fallback [95% CI] | n | RM outcome AUROC [95% CI] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    last = _last_eval(heldout)
    if len(last):
        order = {arm: i for i, arm in enumerate(table.arm)}
        last = last.assign(order=last.arm.map(order)).sort_values(["order", "seed", "split"])
    for r in last.itertuples() if len(last) else []:
        strict = f"{pct(r.strict_accuracy)} [{pct(r.strict_ci_low)}, {pct(r.strict_ci_high)}]"
        lines.append(
            f"| {r.arm} | {r.seed} | {r.iteration} | {r.split} | {strict} | "
            f"{pct(r.accuracy)} [{pct(r.ci_low)}, {pct(r.ci_high)}] | {int(r.n)} | {auroc_text(r._asdict())} |"
        )
    return "\n".join(lines) + "\n"


def _lines(
    ax, frame: pd.DataFrame, x: str, y: str, arms: dict[str, str], scale: float = 1.0, linestyle: str = "-"
) -> None:
    """One line per (arm, seed), arms in `arms` order: colour by arm, marker by seed; the arm's
    label once (solid lines only). Identical runs draw on top of each other."""
    markers = "os^vD<>"
    for i, (arm, label) in enumerate(arms.items()):
        for k, (seed, rows) in enumerate(frame[frame.arm == arm].groupby("seed", sort=True)):
            rows = rows.sort_values(x)
            if rows[y].notna().any():
                marker = markers[int(seed) % len(markers)]
                legend = label if k == 0 and linestyle == "-" else None
                ax.plot(rows[x] * scale, rows[y], color=f"C{i}", marker=marker, linestyle=linestyle, label=legend)
    if x == "iteration":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def heldout_figure(
    arms: dict[str, str], heldout: pd.DataFrame, splits: list[str], x: str, scale: float, xlabel: str
) -> Figure:
    """Held-out accuracy against `x` (iteration or wall time), a panel per split: strict solid;
    when some answer was read by the environment's answer fallback (accuracy differs from strict
    anywhere), the accuracy with the fallback dashed, so a model that never boxes (all strict
    zeros) still shows what it did."""
    fallback = len(heldout) > 0 and bool((heldout.accuracy - heldout.strict_accuracy).abs().gt(1e-9).any())
    fig = Figure(figsize=(6 * max(1, len(splits)), 4.2), layout="constrained")
    for ax, split in zip(fig.subplots(1, max(1, len(splits)), squeeze=False)[0], splits):
        rows = heldout[heldout.split == split] if len(heldout) else heldout
        if len(rows):
            _lines(ax, rows, x, "strict_accuracy", arms, scale)
            if fallback:
                _lines(ax, rows, x, "accuracy", arms, scale, linestyle="--")
        what = "strict (solid), with answer fallback (dashed)" if fallback else "strict"
        ax.set(title=f"{split}: held-out accuracy, {what}", xlabel=xlabel, ylim=(-0.02, 1.02))
    return fig


def heldout_rm_figure(arms: dict[str, str], heldout: pd.DataFrame, split: str) -> Figure:
    """The joint loop's two learners on held-out episodes of `split`: the policy's strict accuracy
    (left) and the RM's outcome AUROC with its 95% bootstrap interval as bars (right; 0.5 is
    chance) against iteration. An evaluation whose RM judged nothing has no AUROC point."""
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    rows = heldout[heldout.split == split] if len(heldout) else heldout
    if len(rows):
        _lines(left, rows, "iteration", "strict_accuracy", arms)
    measured = len(rows) and "rm_outcome_auroc" in rows and rows.rm_outcome_auroc.notna().any()
    if measured:
        _lines(right, rows, "iteration", "rm_outcome_auroc", arms)
        for i, arm in enumerate(arms):
            bars = rows[(rows.arm == arm) & rows.rm_outcome_auroc.notna()]
            if len(bars) and "rm_outcome_auroc_low" in bars:
                low = (bars.rm_outcome_auroc - bars.rm_outcome_auroc_low).to_numpy(dtype=float)
                high = (bars.rm_outcome_auroc_high - bars.rm_outcome_auroc).to_numpy(dtype=float)
                yerr = np.nan_to_num(np.stack([low, high]))  # no interval (too few of a class): no bar
                right.errorbar(bars.iteration, bars.rm_outcome_auroc, yerr=yerr, fmt="none", ecolor=f"C{i}")
        right.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    else:
        right.text(0.5, 0.5, "not measured", ha="center", transform=right.transAxes)
    left.set(title=f"held-out {split} strict accuracy (policy)", xlabel="iteration", ylim=(-0.02, 1.02))
    title = f"held-out {split} RM outcome AUROC, 95% interval (0.5: chance)"
    right.set(title=title, xlabel="iteration (-1: the starting model)", ylim=(-0.02, 1.02))
    return fig


def plot_figures(
    arms: dict[str, str], training: pd.DataFrame, heldout: pd.DataFrame, splits: list[str], out_dir: Path
) -> list[Path]:
    """The PNGs of `FIGURES` in `out_dir`; returns their paths."""
    paths = []
    shown = heldout[heldout.split.isin(splits)] if len(heldout) else heldout  # both accuracies

    def save(fig: Figure, name: str) -> None:
        for ax in fig.axes:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        paths.append(out_dir / f"{name}.png")
        fig.savefig(paths[-1], dpi=80)

    for name, x, scale, xlabel in (
        ("heldout_vs_iteration", "iteration", 1.0, "iteration (-1: the starting model)"),
        ("heldout_vs_wall_time", "wall_time_s", 1 / 60, "training wall time (min)"),
    ):
        save(heldout_figure(arms, shown, splits, x, scale, xlabel), name)

    outcome_arms = {a: arms[a] for a in arms if a != "plus-rm-env"}  # the arms that differ in the reward only
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    if len(training):
        _lines(left, training[training.arm.isin(list(outcome_arms))], "iteration", names.ACCURACY, outcome_arms)
    if len(shown) and splits:
        rows = shown[(shown.split == splits[0]) & shown.arm.isin(list(outcome_arms))]
        _lines(right, rows, "iteration", "strict_accuracy", outcome_arms)
    left.set(title="training-batch accuracy (sampled)", xlabel="iteration", ylim=(-0.02, 1.02))
    right.set(title=f"held-out {splits[0] if splits else ''} strict accuracy", xlabel="iteration", ylim=(-0.02, 1.02))
    save(fig, "integrated_vs_outcome")

    fig = Figure(figsize=(15, 4.2), layout="constrained")
    for ax, metric in zip(fig.subplots(1, 3), RM_ACCURACY):
        if len(training):
            _lines(ax, training, "iteration", metric, arms)
        ax.set(title=f"{metric} (training rollouts)", xlabel="iteration", ylim=(-0.02, 1.02))
        if not len(training) or training[metric].isna().all():
            ax.text(0.5, 0.5, "not measured", ha="center", transform=ax.transAxes)
    save(fig, "rm_accuracy")
    save(heldout_rm_figure(arms, shown, splits[0] if splits else ""), "heldout_rm")

    fig = Figure(figsize=(6, 4.2), layout="constrained")
    ax = fig.subplots()
    if len(training):
        _lines(ax, training, "iteration", names.ADAPT_ACCEPTED_TOTAL, arms)
    ax.set(title="accepted (rewritten) tasks, cumulative", xlabel="iteration")
    save(fig, "accepted_tasks")
    return paths


def table_metrics(table: pd.DataFrame, splits: list[str]) -> dict[str, float]:
    """Flat numbers for the MLflow parent run: `<arm>/heldout_<split>_strict` and the RM numbers."""
    out = {}
    for r in table.to_dict("records"):
        for split in splits:
            if r[f"strict_{split}"]:
                out[f"{r['arm']}/heldout_{split}_strict"] = r[f"strict_{split}"]["rate"]
        for metric in TRAINING_METRICS[1:]:
            out[f"{r['arm']}/{metric.replace('/', '_')}"] = r[metric]
    return {k: v for k, v in out.items() if v == v and not np.isinf(v)}
