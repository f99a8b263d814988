"""Shared by the benchmarks: the FLOP ceiling of this machine, timed in the same process, and
what the CPU is (`cpu_line`).

Machines running the benchmarks are shared and noisy, so every benchmark times its baseline,
its subject and the ceiling in one process, one after another, and prints RATIOS: compare
ratios across runs, not absolute numbers.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch


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


def cpu_line() -> str:
    """The CPU's model name and which of CPU_FLAGS (the units fp32 and bf16 matmuls can use) it
    reports, from /proc/cpuinfo."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")
    flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    return f"cpu {name}: " + ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in CPU_FLAGS)


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
