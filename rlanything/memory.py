"""The peak memory of this process over a stretch of work, from Linux's own counter, and the
budget it must stay under (`run.memory_gb`).

`/proc/self/status` keeps VmHWM, the most resident memory the process has held; writing "5" to
`/proc/self/clear_refs` sets it back to the present RSS (kernel docs, proc(5)). So a step can
report its own peak: `reset_peak()` before, `peak_gb()` after. Elsewhere (no procfs, or a kernel
that refuses the write) the peak is the process's whole life so far, and `reset_peak` says so by
returning False. Work done in child processes (a `train.launch` update) is not counted.

The budget is the process's: a run's steps set it once they have read their config
(`set_budget`), and the code that decides how much to take at once asks how much is left of it
(`headroom_bytes`: the budget less the resident memory now): the engines' rows decoded and scored
together, the update's micro-batches. What cannot fit (one sequence too long for the budget) is a
`MemoryBudgetError` that names the setting, raised before the work, never the kernel's kill.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import re
from collections.abc import Callable
from pathlib import Path

import psutil

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")
SETTING = "run.memory_gb"
_budget: list[float] = [float("inf")]  # bytes; unbounded until a run sets it


class MemoryBudgetError(RuntimeError):
    """Work that cannot fit in the process's memory budget, even one piece at a time."""


def default_gb() -> float:
    """The budget of `run.memory_gb: null`: half the machine's memory, which leaves room for a
    second run beside this one. 24 GiB machine -> 12.0."""
    return psutil.virtual_memory().total / 2**31


def set_budget(gb: float | None) -> float:
    """This process's budget, in GiB (None: `default_gb`) -> in bytes."""
    _budget[0] = (default_gb() if gb is None else gb) * 2**30
    return _budget[0]


def budget_bytes() -> float:
    """The process's budget in bytes; inf where none was set (library use outside a run)."""
    return _budget[0]


def release(collect: bool = False) -> bool:
    """Give the memory this process freed back to the system (glibc's `malloc_trim(0)`): freed
    tensors stay in the allocator's arenas, counted in the resident memory, until then. Measured
    on SmolLM2: after three turns of 32 rollouts and the engine deleted, 3.09 GiB resident, 0.43
    GiB after the trim. False where there is no glibc (nothing to do).

    With `collect` (after a branching engine is deleted) a full garbage collection comes first: a
    caught exception's traceback, in a reference cycle, holds every frame of the call that raised
    it, with their locals, until a full collection, which Python runs rarely in a process with
    torch imported (~0.5 s each). Not at every release: the imports are not frozen
    (`gc.freeze`) to make it cheap, because freezing at a run's start slowed in-process flows
    (the suite's tests/flows/test_learning.py: 70 s without, 111-125 s with)."""
    if collect:
        gc.collect()
    trim = _libc("malloc_trim")
    return bool(trim(0)) if trim is not None else False


M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)
MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"  # the same, read by glibc when a process starts


def map_large_blocks(mb: float | None) -> bool:
    """Serve allocations of `mb` MiB or more from mappings of their own, handed back to the system
    when freed (`run.mmap_threshold_mb`): glibc's mallopt for this process, its environment
    variable for the processes it starts (a launched update). glibc's default raises the threshold
    to the largest block freed so far, up to 32 MiB, so a model's activations come from the heap
    and what a backward frees stays resident. None: nothing changed. False where there is no glibc."""
    if mb is None:
        return False
    threshold = int(mb * 2**20)
    os.environ[MMAP_THRESHOLD_ENV] = str(threshold)
    mallopt = _libc("mallopt")
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) if mallopt is not None else False


@functools.cache
def _libc(name: str):
    """A function of the C library (glibc's malloc_trim, mallopt), or None: no C library found,
    or one without it (musl, macOS)."""
    lib = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(lib), name) if lib else None
    except (OSError, AttributeError):
        return None


def rss_bytes() -> int:
    """The process's resident memory now."""
    return psutil.Process(os.getpid()).memory_info().rss


def headroom_bytes() -> float:
    """What the budget leaves now: the budget less the resident memory once what the process
    freed is given back (`release`); inf without a budget, negative when the process is over it."""
    if _budget[0] == float("inf"):
        return float("inf")
    release()
    return _budget[0] - rss_bytes()


def cut_to_fit(items: list, need: Callable[[list], float], headroom: float, what: Callable) -> list[list]:
    """`items` in order, cut into consecutive parts whose `need(part)` (bytes) fits in
    `headroom`; `over_budget(what(item), ...)` where one item alone does not fit.
    [1, 2, 3], need = sum, headroom 3 -> [[1, 2], [3]]."""
    parts, part = [], []
    for item in items:
        if need([item]) > headroom:
            raise over_budget(what(item), need([item]))
        if part and need([*part, item]) > headroom:
            parts.append(part)
            part = []
        part.append(item)
    return [*parts, part] if part else parts


def over_budget(what: str, need_bytes: float) -> MemoryBudgetError:
    """The one-line error of work that cannot be cut small enough: what, how much, the setting."""
    return MemoryBudgetError(
        f"{what} needs ~{need_bytes / 2**30:.2f} GiB beyond the {rss_bytes() / 2**30:.2f} GiB this process holds, "
        f"more than {SETTING} {_budget[0] / 2**30:.2f} leaves: raise {SETTING} or shorten the sequences"
    )


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
