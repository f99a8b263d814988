"""A step's peak RSS (rlanything/memory.py), measured on this process: a 256 MB buffer raises the
peak by about that much, and a reset brings the peak back to the present RSS."""

from rlanything import memory


def test_the_peak_follows_a_buffer_and_resets():
    assert memory.reset_peak()  # Linux with procfs: the counter can be reset here
    before = memory.peak_gb()
    # written byte by byte: fresh mmap pages become resident (a zero-filled calloc may leave them
    # untouched: the peak rose 0.04 GB instead of 0.25 in one CI run)
    buffer = bytearray(b"\x01") * (256 * 2**20)
    assert memory.peak_gb() - before >= 0.24
    del buffer
    assert memory.peak_gb() - before >= 0.24  # a peak stays after the memory is freed
    assert memory.reset_peak() and memory.peak_gb() - before < 0.1  # until it is reset


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
