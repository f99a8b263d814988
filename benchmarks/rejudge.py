"""An evaluation's games judged again by another reward model: the same episodes, the same steps,
the same sampling seeds, only the RM's weights changed.

    python -m benchmarks.rejudge RUN_DIR/eval/iter_0002 --rm builtin:smollm2-135m-instruct

A checkpoint's held-out RM measures (`rlanything eval RUN@N --set eval.rm=true`) are read on the
games its own policy played, so two checkpoints' figures differ in the games as well as in the
judge. This isolates the judge: the RM given by `--rm` (a model folder, `builtin:NAME`, or a run's
`RUN@N` checkpoint) judges the evaluation's saved steps with the run's config (m, verdict mode,
history, its generation precision) and the seed the evaluation's own judging used, and the
script prints the outcome and process measures of both judges side by side. It writes
`rejudged-<label>.judgments.parquet` beside the evaluation; nothing else there changes.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from rlanything.agent.eval_judge import eval_contexts, judge_split, rm_measures
from rlanything.algo.rm_accuracy import verdict_shares
from rlanything.config import load_config
from rlanything.models.loading import resolve_model_path
from rlanything.models.precision import precision_of
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table
from rlanything.storage.schemas import EVAL_EPISODES, EVAL_JUDGMENTS, EVAL_STEP_LABELS, EVAL_STEPS

SHOWN = (
    "rm_outcome_auroc",
    "rm_progress_auroc",
    "rm_process_auroc",
    "rm_process_accuracy",
    "rm_last_auroc",
    "plus_share",  # of the parsed verdicts: a judge that says +1 (or −1) to nearly all ranks nothing
    "rm_progress_p_auroc",  # the progress AUROC of the judge's P(+1), where recorded: no verdict draws
    "rm_p_plus_mean",
)


def rm_weights(target: str) -> tuple[Path, str]:
    """`--rm` -> (weights folder, label): `RUN@N` is that run's RM checkpoint of iteration N."""
    if "@" in target:
        run, iteration = target.rsplit("@", 1)
        return RunLayout(Path(run)).checkpoint("rm", int(iteration)), target.replace("/", "_")
    return resolve_model_path(target), target.replace("/", "_").replace(":", "_")


def measures(episodes: pd.DataFrame, judged: pd.DataFrame, labels: pd.DataFrame, split: str) -> dict:
    shares = verdict_shares(judged.step_score.to_numpy(), judged.parsed.to_numpy(), np.full(len(judged), "all"))
    return rm_measures(episodes, judged, labels)[split] | {"plus_share": shares.get("all", (math.nan,))[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("eval_dir", type=Path, help="RUN_DIR/eval/NAME: an evaluation that judged its games")
    parser.add_argument("--rm", required=True, help="the other judge: a model folder, builtin:NAME or RUN@N")
    parser.add_argument("--split", default="in_domain")
    args = parser.parse_args(argv)
    run_dir = args.eval_dir.parents[1]
    config = load_config(str(run_dir / "config.yaml"), [])
    split = args.split
    episodes = read_table(args.eval_dir / "episodes.parquet", EVAL_EPISODES)
    episodes = episodes[episodes.split == split]
    steps = read_table(args.eval_dir / "steps.parquet", EVAL_STEPS)
    steps = steps[steps.split == split]
    labels = read_table(args.eval_dir / "step_labels.parquet", EVAL_STEP_LABELS)
    own = read_table(args.eval_dir / "judgments.parquet", EVAL_JUDGMENTS)
    own = own[own.split == split]
    iteration = None if pd.isna(episodes.iteration.iloc[0]) else int(episodes.iteration.iloc[0])
    weights, label = rm_weights(args.rm)
    contexts = eval_contexts(episodes, steps, config.rm.history_steps)  # as the evaluation built them
    out = args.eval_dir / f"rejudged-{label}.judgments.parquet"
    precision = precision_of(config, "rm", run_dir=str(run_dir))
    judge_split(config, weights, label, contexts, split, iteration, out, precision)
    other = read_table(out, EVAL_JUDGMENTS)
    rows = {"own RM (" + str(own.weights.iloc[0]) + ")": measures(episodes, own, labels, split)}
    rows[f"--rm {args.rm}"] = measures(episodes, other, labels, split)
    print(f"{args.eval_dir}, split {split}: {len(episodes)} episodes, {len(contexts)} steps judged")
    print("| judge | " + " | ".join(SHOWN) + " |")
    print("|---|" + "---|" * len(SHOWN))
    for name, m in rows.items():
        cells = [
            f"{m[k]:.2f} [{m[k + '_low']:.2f}, {m[k + '_high']:.2f}]" if k + "_low" in m else f"{m[k]:.3f}"
            for k in SHOWN
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
