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
