"""What the flow process holds between its steps: `rlanything train ARGS` run in this process,
with a line of JSON at each step's start (after the step's `memory.release`) and end:

- `rss`: the process's resident memory (GiB);
- `heap_in_use`, `heap_free`: the C heap's bytes in use and free (glibc's `mallinfo2`), GiB;
- `tensors`: the bytes of live torch tensors' storages, each storage once (GiB);
- `modules`: the live `torch.nn.Module`s (SmolLM2-135M is 406 of them).

Summary.json's `memory/<step>_start_rss_gb` has the first of these for every run; this says what
the memory is. Counting live objects walks the garbage collector's lists (about a second per
snapshot), so the run is slower than usual. Example (docs/benchmarks.md, "What the flow process
held between steps"):

    OMP_NUM_THREADS=1 python -m benchmarks.flow_memory /tmp/flow.jsonl train \\
        -c configs/smollm2-textworld-quest2.yaml --set policy.model=builtin:smollm2-135m-instruct \\
        --set run.iterations=1 --set eval.every=0
"""

from __future__ import annotations

import ctypes
import gc
import json
import sys
from pathlib import Path

import torch

from rlanything import memory

GIB = 2**30


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def live_tensors_and_modules() -> tuple[int, int]:
    """(bytes of live tensor storages, each once; live nn.Modules), from the collector's lists."""
    seen, nbytes, modules = set(), 0, 0
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and not obj.is_meta:
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                nbytes += storage.nbytes()
        elif isinstance(obj, torch.nn.Module):
            modules += 1
    return nbytes, modules


def snapshot(out, tag: str) -> None:
    step = sys._getframe(2).f_locals.get("name", "?")  # the step_task wrapper's step name
    heap = mallinfo2()
    tensors, modules = live_tensors_and_modules()
    line = {"tag": tag, "step": step, "rss": memory.rss_bytes() / GIB, "tensors": tensors / GIB, "modules": modules}
    if heap is not None:
        line |= {"heap_in_use": heap.uordblks / GIB, "heap_free": heap.fordblks / GIB}
    out.write(json.dumps(line) + "\n")
    out.flush()


def mallinfo2():
    fn = memory._libc("mallinfo2")
    if fn is None:
        return None
    fn.restype = MallInfo2
    return fn()


def from_step_wrapper() -> bool:
    """True where the caller's caller is the step wrapper (tasks/common.py), not a step's own release."""
    return sys._getframe(2).f_code.co_filename.endswith(str(Path("tasks", "common.py")))


def main() -> None:
    out = open(sys.argv[1], "a")  # noqa: SIM115 (open for the whole run)
    release, peak_gb = memory.release, memory.peak_gb

    def release_and_note(collect: bool = False) -> bool:
        done = release(collect)
        if from_step_wrapper():
            snapshot(out, "start")
        return done

    def note_and_peak() -> float:
        if from_step_wrapper():
            snapshot(out, "end")
        return peak_gb()

    memory.release, memory.peak_gb = release_and_note, note_and_peak
    from rlanything.cli import app

    sys.argv = ["rlanything", *sys.argv[2:]]
    app()


if __name__ == "__main__":
    main()
