"""Policy-update throughput (tokens/s) and MFU against the FLOP ceiling timed in this run.

    python -m benchmarks.policy_update [--samples 8] [--prompt 160] [--response 48] [--micro 8] [--lora] [--bf16]

One PPO-clip pass (`trainer.ppo_update`, 2 optimizer steps) over `samples` SmolLM2-135M
samples of `prompt` + `response` tokens, timed for each variant in one process:
  torch       the default backend (plain autograd)
  accelerate  the same loop under an in-process accelerate.Accelerator (the `train.backend:
              accelerate` path without a launcher)
  lora        LoRA r=16 on all linear layers of the attention and MLP (--lora)
  bf16        the update as `precision: auto` runs it on a CPU with bf16 units (--bf16): fp32
              weights under bf16 autocast, old log-probs recomputed by the trainer first
              (`algo.old_logprobs: auto` with a bf16 sampler: one more forward)
  bf16-norecompute  the same without that forward (`algo.old_logprobs: sampler`)
  bf16-weights      bfloat16 weights, no autocast (what this flag meant before: not what a run does)
FLOPs counted: 6 · params per token that crosses the model (prompt and response: forward 2P,
backward 4P), i.e. all passes of the update, not the recompute's extra forward (so the bf16
row's MFU is of the useful work); LoRA's frozen weights still cost the forward and
the input-gradient half of the backward, so it is counted the same. MFU = FLOP/s / the matmul
ceiling (fp32, or bf16 for bf16) measured in the same process; the bf16 ceiling only with --bf16.
On a CPU without bf16 units (neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo's flags, or in
RLANYTHING_CPU_FLAGS when set) --bf16 times nothing more, saying so in one line: bf16 runs on
slow emulation kernels there (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from benchmarks.common import header, matmul_ceiling, params_of, timed_precisions
from rlanything.config import LoraConfig
from rlanything.models.engines.transformers_engine import response_logprobs
from rlanything.models.loading import load_model, load_tokenizer, smollm2_model_dir
from rlanything.models.training.lora import add_adapters
from rlanything.models.training.trainer import Sample, TorchBackend, make_optimizer, ppo_update


def make_samples(model, n: int, prompt: int, response: int, pad_id: int) -> list[Sample]:
    rng = random.Random(0)
    seqs = [[rng.randrange(100, 40000) for _ in range(prompt + response)] for _ in range(n)]
    with torch.no_grad():
        old, _ = response_logprobs(model, seqs, [response] * n, pad_id, 1.0)
    return [Sample(s, response, old[i].tolist(), rng.choice([-1.0, 1.0])) for i, s in enumerate(seqs)]


def run(model, samples, pad_id: int, micro: int, backend, precision: str = "fp32", recompute: bool = False) -> float:
    optimizer = make_optimizer(model, lr=1e-5, weight_decay=0.0)
    start = time.perf_counter()
    ppo_update(
        model,
        optimizer,
        samples,
        pad_id=pad_id,
        temperature=1.0,
        clip_eps=0.2,
        kl_beta=0.01,
        grad_clip=1.0,
        updates=2,
        micro_batch_size=micro,
        seed=0,
        backend=backend,
        precision=precision,
        recompute_old=recompute,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=160)
    parser.add_argument("--response", type=int, default=48)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    header(
        f"policy update: SmolLM2-135M, {args.samples} samples × ({args.prompt} + {args.response}) tokens, micro-batch {args.micro}"
    )
    args.bf16 = args.bf16 and "bf16" in timed_precisions(["bf16"])  # not on a CPU without bf16 units
    path = smollm2_model_dir()
    pad_id = load_tokenizer(path).pad_token_id
    params = params_of(load_model(path))
    samples = make_samples(load_model(path), args.samples, args.prompt, args.response, pad_id)
    tokens = args.samples * (args.prompt + args.response)

    from accelerate import Accelerator

    from rlanything.models.training.distributed import AccelerateBackend

    variants = {"torch": lambda: run(load_model(path), samples, pad_id, args.micro, TorchBackend())}

    def accelerate_run() -> float:
        accelerator = Accelerator()
        model = load_model(path)
        optimizer = make_optimizer(model, lr=1e-5, weight_decay=0.0)
        model, optimizer = accelerator.prepare(model, optimizer)
        start = time.perf_counter()
        ppo_update(
            model,
            optimizer,
            samples,
            pad_id=pad_id,
            temperature=1.0,
            clip_eps=0.2,
            kl_beta=0.01,
            grad_clip=1.0,
            updates=2,
            micro_batch_size=args.micro,
            seed=0,
            backend=AccelerateBackend(accelerator),
        )
        return time.perf_counter() - start

    variants["accelerate"] = accelerate_run
    if args.lora:
        variants["lora"] = lambda: run(
            add_adapters(load_model(path), LoraConfig(enabled=True)), samples, pad_id, args.micro, TorchBackend()
        )
    if args.bf16:
        variants["bf16"] = lambda: run(load_model(path), samples, pad_id, args.micro, TorchBackend(), "bf16", True)
        variants["bf16-norecompute"] = lambda: run(
            load_model(path), samples, pad_id, args.micro, TorchBackend(), "bf16"
        )
        variants["bf16-weights"] = lambda: run(
            load_model(path, "bfloat16"), samples, pad_id, args.micro, TorchBackend()
        )

    run(load_model(path), samples[:2], pad_id, args.micro, TorchBackend())  # warm-up, not reported
    seconds = {name: fn() for name, fn in variants.items()}
    ceiling = matmul_ceiling(torch.float32)
    ceiling16 = matmul_ceiling(torch.bfloat16) if args.bf16 else None
    print(
        f"   matmul ceiling fp32 {ceiling / 1e9:.0f} GFLOP/s"
        + (f", bf16 {ceiling16 / 1e9:.0f} GFLOP/s" if ceiling16 else "")
    )
    print(f"   {'variant':16s} {'seconds':>8s} {'tokens/s':>9s} {'time/torch':>11s} {'MFU':>7s}")
    for name, s in seconds.items():
        peak = ceiling16 if name.startswith("bf16") else ceiling
        print(
            f"   {name:16s} {s:8.2f} {tokens / s:9.1f} {s / seconds['torch']:11.2f} {6 * params * tokens / s / peak:7.1%}"
        )


if __name__ == "__main__":
    main()
