"""A run's update replayed in fp32 and in bf16: what the update step costs in each, and where
its time goes.

    python -m benchmarks.update_replay RUN_DIR [--iteration 0] [--kind policy|rm]
        [--precision fp32,bf16] [--attention tree] [--repeats 2] [--micro N] [--memory-gb G] [--mmap-threshold-mb M]
        [--checkpointing on|off] [--profile]

Takes the samples the update of `kind` trained on in that iteration (`agent.rm_roles.update_samples`:
its kept rollout steps or judgments, as the step reads them) and the weights it started from,
and runs the update again as the step runs it (`distributed.run_update`: load, the trainer's own
old log-probs where the precision calls for them (`algo.old_logprobs`), the PPO passes, the
checkpoint written) into a scratch folder: once per precision and repeat, alternating (fp32,
bf16, fp32, bf16, ...) so a neighbour's load falls on both. `--attention tree,mask` alternates
the packed rows' attention as well: `tree` as shipped (`tree_attention`, each shared prefix
once per branch, for rows of TREE_MIN_NODES or more), `mask` every row over its (N, N)
ancestor mask (the path before tree attention). The run's own settings otherwise;
`--micro` overrides the micro-batch size, `--memory-gb` the run's `run.memory_gb`, `--mmap-threshold-mb` its
`run.mmap_threshold_mb`, `--checkpointing` its `optim.gradient_checkpointing`. Prints each
run's seconds and peak resident memory (`memory.peak_gb`, the counter reset before each), the
fastest per precision and the ratio. `--profile`: one more run per precision under torch's profiler, its self time
grouped into PARTS (the profiler's own cost inflates the total a little). On a CPU without bf16
units (neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo's flags, or in RLANYTHING_CPU_FLAGS when
set) bf16 is left out of --precision, with one line saying so: it runs on slow emulation kernels
there (benchmarks/common.py).

The start weights must still be in the run folder: iteration 0 starts from the base model; a
later iteration needs the previous checkpoint (`run.keep_checkpoints`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import cpu_line, header, profile_parts, timed_precisions
from rlanything import memory
from rlanything.agent.rm_roles import update_samples
from rlanything.agent.update_data import steps_taken, update_job
from rlanything.config import load_config
from rlanything.models.precision import recompute_old_logprobs, run_precision
from rlanything.models.training import tree_attention
from rlanything.models.training.distributed import run_update
from rlanything.patching import swapped
from rlanything.storage.layout import RunLayout

# where an update's time goes: aten ops by name (profiler self time); the rest is "other"
PARTS = {
    "matmuls": {"aten::mm", "aten::addmm", "aten::bmm"},
    "attention": {
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    },
    "copies and casts": {"aten::copy_", "aten::_to_copy", "aten::cat", "aten::clone", "aten::index_select"},
    "zero fills": {"aten::fill_", "aten::zero_", "aten::zeros_like"},
    "optimizer and clipping": {"aten::_fused_adamw_", "aten::linalg_vector_norm", "aten::_foreach_norm"},
    "elementwise": {
        "aten::mul",
        "aten::mul_",
        "aten::add",
        "aten::add_",
        "aten::sub",
        "aten::div",
        "aten::sum",
        "aten::silu",
        "aten::silu_backward",
        "aten::pow",
        "aten::exp",
        "aten::where",
        "aten::_softmax",
        "aten::_log_softmax",
        "aten::_log_softmax_backward_data",
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--iteration", type=int, default=0)
    parser.add_argument("--kind", choices=["policy", "rm"], default="policy")
    parser.add_argument("--precision", default="fp32,bf16", help="of fp32, bf16: comma-separated, alternated")
    parser.add_argument("--attention", default="tree", help="of tree, mask: comma-separated, alternated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--micro", type=int, default=None, help="micro-batch size (default: the run's)")
    parser.add_argument("--memory-gb", type=float, default=None, help="the budget (default: the run's)")
    parser.add_argument("--mmap-threshold-mb", type=float, default=None, help="(default: the run's)")
    parser.add_argument("--checkpointing", choices=["on", "off"], default=None, help="(default: the run's)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    config, layout = load_config(args.run_dir / "config.yaml"), RunLayout(args.run_dir)
    section = config.policy if args.kind == "policy" else config.rm
    samples = update_samples(config, layout, args.iteration, args.kind)
    if not samples:
        sys.exit(f"iteration {args.iteration} kept no {args.kind} sample: nothing trained")
    job = update_job(config, layout, args.iteration, args.kind, section, steps_taken(layout, args.kind, args.iteration))
    if not Path(job.start).exists():
        sys.exit(f"the update's start weights {job.start} are gone (run.keep_checkpoints): replay iteration 0")
    if args.micro:
        job = replace(job, micro_batch_size=args.micro)
    if args.checkpointing is not None:
        job = replace(job, gradient_checkpointing=args.checkpointing == "on")
    memory.set_budget(args.memory_gb or config.run.memory_gb)  # as the step sets them
    memory.map_large_blocks(args.mmap_threshold_mb or config.run.mmap_threshold_mb)
    header(f"{args.kind} update of {args.run_dir.name} iteration {args.iteration} replayed")
    print(f"   {cpu_line()}")
    sampler = run_precision(config, layout.run_dir)[args.kind]["generation"].precision  # the samples' log-probs
    tokens = sum(len(s.input_ids) for s in samples)
    print(
        f"   {len(samples)} samples, {tokens} tokens (prompts counted per sample), micro-batch "
        f"{job.micro_batch_size}; sampled in {sampler}; budget {memory.budget_bytes() / 2**30:.1f} GiB"
    )
    precisions = args.precision.split(",")
    assert set(precisions) <= {"fp32", "bf16"}, args.precision
    precisions = timed_precisions(precisions)  # no bf16 on a CPU without bf16 units

    attentions = args.attention.split(",")
    assert set(attentions) <= {"tree", "mask"}, args.attention
    variants = [(p, a) for p in precisions for a in attentions]

    def once(precision: str, attention: str) -> float:
        recompute = recompute_old_logprobs(config.algo.old_logprobs, sampler, precision)
        min_nodes = tree_attention.TREE_MIN_NODES if attention == "tree" else sys.maxsize
        with tempfile.TemporaryDirectory() as out, swapped(tree_attention, "TREE_MIN_NODES", min_nodes):
            memory.release()
            memory.reset_peak()
            start = time.perf_counter()
            run_update(replace(job, out=out, precision=precision, recompute_old=recompute), samples)
            return time.perf_counter() - start

    seconds = {v: [] for v in variants}
    for _ in range(args.repeats):
        for v in variants:
            seconds[v].append(once(*v))
            print(f"   {' '.join(v)}: {seconds[v][-1]:.2f} s, peak {memory.peak_gb():.2f} GiB", flush=True)
    best = {v: min(s) for v, s in seconds.items()}
    print("   fastest: " + ", ".join(f"{' '.join(v)} {s:.2f} s" for v, s in best.items()))
    for a in attentions:
        if ("fp32", a) in best and ("bf16", a) in best:
            print(f"   bf16 speed-up ({a}; fp32 s / bf16 s): {best['fp32', a] / best['bf16', a]:.2f}")
    for p in precisions:
        if (p, "tree") in best and (p, "mask") in best:
            print(f"   tree attention speed-up ({p}; mask s / tree s): {best[p, 'mask'] / best[p, 'tree']:.2f}")
    if args.profile:
        for v in variants:
            with torch.profiler.profile() as prof:
                once(*v)
            parts = ", ".join(f"{part} {ms / 1000:.2f}" for part, ms in profile_parts(prof, PARTS).items())
            print(f"   {' '.join(v)}: where the update goes (s, profiled): {parts}")


if __name__ == "__main__":
    main()
