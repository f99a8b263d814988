"""Held-out accuracy of finished runs against training wall time: the learning figure of the docs.

    python -m benchmarks.learning_curve runs/learn-s0 runs/learn-s1 [--minutes 30] [--out curve.png]
        [--csv curve.csv] [--reference earlier.csv]

Reads each run's held-out evaluations (`<run>/eval/*/summary.json`, written by `eval.every` or
`rlanything eval RUN@N`; `eval/base` is the starting model) and prints, per run and split, the
greedy strict accuracy with its 95% Wilson interval at every evaluated iteration whose training
wall time (the sum of the steps' own times up to that iteration: evaluations and start-up
excluded) is within `--minutes`, and draws them all into one PNG (one colour per run, one panel
per split). Nothing is smoothed or averaged: the points are the measurements. `--csv` also
writes those points (run, split, iteration (-1: base), training minutes, strict accuracy and its
interval, n) as CSV: the figure's data, small enough to commit beside it. `--reference` draws
the points of such a CSV from earlier runs beside them, dashed (e.g. the fp32 curve behind a
bf16 one), and prints them too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from rlanything.reports.eval_report import eval_history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--minutes", type=float, default=30.0, help="training wall time shown")
    parser.add_argument("--out", type=Path, default=Path("learning_curve.png"))
    parser.add_argument("--csv", type=Path, default=None, help="also write the points as CSV")
    parser.add_argument("--reference", type=Path, default=None, help="a CSV of earlier runs' points, drawn dashed")
    parser.add_argument("--reference-label", default="earlier", help="what the reference runs' names get appended")
    args = parser.parse_args()
    histories = {run.name: eval_history(run) for run in args.runs}
    splits = sorted({s for h in histories.values() for s in h.split})
    fig = Figure(figsize=(6 * len(splits), 4.2), layout="constrained")
    axes = fig.subplots(1, len(splits), squeeze=False)[0]
    points = []
    print("| run | split | iteration | training min | strict accuracy [95% CI] | n |")
    print("|---|---|---|---|---|---|")
    for name, history in histories.items():
        shown = history[history.wall_time_s <= args.minutes * 60].sort_values(["split", "iteration"])
        for ax, split in zip(axes, splits):
            rows = shown[shown.split == split]
            minutes = rows.wall_time_s / 60
            line = ax.plot(minutes, rows.strict_accuracy, marker="o", label=name)[0]
            ax.fill_between(minutes, rows.strict_ci_low, rows.strict_ci_high, color=line.get_color(), alpha=0.12)
            points.append(rows.assign(run=name, training_min=minutes.round(2)))
            for r in rows.itertuples():
                label = "base" if r.iteration < 0 else r.iteration
                print(
                    f"| {name} | {split} | {label} | {r.wall_time_s / 60:.1f} | {r.strict_accuracy:.1%} "
                    f"[{r.strict_ci_low:.1%}, {r.strict_ci_high:.1%}] | {r.n} |"
                )
    if args.reference:
        earlier = pd.read_csv(args.reference)
        for (name, split), rows in earlier[earlier.training_min <= args.minutes].groupby(["run", "split"]):
            if split not in splits:
                continue
            ax = axes[splits.index(split)]
            ax.plot(
                rows.training_min,
                rows.strict_accuracy,
                marker=".",
                linestyle="--",
                label=f"{name} ({args.reference_label})",
            )
            for r in rows.itertuples():
                label = "base" if r.iteration < 0 else r.iteration
                print(
                    f"| {name} ({args.reference_label}) | {split} | {label} | {r.training_min:.1f} | {r.strict_accuracy:.1%} "
                    f"[{r.strict_ci_low:.1%}, {r.strict_ci_high:.1%}] | {r.n} |"
                )
    for ax, split in zip(axes, splits):
        ax.set_title(f"{split}: strict (boxed) held-out accuracy, greedy")
        ax.set_xlabel("training wall time (min)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(args.out, dpi=80)
    print(f"\nwrote {args.out}")
    if args.csv:
        columns = [
            "run",
            "split",
            "iteration",
            "training_min",
            "strict_accuracy",
            "strict_ci_low",
            "strict_ci_high",
            "n",
        ]
        pd.concat(points)[columns].to_csv(args.csv, index=False, float_format="%.4f")
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
