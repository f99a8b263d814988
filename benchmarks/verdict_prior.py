"""How far the RM's verdict prior moved: P(+1) of the constrained verdict on one iteration's judged
prompts, under the RM that judged them and under another (by default the run's starting RM).

    python -m benchmarks.verdict_prior RUN_DIR --iteration 1 [--rm builtin:smollm2-135m-instruct]

The iteration's judgments hold each judged step's exact prompt (with any reasoning, the context
the verdict was drawn in). Each distinct one is scored with both verdicts appended
(`models.judge.verdict_choice`: "\\boxed{" then "1" or "-1"), and P(+1) is the first option
token's probability renormalised over the two, as the judge draws it. Printed per RM: the mean
P(+1) over the steps, over the steps of won and of lost episodes, and its AUROC for the outcome.
The same prompts under both RMs isolate the RM update from the change in the policy's games:
a judge whose +1 share jumped between two iterations either saw other games or was moved.
The checkpoint that judged must still be in the run folder (`run.keep_checkpoints`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import cpu_line, header
from rlanything.algo.rm_accuracy import auroc
from rlanything.config import load_config
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.judge import verdict_choice
from rlanything.models.loading import load_model, load_tokenizer, resolve_model_path
from rlanything.models.precision import precision_of


def plus_probability(model_dir: Path, precision: str, prompts: list[list[int]], temperature: float) -> np.ndarray:
    """P(+1) of the constrained verdict after each prompt, under the model in `model_dir`."""
    tokenizer = load_tokenizer(model_dir)
    engine = TransformersEngine(
        load_model(model_dir, {"bf16": "bfloat16", "fp32": "float32"}[precision]), tokenizer, 16
    )
    choice = verdict_choice(tokenizer)
    first = {}
    for score, option in choice.options.items():
        tails = [choice.opener + option + choice.closer] * len(prompts)
        scored = engine.score(prompts, tails, temperature=temperature)
        first[score] = np.array([row[len(choice.opener)] for row in scored])
    return 1.0 / (1.0 + np.exp(first[-1] - first[1]))


def judged_steps(folder: Path) -> pd.DataFrame:
    """An iteration folder's judged steps, one row each (its first judgment: the m judgments of a
    step share its prompt and the judging weights), with `prompts` as lists of token ids."""
    judged = pd.read_parquet(folder / "judgments.parquet").drop_duplicates(["traj_id", "step_idx"])
    return judged.assign(prompts=[list(map(int, ids)) for ids in judged.prompt_ids])


def shown(value: float, missing: str = "n/a") -> str:
    """`value` to 3 decimals, or `missing` where it is NaN (a mean or AUROC of a class that did
    not occur: `auroc` is NaN unless both do)."""
    return missing if np.isnan(value) else f"{value:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--iteration", type=int, required=True)
    ap.add_argument("--rm", help="the RM to compare with: a folder or builtin:NAME; default the run's rm.model")
    args = ap.parse_args()
    header("verdict_prior: P(+1) of the verdict on the same prompts under two RMs")
    print(f"   {cpu_line()}")
    config = load_config(args.run_dir / "config.yaml")
    folder = args.run_dir / f"iter_{args.iteration:04d}"
    judged = judged_steps(folder)
    outcome = pd.read_parquet(folder / "outcomes.parquet").set_index("traj_id").outcome
    won = judged.traj_id.map(outcome).to_numpy() > 0
    prompts = list(judged.prompts)
    judge = judged.weights.iloc[0]
    mine = Path(judge) if Path(judge).is_absolute() else args.run_dir / judge
    other = resolve_model_path(args.rm or config.rm_model)
    precision = precision_of(config, "rm", "generation", args.run_dir)
    print(f"   iteration {args.iteration}: {len(prompts)} judged steps ({won.sum()} of won episodes), {precision}")
    for label, path in (("the RM that judged them", mine), (f"{args.rm or config.rm_model}", other)):
        p = plus_probability(path, precision, prompts, config.rm.temperature)
        won_mean, lost_mean = (p[side].mean() if side.any() else np.nan for side in (won, ~won))
        print(
            f"{label}: mean P(+1) {p.mean():.3f} (won {shown(won_mean)}, lost {shown(lost_mean)}), "
            f"outcome AUROC {shown(auroc(p, won), 'n/a (one class)')}"
        )


if __name__ == "__main__":
    main()
