"""What the RM's first update does to its verdict prior, with the start left on bf16 ties and
placed within the bf16 sampler's values first (the update's `dither_start_to`).

    python -m benchmarks.first_rm_step RUN_DIR [--lr 1e-8,1e-5] [--prompts 40] [--epochs N] [--updates K]
        [--verdicts drawn|expected] [--precision fp32|bf16] [--sum-balanced] [--dithered-only]
        [--stratified] [--fp32-only] [--seed S]

Replays iteration 0's RM update (the samples it trained on, the run's loss settings, AdamW as
shipped, at each `--lr` with no warmup) twice: from the starting RM as it loads, and from it
placed within its bf16 values (`models.precision.dither_to_bf16_`, what the update does when a
bf16 sampler ran the start; from November 29 to December 6 it rounded them, `round_to_bf16_`,
whose bf16 copy is the same). Each result, and each start, is scored on the first `--prompts` steps
the RM judged in iteration 1 (iteration 0 where the run has no later one): P(+1) of the
constrained verdict (`benchmarks.verdict_prior.plus_probability`) loaded in bf16, as the
sampler runs it, and in fp32. Printed first: the share of the start's weights that lie exactly
halfway between two bf16 values. A step whose bf16 P(+1) moves far while its fp32 P(+1) does
not is the rounding, not the update.

What the step did on its own samples: with `algo.rm_advantage: reward` each judged step's payoff
a = advantage·S_j is known, and each result prints P(+1) (fp32) on the steps of payoff > 0 and
< 0 and the paid objective mean a·(2p − 1): a step that raises both classes moved the prior.
The update can be varied: `--epochs` passes over the same samples, each in `--updates`
mini-batches (one optimizer step each, 1 by default whatever the run's setting; expected
verdicts deal whole steps), the verdicts trained (`--verdicts`, `algo.rm_verdicts`), the
update's `--precision`, and with `--sum-balanced` the expected verdicts' advantages rescaled so
that the two payoff signs' sum to zero over the whole batch (no first-order push on a logit
offset every prompt shares; a mini-batch of several is not balanced on its own). `--dithered-only` skips
the start as loaded (the loop's first update starts dithered where a bf16 sampler ran it).
`--stratified` deals the expected verdicts' steps so that every mini-batch holds both payoff
signs in the pass's proportions (`algo.rm_stratify`). `--fp32-only`, for a run whose sampler ran
in fp32: no bf16 rounding or scoring, the start as loaded only (bf16 matmuls are slow on a CPU
without bf16 units). `--seed` draws other mini-batches (default: the run's update's seed).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.common import cpu_line, header
from benchmarks.verdict_prior import judged_steps, plus_probability, shown
from rlanything.agent.rm_roles import update_samples
from rlanything.agent.update_data import steps_taken, update_job
from rlanything.config import load_config
from rlanything.models.loading import load_model, load_tokenizer
from rlanything.models.precision import round_to_bf16_
from rlanything.models.training.distributed import run_update
from rlanything.models.training.saving import save_checkpoint
from rlanything.storage.layout import RunLayout


def tie_share(model) -> float:
    """Share of the fp32 weights exactly halfway between two bf16 values (low 16 bits 0x8000)."""
    ties = total = 0
    for weight in model.parameters():
        if weight.dtype == torch.float32:
            low = weight.detach().contiguous().view(torch.int32) & 0xFFFF
            ties, total = ties + int((low == 0x8000).sum()), total + weight.numel()
    return ties / max(total, 1)


def judged_prompts(run_dir: Path, n: int) -> tuple[int, list[list[int]]]:
    """The first `n` distinct steps the RM judged in iteration 1 (else 0) -> (iteration, prompts)."""
    iteration = 1 if (run_dir / "iter_0001" / "judgments.parquet").exists() else 0
    return iteration, list(judged_steps(run_dir / f"iter_{iteration:04d}").prompts.head(n))


def own_steps(run_dir: Path) -> pd.DataFrame:
    """Iteration 0's kept judged steps, one row each, with their payoff a = advantage·S_j
    (`algo.rm_advantage: reward`: one value a step) and `prompts`."""
    adv = pd.read_parquet(run_dir / "iter_0000" / "advantages.parquet")
    kept = adv[(adv.kind == "rm") & adv.kept][["traj_id", "step_idx", "judge_idx", "advantage"]]
    judged = kept.merge(judged_steps(run_dir / "iter_0000"), on=["traj_id", "step_idx", "judge_idx"])
    return judged.assign(payoff=judged.advantage * judged.step_score)


def sum_balanced(samples: list) -> list:
    """Expected verdicts' samples (+1 then −1 a step) with the advantages of the steps of each
    payoff sign rescaled so that the two signs' c sum to the same magnitude, their total kept
    (unchanged where the batch has one sign only)."""
    c = np.array([s.advantage for s in samples[::2]])
    pos, neg = c[c > 0].sum(), -c[c < 0].sum()
    if not pos or not neg:  # one sign only: nothing to balance against
        return samples
    scale = np.where(c > 0, (pos + neg) / (2 * pos), (pos + neg) / (2 * neg))
    return [replace(s, advantage=s.advantage * scale[k // 2]) for k, s in enumerate(samples)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--lr", default="1e-8,1e-5", help="learning rates of the replayed step, comma-separated")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--epochs", type=int, default=1, help="passes over the samples")
    ap.add_argument("--updates", type=int, default=1, help="mini-batches (optimizer steps) a pass")
    ap.add_argument("--verdicts", choices=["drawn", "expected"], help="algo.rm_verdicts; default the run's")
    ap.add_argument("--precision", choices=["fp32", "bf16"], help="the update's; default the run's")
    ap.add_argument("--sum-balanced", action="store_true", help="expected verdicts: the signs' c sum to 0")
    ap.add_argument("--dithered-only", action="store_true", help="skip the start as loaded")
    ap.add_argument("--stratified", action="store_true", help="both payoff signs in every mini-batch")
    ap.add_argument("--fp32-only", action="store_true", help="no bf16 rounding or scoring")
    ap.add_argument("--seed", type=int, help="the update's shuffle seed; default the run's")
    args = ap.parse_args()
    if args.stratified and args.verdicts == "drawn":
        ap.error("--stratified deals expected verdicts by their payoff's sign: not with --verdicts drawn")
    header("first_rm_step: the RM's first update, from its start as loaded and placed within its bf16 values")
    print(f"   {cpu_line()}")
    config, layout = load_config(args.run_dir / "config.yaml"), RunLayout(args.run_dir)
    algo = {"rm_verdicts": args.verdicts} if args.verdicts else {}
    config = config.model_copy(
        update={
            "algo": config.algo.model_copy(update=algo | {"rm_stratify": args.stratified or config.algo.rm_stratify})
        }
    )
    samples = update_samples(config, layout, 0, "rm")
    if args.sum_balanced:
        samples = sum_balanced(samples)
    job = update_job(config, layout, 0, "rm", config.rm, steps_taken(layout, "rm", 0))
    job = replace(job, epochs=args.epochs, updates=args.updates, precision=args.precision or job.precision)
    job = replace(job, seed=job.seed if args.seed is None else args.seed)
    own = own_steps(args.run_dir) if config.algo.rm_advantage == "reward" else None
    iteration, prompts = judged_prompts(args.run_dir, args.prompts)
    start = Path(job.start)
    model = load_model(start, "float32")
    print(f"   {len(samples)} samples; {len(prompts)} prompts of iteration {iteration}")
    print(f"   start weights exactly halfway between two bf16 values: {tie_share(model):.1%}")

    def score(label: str, folder: Path) -> None:
        precisions = ("fp32",) if args.fp32_only else ("bf16", "fp32")
        p = {prec: plus_probability(folder, prec, prompts, config.rm.temperature).mean() for prec in precisions}
        print(f"   {label}: P(+1) scored in " + ", in ".join(f"{k} {v:.3f}" for k, v in p.items()), flush=True)
        if own is not None and len(own):
            q, a = plus_probability(folder, "fp32", list(own.prompts), config.rm.temperature), own.payoff.to_numpy()
            up, down = (shown(q[side].mean()) if side.any() else "n/a" for side in (a > 0, a < 0))
            print(
                f"     on its {len(own)} steps: P(+1) {up} (payoff > 0), {down} (payoff < 0); "
                f"paid objective {np.mean(a * (2 * q - 1)):+.3f}",
                flush=True,
            )

    with tempfile.TemporaryDirectory() as scratch:
        score("start as loaded", start)
        if not args.fp32_only:
            rounded = Path(scratch) / "rounded-start"
            round_to_bf16_(model)
            save_checkpoint(model, load_tokenizer(start), None, rounded)
            score("start rounded to bf16", rounded)
        del model
        starts = (("as loaded", None), ("placed within its bf16 values", "bf16"))
        starts = starts[:1] if args.fp32_only else starts[1:] if args.dithered_only else starts
        for lr in (float(x) for x in args.lr.split(",")):
            for label, rounding in starts:
                out = Path(scratch) / f"{lr}-{rounding}"
                history = run_update(
                    replace(job, out=str(out), lr=lr, warmup_steps=0, dither_start_to=rounding), samples
                )
                steps = "one step" if len(history) == 1 else f"{len(history)} steps"
                score(f"{steps} at lr {lr:g} from the start {label}", out)
                clipped = " ".join(f"{h['clip_frac']:.2f}" for h in history)
                print(f"     its steps' clip fraction (decision tokens): {clipped}", flush=True)


if __name__ == "__main__":
    main()
