"""Views of a held-out evaluation: a markdown summary, the terminal table `rlanything eval`
prints, a bar plot per split, and the curve of held-out accuracy over training (against
iteration and against training wall time). Where the RM judged the episodes (`eval.rm`), the
summary and the table have a second part: its outcome prediction (agent/eval_judge.py). Where
the episodes (or the RM's judgments) were reused from an earlier evaluation of the same weights
(agent/eval_play.py), both say from which.

The terminal table stands on its side (a row per measure, a column per split): with the RM's
measures it has 13 of them, which as columns cut the headers and the figures to "ac…" in an
80-column terminal or a pipe. On its side, the measures' names and two splits' figures fit
there whole.

Plots are drawn on bare `Figure`s (Agg canvas, no pyplot global state), like the run's other
reports. The inputs are the summary table of `agent.eval_play.success_summary` and, for the
curves, the `eval/iter_NNNN/summary.json` files of a run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from rich.table import Table

from rlanything.algo.rm_accuracy import MIN_CLASS
from rlanything.metric_names import RM_MEASURES, is_step_time


def pct(value: float) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}%"


def ci_text(row) -> str:
    """ "37.5% [25.1%, 51.8%]" for a summary row (accuracy and its 95% Wilson interval)."""
    return f"{pct(row['accuracy'])} [{pct(row['ci_low'])}, {pct(row['ci_high'])}]"


def summary_markdown(summary: pd.DataFrame, title: str, details: dict[str, str]) -> str:
    """summary.md: one table row per split (accuracy with its 95% CI, strict-format and
    answer-fallback accuracies side by side, format rate, environment failures)."""
    lines = [f"# {title}", ""]
    lines += [f"- {key}: {value}" for key, value in details.items()]
    lines += [
        "",
        "| split | env | n | accuracy [95% CI] | strict (boxed) [95% CI] | answer fallback | format rate "
        "| env errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, row in summary.iterrows():
        strict = f"{pct(row['strict_accuracy'])} [{pct(row['strict_ci_low'])}, {pct(row['strict_ci_high'])}]"
        lines.append(
            f"| {row['split']} | {row['env_kind']} | {int(row['n'])} | {ci_text(row)} | {strict} | "
            f"{pct(row['fallback_accuracy'])} | {pct(row['format_rate'])} | {int(row['env_errors'])} |"
        )
    lines += [
        "",
        "Accuracy counts an episode solved with the environment's answer fallback (an unboxed "
        "response read as its last number, first word or last code block); strict counts it only when no "
        "step needed the fallback. "
        "Format rate: episodes whose every answer was boxed. Intervals: Wilson score, 95%.",
    ]
    if "rm_outcome_accuracy" in summary:
        lines += ["", *rm_markdown(summary)]
    lines += reuse_markdown(summary.to_dict("records"))
    return "\n".join(lines) + "\n"


def _number(value, text: str) -> str:
    return "n/a" if value is None or value != value else text.format(value)


def _known(row, key: str) -> float | None:
    """row[key] of a summary row (a dict or a Series), None where absent, null or NaN."""
    value = row.get(key)
    return None if value is None or value != value else value


OUTCOME_CLASSES = (("rm_solved_judged", "solved"), ("rm_unsolved_judged", "unsolved"))


def auroc_text(row, counts: bool = True, prefix: str = "rm_outcome", classes=OUTCOME_CLASSES) -> str:
    """An AUROC of a summary row with its 95% interval, "0.69 [0.56, 0.81]": the RM's outcome
    AUROC (`prefix` rm_outcome), or its process AUROC (`process_auroc_text`). Where fewer than
    `MIN_CLASS` items of a class (`classes`: (count key, name)) were judged, the counts instead of
    an interval: "0.62 (too few: 1 solved)" (without `counts`: "0.62 (too few)", where the counts
    stand beside it); "n/a" for an AUROC undefined (one class or nothing judged). A summary
    written before the interval existed (no counts): "0.62 [n/a, n/a]"."""
    value = _known(row, f"{prefix}_auroc")
    few = [f"{int(n)} {name}" for key, name in classes if (n := _known(row, key)) is not None and n < MIN_CLASS]
    text = "n/a" if value is None else f"{value:.2f}"
    if few:
        return f"{text} (too few: {', '.join(few)})" if counts else f"{text} (too few)"
    if value is None:
        return text
    low, high = (_number(_known(row, f"{prefix}_auroc_{k}"), "{:.2f}") for k in ("low", "high"))
    return f"{text} [{low}, {high}]"


def process_auroc_text(row, prefix: str = "rm_process") -> str:
    """The RM's process AUROC (`prefix`: rm_process, the steps before an episode's last; rm_last,
    the last steps) as `auroc_text` writes it, its classes the good and bad labelled steps:
    "0.71 [0.64, 0.78]", "0.55 (too few: 3 bad)", "n/a" without labels or with one label only."""
    return auroc_text(row, prefix=prefix, classes=((f"{prefix}_good", "good"), (f"{prefix}_bad", "bad")))


def process_markdown(summary: pd.DataFrame) -> list[str]:
    """summary.md's part on the RM against the environment's step labels, and what it answers per
    outcome and label; [] where no split has step labels."""
    rows = [r for _, r in summary.iterrows() if _known(r, "rm_process_good") is not None]
    if not rows:
        return []
    lines = [
        "",
        "## Reward model against the step labels",
        "",
        "| split | progress / setbacks | progress AUROC [95% CI] | no-ops (mean verdict) | "
        "steps before the last (good / bad) | process accuracy | process AUROC [95% CI] | "
        "last steps (good / bad) | last-step accuracy | last-step AUROC |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        counts = [f"{int(row[f'{p}_good'])} / {int(row[f'{p}_bad'])}" for p in ("rm_process", "rm_last")]
        progress = "n/a"
        if _known(row, "rm_progress_good") is not None:
            progress = f"{int(row['rm_progress_good'])} / {int(row['rm_progress_bad'])}"
        unchanged = _number(_known(row, "rm_unchanged_steps"), "{:.0f}")
        unchanged += f" ({_number(_known(row, 'rm_unchanged_mean'), '{:+.2f}')})"
        lines.append(
            f"| {row['split']} | {progress} | {process_auroc_text(row, 'rm_progress')} | {unchanged} | "
            f"{counts[0]} | {pct(_known(row, 'rm_process_accuracy'))} | {process_auroc_text(row)} | "
            f"{counts[1]} | {pct(_known(row, 'rm_last_accuracy'))} | {process_auroc_text(row, 'rm_last')} |"
        )
    lines += [
        "",
        "A step's verdict is the sign of its mean parsed verdict (a tie or nothing parsed counts as wrong "
        "for the accuracy); the AUROC ranks good steps above bad ones by that mean. All but the last-step "
        "columns count the steps before an episode's last: a won game's last step shows the win message, "
        "which a judge reads off without judging the step. The headline is the progress AUROC: steps that "
        "moved the game towards its win (closer) against setbacks (farther, invalid, lost); admissible "
        "no-ops (unchanged: look, examine) are left out of it and shown apart. The process AUROC beside "
        "it is the older figure, which counts a no-op as a good step.",
        "",
        "What the RM answers (share of its parsed verdicts that say +1):",
        "",
        "| split | group | +1 share | verdicts |",
        "|---|---|---|---|",
    ]
    for row in rows:
        for group, (share, n) in (row.get("rm_verdict_shares") or {}).items():
            lines.append(f"| {row['split']} | {group} | {pct(share)} | {n} |")
    return lines


def rm_markdown(summary: pd.DataFrame) -> list[str]:
    """The RM's table of summary.md: one row per split (`RM_MEASURES`)."""
    lines = [
        "## Reward model",
        "",
        "| split | judged | outcome accuracy | outcome AUROC [95% CI] | step accuracy | score gap | parse rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, row in summary.iterrows():
        lines.append(
            f"| {row['split']} | {_number(row['rm_judged'], '{:.0f}')} | {pct(row['rm_outcome_accuracy'])} | "
            f"{auroc_text(row)} | {pct(row['rm_step_accuracy'])} | "
            f"{_number(row['rm_score_gap'], '{:+.2f}')} | {pct(row['rm_parse_rate'])} |"
        )
    return lines + [
        "",
        "The RM of the same checkpoint judged every step of every valid episode, as in training. Outcome "
        "accuracy: the sign of an episode's mean step score against its outcome (a tie counts as wrong); "
        "AUROC: that score ranking solved above unsolved episodes (n/a with one outcome only), with its 95% "
        f"interval (a stratified bootstrap) where at least {MIN_CLASS} judged episodes were solved "
        "and as many unsolved, else the count that is too few to decide; step "
        "accuracy: each step's majority verdict against its episode's outcome; score gap: mean score − "
        "mean outcome (positive: the RM is more pleased than the verifier).",
        *process_markdown(summary),
    ]


def reuse_markdown(rows: list[dict]) -> list[str]:
    """summary.md's lines on reused episodes and judgments, one per split that reused any."""
    lines = []
    for row in rows:
        if _known(row, "episodes_from"):
            line = f"- {row['split']}: episodes reused from {row['episodes_from']} (the same policy weights, "
            line += "problems and settings: not played again)"
            if "rm_outcome_accuracy" in row:
                judged = _known(row, "judgments_from")
                line += f"; RM judgments {f'reused from {judged} (the same RM)' if judged else 'new (the RM changed)'}"
            lines.append(line)
    return ["", "## Reused", "", *lines] if lines else []


def _judged_text(row: dict) -> str:
    judged, solved = _known(row, "rm_judged"), _known(row, "rm_solved_judged")
    return "n/a" if judged is None else f"{judged:.0f}" + ("" if solved is None else f" ({solved:.0f} solved)")


EVAL_TABLE_POLICY = (  # (measure, its text in a summary row): the policy's rows of `eval_table`
    ("n (valid episodes)", lambda r: str(int(r["n"]))),
    ("accuracy [95% CI]", ci_text),
    ("strict (boxed)", lambda r: pct(r["strict_accuracy"])),
    ("answer fallback", lambda r: pct(r["fallback_accuracy"])),
    ("format rate", lambda r: pct(r["format_rate"])),
    ("env errors", lambda r: str(int(r["env_errors"]))),
)
EVAL_TABLE_RM = (  # the RM's rows, where it judged the episodes (eval.rm)
    ("RM judged", _judged_text),
    ("RM outcome accuracy", lambda r: pct(_known(r, "rm_outcome_accuracy"))),
    ("RM AUROC [95% CI]", lambda r: auroc_text(r, counts=False)),
    ("RM step accuracy", lambda r: pct(_known(r, "rm_step_accuracy"))),
    ("RM score gap", lambda r: _number(_known(r, "rm_score_gap"), "{:+.2f}")),
    ("RM parse rate", lambda r: pct(_known(r, "rm_parse_rate"))),
    ("RM process acc.", lambda r: pct(_known(r, "rm_process_accuracy"))),
    (
        "RM outcome AUROC before last",
        lambda r: auroc_text(r, counts=False, prefix="rm_outcome_before_last", classes=()),
    ),
    ("RM progress AUROC", lambda r: process_auroc_text(r, "rm_progress")),
    ("RM process AUROC", process_auroc_text),
    ("RM last-step AUROC", lambda r: process_auroc_text(r, "rm_last")),
)


def eval_table(summary: list[dict], title: str) -> Table:
    """`rlanything eval`'s table of summary.json's split rows, on its side (module docstring): a
    row per measure, a column per split; the RM's rows where it judged, a row saying where the
    episodes (and judgments) came from where any were reused. Every figure fits whole in 80
    columns; a longer one (a long split name) folds onto a second line, none is cut to "…"."""
    rm = any("rm_outcome_accuracy" in row for row in summary)
    reused = any(_known(row, "episodes_from") for row in summary)
    table = Table(title=title, caption=_caption(rm, reused), caption_justify="left")
    table.add_column("measure", overflow="fold")
    for row in summary:
        table.add_column(row["split"], overflow="fold")
    policy = [*EVAL_TABLE_POLICY]
    if reused:
        policy.append(
            ("episodes", lambda r: f"reused: {r['episodes_from']}" if _known(r, "episodes_from") else "played")
        )
    for name, text in policy:
        table.add_row(name, *(text(row) for row in summary))
    if rm:
        table.add_section()
        judged = (
            ("RM judgments", lambda r: f"reused: {r['judgments_from']}" if _known(r, "judgments_from") else "new"),
        )
        for name, text in (*EVAL_TABLE_RM, *(judged if reused else ())):
            table.add_row(name, *(text(row) if "rm_outcome_accuracy" in row else "n/a" for row in summary))
    return table


def _caption(rm: bool, reused: bool) -> str:
    notes = ["Greedy episodes; intervals: Wilson score, 95%."]
    if rm:
        notes.append(
            f"RM AUROC: solved above unsolved episodes by mean step score; its interval needs {MIN_CLASS} judged "
            "episodes of each outcome, else (too few). RM process: its step verdicts against the environment's "
            "step labels, on the steps before an episode's last (last-step: those apart)."
        )
    if reused:
        notes.append("Reused: the same weights played these problems in that evaluation (summary.md).")
    return " ".join(notes)


def plot_splits(summary: pd.DataFrame, title: str, out: Path) -> Path:
    """A bar per split and measure (accuracy, strict accuracy, format rate), 95% CIs as whiskers."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    measures = [
        ("accuracy", "ci_low", "ci_high", "tab:blue"),
        ("strict_accuracy", "strict_ci_low", "strict_ci_high", "tab:green"),
        ("format_rate", None, None, "tab:grey"),
    ]
    width = 0.8 / len(measures)
    for m, (key, low, high, color) in enumerate(measures):
        xs = [i + (m - 1) * width for i in range(len(summary))]
        values = summary[key].fillna(0).to_numpy(float)
        err = None
        if low:
            err = [(values - summary[low].fillna(0)).clip(lower=0), (summary[high].fillna(0) - values).clip(lower=0)]
        bars = ax.bar(xs, values, width, yerr=err, capsize=3, color=color, label=key.replace("_", " "))
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(summary)), [f"{r.split}\n(n={int(r.n)})" for r in summary.itertuples()])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("rate")
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.savefig(out, dpi=80)
    return out


def step_seconds(summary: dict) -> float:
    """Training time of one iteration: the sum of its steps' own wall times (`time/*_s` in its
    summary.json)."""
    return sum(v for k, v in summary.items() if is_step_time(k))


def training_wall_time(run_dir: Path, iteration: int) -> float:
    """Seconds of training up to the end of `iteration`: the step wall times (`time/*_s`) in
    iter_NNNN/summary.json summed over iterations 0..iteration (resume gaps and evaluations
    excluded)."""
    total = 0.0
    for i in range(iteration + 1):
        path = Path(run_dir) / f"iter_{i:04d}" / "summary.json"
        if path.exists():
            total += step_seconds(json.loads(path.read_text()))
    return total


def eval_history(run_dir: Path) -> pd.DataFrame:
    """One row per (evaluated iteration, split) from `<run>/eval/iter_NNNN/summary.json` (and
    `eval/base/`, the starting model, iteration -1). The RM's measures (`RM_MEASURES`) are NaN
    where it judged nothing: eval.rm off, or an evaluation written before they existed."""
    rows = []
    for path in sorted((Path(run_dir) / "eval").glob("*/summary.json")):
        record = json.loads(path.read_text())
        for split in record["splits"]:
            rows.append({"iteration": record["iteration"], "wall_time_s": record["wall_time_s"], **split})
    frame = pd.DataFrame(rows)
    for column in RM_MEASURES:  # null in JSON, or absent
        frame[column] = frame[column].astype(float) if column in frame else math.nan
    return frame


def plot_eval_curves(history: pd.DataFrame, out: Path) -> Path:
    """eval_curves.png: held-out accuracy (band: 95% CI) and strict accuracy per split, against
    iteration (left) and training wall time in minutes (right)."""
    fig = Figure(figsize=(13, 4.5), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, (x, label) in zip(axes, (("iteration", "iteration"), ("wall_time_s", "training wall time (min)"))):
        for split, rows in history.groupby("split"):
            rows = rows.sort_values("iteration")
            xs = rows[x] / 60 if x == "wall_time_s" else rows[x]
            line = ax.plot(xs, rows.accuracy, marker="o", label=f"{split} accuracy")[0]
            ax.fill_between(xs, rows.ci_low, rows.ci_high, color=line.get_color(), alpha=0.15)
            ax.plot(
                xs, rows.strict_accuracy, marker="x", ls="--", color=line.get_color(), label=f"{split} strict (boxed)"
            )
        ax.set_xlabel(label)
        if x == "iteration":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"run {out.parent.name}: held-out accuracy (greedy), 95% Wilson bands")
    fig.savefig(out, dpi=80)
    return out
