"""int8 generation, measured and not shipped: two int8 engines beside our fp32 and bf16 decoding
step, each with its sampler–trainer mismatch.

    python -m benchmarks.int8_generation [--rows 64] [--steps 10] [--shape 69:31] [--no-ct2]

Printed first: the CPU and its matmul-relevant flags. Then, on one decoder state of the shipped
run (SHARED:OWN columns per row, as in decode_step.py: 69:31 is mid-rollout), the fastest
`steps` decoding steps of `rows` rows after warm-up, one engine after another in one process:
  ct2 float32, ct2 int8   CTranslate2 on the model converted to float32 and to int8 (int8
                          weights, float32 activations and the rest: `int8_float32`), every row a
                          whole prompt (decode_step.ct2_step_ms); skipped when ctranslate2 is not
                          installed (`pip install '.[cpu-engines]'`)
  ours fp32, bf16         our engine's step with the shared prefix held once (decode_step.step_ms)
  ours torch int8         the same step on the fp32 model with every Linear layer but the LM head
                          dynamically quantised by torch (`torch.ao.quantization.quantize_dynamic`:
                          int8 weights per output channel, each call's activations quantised to
                          int8 with one scale per tensor)
The mismatch of each: the first `rows` rows teacher-forced (SHARED + OWN tokens each, seed 0),
log p of every predicted token at T = 1 against our fp32 model's (what an fp32 trainer computes
for the PPO ratio; the prefix's tokens, the same in every row, counted once): mean, 99th
percentile and max of |Δ log p|, and the share of tokens whose ratio exp(Δ) leaves [1/2, 2].
On a CPU without bf16 units (neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo's flags, or in
RLANYTHING_CPU_FLAGS when set) `ours bf16` is left out, with one line saying so: bf16 runs on
slow emulation kernels there (benchmarks/common.py).
ct2's log-probs come from its own `score_batch` (its float32 row checks that they line up with ours). Ratios are within this process; nothing here is
a shipped path: int8 would ship only if the learning curve held under it (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import warnings
from pathlib import Path

import torch

from benchmarks.common import cpu_line, header, timed_precisions
from benchmarks.cpu_engines import CT2, installed
from benchmarks.decode_step import ct2_step_ms, random_rows, step_ms, teacher_forced_logprobs
from rlanything.models.engines.generation import eos_ids_of
from rlanything.models.engines.prefix_attention import shared_prefix_attention
from rlanything.models.loading import load_model, load_tokenizer, smollm2_model_dir


def torch_int8(model):
    """`model` with every Linear layer but the LM head dynamically quantised (a copy)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notice
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {n: per_channel_dynamic_qconfig for n in names}, inplace=False)


def teacher_ids(vocab: int, rows: int, shape: tuple[int, int], steps: int) -> torch.Tensor:
    prefix_ids, own_ids = random_rows(vocab, rows, *shape, steps)
    return torch.cat([prefix_ids.expand(rows, -1), own_ids], 1)


def flat(logprobs: torch.Tensor, shared: int) -> torch.Tensor:
    """(rows, L - 1) -> the predicted tokens' log p with the prefix's counted once."""
    return torch.cat([logprobs[0, : shared - 1], logprobs[:, shared - 1 :].flatten()])


def ct2_logprobs(model_dir: Path, work: Path, ids: torch.Tensor, quantization: str) -> torch.Tensor:
    """(rows, L - 1) log p of each next token under CTranslate2 in `quantization` (`score_batch`)."""
    tokenizer = load_tokenizer(model_dir)
    generator = CT2(model_dir, work, quantization, tokenizer, eos_ids_of(model_dir, tokenizer)).generator
    results = generator.score_batch([tokenizer.convert_ids_to_tokens(row) for row in ids.tolist()])
    return torch.tensor([r.log_probs for r in results])


def mismatch(reference: torch.Tensor, other: torch.Tensor) -> str:
    diff = (reference - other).abs()
    outside = (diff > torch.log(torch.tensor(2.0))).float().mean()
    return (
        f"|Δ log p| mean {diff.mean():.3f}, p99 {diff.quantile(0.99):.3f}, max {diff.max():.3f}; "
        f"ratio outside [1/2, 2]: {outside:.1%} of {diff.numel()} tokens"
    )


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--shape", default="69:31", help="SHARED:OWN columns of the timed decoder state")
    parser.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out")
    args = parser.parse_args()
    shape = tuple(map(int, args.shape.split(":")))
    header("int8 generation beside fp32 and bf16: one decoding step and the mismatch")
    print(f"   {cpu_line()}", flush=True)
    ours = [*timed_precisions(["fp32", "bf16"]), "torch int8"]  # bf16 only on a CPU with bf16 units
    model_dir, times, logprobs = smollm2_model_dir(), {}, {}
    model = load_model(model_dir, "float32")
    ids = teacher_ids(model.config.vocab_size, args.rows, shape, args.steps)
    del model
    if not args.no_ct2 and installed("ctranslate2"):
        with tempfile.TemporaryDirectory() as work:
            for quantization in ("float32", "int8"):
                ms = ct2_step_ms(model_dir, Path(work) / quantization, args.rows, [shape], quantization)
                times[f"ct2 {quantization}"] = ms[shape]
                logprobs[f"ct2 {quantization}"] = ct2_logprobs(
                    model_dir, Path(work) / f"{quantization}-s", ids, quantization
                )
        gc.collect()
    for name in ours:
        model = load_model(model_dir, "bfloat16" if name == "bf16" else "float32")
        if name == "torch int8":
            model = torch_int8(model)
        with shared_prefix_attention(model) as switched:
            assert switched, "the model's attention cannot be switched: no shared prefix to measure"
            times[f"ours {name}"] = step_ms(model, args.rows, *shape, held_once=True, steps=args.steps)
        logprobs[f"ours {name}"] = teacher_forced_logprobs(model, ids)
        del model
        gc.collect()
    base = times["ours fp32"]
    for label, ms in times.items():
        print(
            f"   {args.rows} rows, shared {shape[0]} own {shape[1]} | {label:16s} {ms:7.1f} ms | ours fp32 / it {base / ms:.2f}"
        )
    reference = flat(logprobs["ours fp32"], shape[0])
    for label, values in logprobs.items():
        if label != "ours fp32":
            print(f"   mismatch against ours fp32 | {label:16s} {mismatch(reference, flat(values, shape[0]))}")


if __name__ == "__main__":
    main()
