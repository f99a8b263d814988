"""One process at a time per run: an exclusive `flock` on `<run>/.lock`.

Two resumes of one run at once would both execute the unfinished steps and race on the same
files. Whoever takes the lock proceeds; the other stops at once with `RunBusyError`, naming the
holder. The kernel drops a `flock` when its process dies, even by SIGKILL, so a killed run never
leaves a stale lock behind (Prefect's SERIALIZABLE isolation with a FileSystemLockManager does:
its lock files outlive a killed process and make the next resume wait forever).

The lock is re-entrant within a process: the CLI takes it before starting the training flow
(so a loser exits before any flow run exists), and the flow takes it again for deployments
and Retry, which do not go through the CLI.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_held: dict[Path, list] = {}  # lock path -> [open file, depth], in this process


class RunBusyError(RuntimeError):
    """Another process holds the run's lock."""


def lock_path(run_dir: Path) -> Path:
    return Path(run_dir).resolve() / ".lock"


def holder(run_dir: Path) -> dict | None:
    """Who holds (or last held) the lock: {"pid", "host", "since", "command"}, or None."""
    try:
        return json.loads(lock_path(run_dir).read_text() or "null")
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run's lock for the block, or raise `RunBusyError` at once."""
    path = lock_path(run_dir)
    if path in _held:
        _held[path][1] += 1
        try:
            yield
        finally:
            _held[path][1] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        info = holder(run_dir) or {}
        raise RunBusyError(
            f"run {Path(run_dir).name!r} ({Path(run_dir).resolve()}) is already being trained or resumed by "
            f"another process (pid {info.get('pid', '?')} on {info.get('host', '?')}, since {info.get('since', '?')}: "
            f"{info.get('command', '?')}). Nothing was changed; wait for it to finish, or stop it and "
            f"run `rlanything resume {Path(run_dir).resolve()}`."
        ) from None
    handle.truncate(0)
    handle.write(
        json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": " ".join(sys.argv)[:300],
            }
        )
    )
    handle.flush()
    _held[path] = [handle, 1]
    try:
        yield
    finally:
        del _held[path]
        handle.close()  # releases the flock; the holder info stays for the record
