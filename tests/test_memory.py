"""A step's peak RSS (rlanything/memory.py), measured on this process: a 256 MB buffer raises the
peak by about that much, and a reset brings the peak back to the present RSS."""

import subprocess
import sys

from rlanything import memory

PEAK = """
from rlanything import memory
assert memory.reset_peak()  # Linux with procfs: the counter can be reset here
before = memory.peak_gb()
buffer = bytearray(b"\\x01") * (256 * 2**20)  # written, so its pages are resident
assert memory.peak_gb() - before >= 0.24, (before, memory.peak_gb())
del buffer
assert memory.peak_gb() - before >= 0.24  # a peak stays after the memory is freed
assert memory.reset_peak() and memory.peak_gb() - before < 0.1  # until it is reset
"""


def test_the_peak_follows_a_buffer_and_resets():
    """In a fresh interpreter: in the suite's own process (2.6 GB resident, much of it mapped
    files) the peak rose only 0.04 GB for the same written buffer in two CI runs, as if the kernel
    took back mapped file pages while the buffer grew; a 50 MB interpreter has little to take."""
    done = subprocess.run([sys.executable, "-c", PEAK], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_release_gives_back_what_the_process_freed():
    """Half a GiB in 64 KiB pieces (the C allocator's heap, not mmap), all freed but the last (the
    heap's top stays in use, so the allocator keeps the rest): still resident until `release`."""
    pieces = [bytearray(b"x" * 65536) for _ in range(8192)]
    last = pieces.pop()
    held = memory.rss_bytes()
    del pieces
    assert held - memory.rss_bytes() < 2**28  # freed, but mostly still resident
    assert memory.release()
    assert held - memory.rss_bytes() > 2**28  # given back
    del last


CYCLES = """
import gc, weakref
import torch
from rlanything import memory
gc.disable()  # only the release below may collect

def work():
    weight = torch.zeros(2**20)
    try:
        raise RuntimeError("a caught error")
    except RuntimeError as err:
        kept = err  # a cycle: this frame -> kept -> its traceback -> this frame
    return weakref.ref(weight)

ref = work()
assert ref() is not None  # garbage, held by the cycle
memory.release()
assert ref() is not None  # the engines' releases only trim
memory.release(collect=True)
assert ref() is None, "release left the cycle's frame alive"
"""


def test_release_with_collect_frees_what_a_caught_errors_frames_held():
    """A caught error kept in a variable is a cycle through the frame that raised it, so its
    locals (here a tensor; in a rollout the engine) outlive it until a full collection, which
    `release(collect=True)` runs."""
    done = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


MAPPED = """
import os, sys
from rlanything import memory
if sys.argv[1] == "on":
    assert memory.map_large_blocks(1 / 32)  # 32 KiB
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == "32768"  # for the processes this one starts
pieces = [bytearray(b"x" * 65536) for _ in range(8192)]
last = pieces.pop()
held = memory.rss_bytes()
del pieces
print(held - memory.rss_bytes())
"""


def test_large_blocks_mapped_apart_leave_when_freed_without_a_release():
    """The case above in a fresh interpreter, with and without `map_large_blocks`
    (`run.mmap_threshold_mb`) under the pieces' size: with it each 64 KiB piece has a mapping of
    its own and freeing it gives it back; without it the heap keeps it."""
    freed = {}
    for mode in ("off", "on"):
        done = subprocess.run([sys.executable, "-c", MAPPED, mode], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        freed[mode] = int(done.stdout.split()[-1])
    assert freed["off"] < 2**28 < freed["on"], freed
    assert not memory.map_large_blocks(None)  # None: glibc's default kept
