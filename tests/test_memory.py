"""A step's peak RSS (rlanything/memory.py), measured on this process: a 256 MB buffer raises the
peak by about that much, and a reset brings the peak back to the present RSS."""

from rlanything import memory


def test_the_peak_follows_a_buffer_and_resets():
    assert memory.reset_peak()  # Linux with procfs: the counter can be reset here
    before = memory.peak_gb()
    buffer = bytearray(256 * 2**20)  # zero-filled: every page touched
    assert memory.peak_gb() - before >= 0.24
    del buffer
    assert memory.peak_gb() - before >= 0.24  # a peak stays after the memory is freed
    assert memory.reset_peak() and memory.peak_gb() - before < 0.1  # until it is reset
