"""The peak memory of this process over a stretch of work, from Linux's own counter.

`/proc/self/status` keeps VmHWM, the most resident memory the process has held; writing "5" to
`/proc/self/clear_refs` sets it back to the present RSS (kernel docs, proc(5)). So a step can
report its own peak: `reset_peak()` before, `peak_gb()` after. Elsewhere (no procfs, or a kernel
that refuses the write) the peak is the process's whole life so far, and `reset_peak` says so by
returning False. Work done in child processes (a `train.launch` update) is not counted.
"""

from __future__ import annotations

import re
from pathlib import Path

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def reset_peak() -> bool:
    """Start a new peak at the present RSS; False where the counter cannot be reset."""
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def peak_gb() -> float:
    """The process's peak resident memory since the last `reset_peak` (or its start), in GB
    (2**30 bytes); NaN without procfs."""
    try:
        match = re.search(r"^VmHWM:\s+(\d+) kB", STATUS.read_text(), re.M)
    except OSError:
        return float("nan")
    return int(match.group(1)) / 2**20 if match else float("nan")
