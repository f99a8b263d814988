"""The decoding-step benchmark runs as shipped (a shrunk shape, so it takes seconds): it loads the
shipped model, times both cache layouts and prints numbers that parse. Its timings are not
checked here (speed is measured by running it, see docs/benchmarks.md), only that it still runs
against the engine's current code and prints what the docs quote."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_decode_step_benchmark_prints_both_layouts_against_the_limit():
    command = [sys.executable, "benchmarks/decode_step.py", "--rows", "4", "--steps", "2"]
    command += ["--shapes", "9:6,12:8", "--no-ct2"]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    limit = re.search(r"limit ([\d.]+) ms", out.stdout)
    assert limit and float(limit.group(1)) > 0, out.stdout
    assert re.search(
        r"Linear layers alone at 4 rows: [\d.]+ ms \(\d+%\); reading the weights once: [\d.]+ ms",
        out.stdout,
    )
    lines = re.findall(r"shared +(\d+) own +(\d+) \| in rows +([\d.]+) ms .* held once +([\d.]+) ms", out.stdout)
    assert [(s, o) for s, o, _, _ in lines] == [("9", "6"), ("12", "8")], out.stdout
    assert all(float(rows) > 0 and float(once) > 0 for _, _, rows, once in lines)
    assert "ct2" not in out.stdout.split("limit")[1]  # --no-ct2: no CTranslate2 column
