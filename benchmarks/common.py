"""Shared by the benchmarks: the FLOP ceiling of this machine, timed in the same process, what
the CPU is (`cpu_line`) and whether it can time bf16 at all (`timed_precisions`).

Machines running the benchmarks are shared and noisy, so every benchmark times its baseline,
its subject and the ceiling in one process, one after another, and prints RATIOS: compare
ratios across runs, not absolute numbers.

A benchmark times only the precisions it is asked for, and never bf16 on a CPU without bf16
units (neither amx_bf16 nor avx512_bf16 among its flags): there torch emulates bf16 on slow
fallback kernels (~0.3 GFLOP/s on an AVX2 EPYC, models/precision.py), so the figure would say
nothing about bf16 and a large matmul can take minutes. The flags are the library's
(`rlanything.models.precision.cpu_flags`): /proc/cpuinfo's, or RLANYTHING_CPU_FLAGS
(space-separated) when it is set, e.g. `RLANYTHING_CPU_FLAGS="avx2 avx512f"` to see what a
benchmark does on a CPU without bf16 units.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch

from rlanything.models.precision import BF16_FLAGS, FLAGS_ENV, cpu_flags


def timed(fn, repeats: int = 3) -> float:
    """Median wall seconds of `fn()` over `repeats` runs (after one warm-up run)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fastest_ms(fn, repeats: int) -> float:
    """Fastest wall time of `fn()` over `repeats` runs, in ms (warm it up before): on a shared
    machine neighbours only ever slow a run down, so the fastest is the closest to the work."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def matmul_ceiling(dtype: torch.dtype = torch.float32, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n×n @ n×n matmul in `dtype`: what this CPU (or GPU) can do at best."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)

    def run():
        (a @ b).sum().item()

    return 2 * n**3 / timed(run, repeats)


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def flags_source() -> str:
    """Where `cpu_flags()` read the flags: RLANYTHING_CPU_FLAGS when it is set, else /proc/cpuinfo."""
    return FLAGS_ENV if FLAGS_ENV in os.environ else "/proc/cpuinfo"


def cpu_line() -> str:
    """The CPU's model name and which of CPU_FLAGS (the units fp32 and bf16 matmuls can use) it
    reports (`cpu_flags()`: /proc/cpuinfo, or RLANYTHING_CPU_FLAGS when set, then named)."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")
    flags = cpu_flags()
    line = f"cpu {name}: " + ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in CPU_FLAGS)
    return line + (f" (flags from {FLAGS_ENV})" if FLAGS_ENV in os.environ else "")


def bf16_units() -> list[str]:
    """Which bf16 matrix units (BF16_FLAGS: amx_bf16, avx512_bf16) the CPU's flags name."""
    flags = cpu_flags()
    return [flag for flag in BF16_FLAGS if flag in flags]


def timed_precisions(precisions: list[str]) -> list[str]:
    """`precisions` (of fp32, bf16) as they will be timed: bf16 left out, with one line saying
    so, on a CPU without bf16 units (there it is emulated: timing it measures the emulation)."""
    if "bf16" not in precisions or bf16_units():
        return list(precisions)
    print(
        f"   bf16 not timed on this CPU: no bf16 units (neither {' nor '.join(BF16_FLAGS)} "
        f"in the flags of {flags_source()}); bf16 would run on slow emulation kernels",
        flush=True,
    )
    return [p for p in precisions if p != "bf16"]


def params_of(model) -> int:
    """Parameters that cost FLOPs per token (the tied input embedding is a lookup, not a matmul)."""
    total = sum(p.numel() for p in model.parameters())
    if model.config.tie_word_embeddings:
        return total  # the (tied) matrix is used once, as the LM head
    return total - model.get_input_embeddings().weight.numel()


def header(title: str) -> None:
    print(f"== {title}")
    print(
        f"   torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"device {'cuda' if torch.cuda.is_available() else 'cpu'}; shared machine: read the RATIOS"
    )


class TokensFed:
    """`with TokensFed(model, ...) as fed:` counts in `fed.total` the non-pad tokens fed to the
    models' forwards (a prefill's prompt tokens, one per row per decode step): the work an engine
    really ran, so a prompt prefix it reused from a cache is not counted. `fed.calls`: (rows,
    tokens) per forward."""

    def __init__(self, *models):
        self.models, self.total, self.hooks, self.calls = models, 0, [], []

    def _count(self, module, args, kwargs) -> None:
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")  # mask: (B, cached + fed) columns
        if mask is None or mask.dim() != 2:  # the engine's tree prefill passes a 4-D mask: every node counts
            fed = ids.numel()
        else:
            fed = int(mask[:, -ids.shape[1] :].sum())
        self.total += fed
        self.calls.append((ids.shape[0], fed))

    def __enter__(self) -> TokensFed:
        self.hooks = [m.register_forward_pre_hook(self._count, with_kwargs=True) for m in self.models]
        return self

    def __exit__(self, *exc) -> None:
        for hook in self.hooks:
            hook.remove()


def profile_parts(prof, parts: dict[str, set[str]], per: int = 1) -> dict[str, float]:
    """ms of self time in each group of aten ops of `parts` ({name: op names}), "other" for the
    rest and "total", from a finished `torch.profiler.profile`, divided by `per` (e.g. steps)."""
    out = dict.fromkeys([*parts, "other"], 0.0)
    for event in prof.key_averages():
        part = next((name for name, ops in parts.items() if event.key in ops), "other")
        out[part] += event.self_cpu_time_total / 1000 / per
    out["total"] = sum(out.values())
    return out
