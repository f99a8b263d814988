"""Orchestration overhead of training iterations, and peak memory of a SmolLM2 iteration.

    python -m benchmarks.iteration [--model tiny|smollm2|shipped|arith|both] [--iterations 3]
        [--precision fp32,bf16] [--set KEY=VALUE ...]

Runs `rlanything train` for `iterations` iterations in a subprocess (fresh run folder and
Prefect home under a temporary directory, ephemeral Prefect server, SQLite MLflow), then reads
each iteration's summary.json and the time its DONE marker was written. Printed:
  steps       the sum of an iteration's seven steps' own times (`time/<step>_s`: model loads,
              compute, Parquet I/O): the work
  start-up    from launching the process to iteration 0's DONE, minus iteration 0's steps:
              imports, the ephemeral Prefect server's first start, MLflow's database, paid once
              per process
  per iter    steady state, iterations 1..N-1: the time between consecutive DONE markers
              (flow run, Prefect task states and result records, MLflow logging, the reports)
              minus that iteration's steps; overhead / period is the issue's "≤ 5%" figure
  peak RSS    the largest resident set of the training process (getrusage of the child)
`tiny` uses configs/tiny.yaml (3M-parameter models: almost all overhead); `smollm2` uses
configs/smollm2-arith-full.yaml shrunk to 2 tasks × 4 rollouts (the memory of a real iteration:
policy, RM and environment model are loaded one step at a time). `shipped` runs
configs/smollm2-arith-full.yaml exactly as shipped (8 problems × 8 rollouts, m = 3, held-out eval
every 2 iterations: its time falls outside the DONE-to-DONE period) and prints each step's share
of the last iteration: the figure a user of the small-model run sees. `arith` runs
configs/smollm2-arith.yaml as shipped (the README's learning curve: the policy-only iteration).
`--precision fp32,bf16` runs each model once per precision, back to back in this process's
session (every model section's generation and update set to it: `precision`,
`optim.precision`), and prints the bf16 run's times over the fp32 run's. The two runs sample
different tokens (bf16 log-probs differ), so their iterations hold somewhat different work.
On a CPU without bf16 units (neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo's flags, or in
RLANYTHING_CPU_FLAGS when set) bf16 is left out of --precision, with one line saying so: it runs
on slow emulation kernels there (benchmarks/common.py).
Printed first: the CPU's model and its bf16-relevant flags.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import timed_precisions

REPO = Path(__file__).resolve().parents[1]
RUNS = {
    "tiny": ("configs/tiny.yaml", []),
    "smollm2": (
        "configs/smollm2-arith-full.yaml",
        [
            "policy.tasks_per_iteration=2",
            "policy.group_size=4",
            "env.num_problems=4",
            "rm.judgments_per_step=2",
            "policy.max_new_tokens=48",
            "rm.max_new_tokens=32",
        ],
    ),
    "shipped": ("configs/smollm2-arith-full.yaml", []),
    "arith": ("configs/smollm2-arith.yaml", []),
}
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")  # what decides bf16's speed


def precision_sets(precision: str) -> list[str]:
    """Overrides that run every model section's generation and update in `precision`."""
    keys = ("policy.precision", "policy.optim.precision", "rm.precision", "rm.optim.precision")
    return [f"{key}={precision}" for key in keys]


def run_once(name: str, root: Path, iterations: int, extra: list[str]) -> dict:
    config, overrides = RUNS[name]
    sets = [a for o in [f"run.root={root}", f"run.name=bench-{name}", *overrides, *extra] for a in ("--set", o)]
    env = {
        **os.environ,
        "PREFECT_HOME": str(root / "prefect"),
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "RLANYTHING_PROGRESS": "0",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }
    cli = [
        sys.executable,
        "-c",
        "from rlanything.cli import app; app()",
        "train",
        "--config",
        str(REPO / config),
        "--iterations",
        str(iterations),
        *sets,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.time()  # the clock file modification times use
    proc = subprocess.run(cli, cwd=root, env=env, capture_output=True, text=True)
    wall = time.time() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode != 0:
        raise SystemExit(f"{name} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    steps, done = [], []
    for k in range(iterations):
        folder = root / f"bench-{name}" / f"iter_{k:04d}"
        summary = json.loads((folder / "summary.json").read_text())
        steps.append(
            {key[len("time/") : -2]: v for key, v in summary.items() if key.startswith("time/") and key.endswith("_s")}
        )
        done.append((folder / "DONE").stat().st_mtime - start)
    return {"wall": wall, "steps": steps, "done": done, "peak_mb": max(peak_kb, before) / 1024}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def cpu_flags_line() -> str:
    from rlanything.models.precision import cpu_flags

    flags = cpu_flags()
    return " ".join(f"{flag}{'+' if flag in flags else '-'}" for flag in FLAGS)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2", "shipped", "arith", "both"], default="both")
    parser.add_argument("--iterations", type=int, default=3, help="≥ 2: the first pays the start-up")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="more config overrides (e.g. rm.kv_reuse_gb=0)"
    )
    parser.add_argument(
        "--precision", default="", help="comma-separated fp32,bf16: one run each, back to back (default: the config's)"
    )
    args = parser.parse_args()
    names = ["tiny", "smollm2"] if args.model == "both" else [args.model]
    print(f"== CPU: {cpu_model()}, {os.cpu_count()} cores, {torch_threads()} torch threads; {cpu_flags_line()}")
    print(
        f"== {args.iterations} training iterations through `rlanything train` (subprocess); "
        "shared machine: read the RATIOS"
    )
    asked = [p for p in args.precision.split(",") if p]
    precisions = timed_precisions(asked) if asked else [None]  # None: the config's own
    if not precisions:
        return
    for name in names:
        periods = {}
        for precision in precisions:
            extra = args.set + (precision_sets(precision) if precision else [])
            with tempfile.TemporaryDirectory(prefix=f"rla-bench-{name}-") as tmp:
                result = run_once(name, Path(tmp), args.iterations, extra)
            if precision:
                print(f"   -- {name}, precision {precision}")
            periods[precision] = report(name, result)
        if {"fp32", "bf16"} <= set(periods) and periods["fp32"] and periods["bf16"]:
            (f_period, f_steps), (b_period, b_steps) = periods["fp32"], periods["bf16"]
            shares = ", ".join(f"{k} {f_steps[k] / b_steps[k]:.2f}x" for k in f_steps if b_steps.get(k))
            print(f"   {name}: bf16 per iteration {f_period / b_period:.2f}x as fast as fp32 (steps: {shares})")


def report(name: str, result: dict) -> tuple[float, dict] | None:
    """Print one run's figures -> (steady per-iteration seconds, mean step seconds over
    iterations 1..N-1), None with one iteration."""
    totals = [sum(s.values()) for s in result["steps"]]
    done = result["done"]
    detail = ", ".join(f"{k} {v:.1f}" for k, v in result["steps"][-1].items())
    print(f"   {name:8s} process wall {result['wall']:6.1f} s | last iteration's steps {totals[-1]:5.1f} s ({detail})")
    print(f"   {'':8s} start-up {done[0] - totals[0]:5.1f} s (once per process) | peak RSS {result['peak_mb']:.0f} MB")
    if name == "shipped" and len(done) > 1:
        period = done[-1] - done[-2]
        shares = ", ".join(f"{k} {v:.1f} s ({v / period:.0%})" for k, v in result["steps"][-1].items())
        print(f"   {'':8s} last iteration {period:5.1f} s DONE to DONE: {shares}")
    if len(done) > 1:
        period = (done[-1] - done[0]) / (len(done) - 1)
        overhead = period - sum(totals[1:]) / (len(totals) - 1)
        print(
            f"   {'':8s} per iteration: {period:5.1f} s, of which overhead {overhead:4.1f} s = {overhead / period:.1%}"
        )
        later = result["steps"][1:]
        return period, {k: sum(s.get(k, 0.0) for s in later) / len(later) for k in later[-1]}
    return None


if __name__ == "__main__":
    main()
