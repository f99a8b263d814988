"""Child processes that die with their parent, and one way to stop a process or a process group.

Every long-lived child rlanything starts (the temporary Prefect server, vLLM servers, ChromeDriver
and its Chromium, `accelerate launch`) is *guarded*: its pid, or its whole process group, is
registered with this process's watchdog, a tiny Python process started on first use that holds
the read end of a pipe only this process writes to. When this process ends in any way (normal
exit, exception, SIGTERM, SIGKILL, the OOM killer) the kernel closes the write end, the watchdog
reads end-of-file and SIGKILLs everything still registered and every descendant of it (found
through /proc before the first kill, so children that left the group, like torch elastic's
workers under `accelerate launch`, go too), then exits.

Why not `PR_SET_PDEATHSIG` alone: Linux sends that signal when the *thread* that forked the
child ends, not the process, and several children are started from short-lived threads (a
browser launch runs under a timeout thread; Prefect starts its server from whichever thread
first needs a client); it also reaches only the direct child, while ChromeDriver's Chromium,
vLLM's engine processes and accelerate's workers are grandchildren. A process group and its process tree,
killed by a process that outlives us, covers both. The limits: a process that left the group
and whose parent had already died when the watchdog looks is not found, and a child started in
the microseconds before this process died, and not yet registered, is not covered.

`rlanything server start` servers are deliberately not guarded: they are detached and outlive the
CLI until `rlanything server stop`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# The watchdog: reads "+g PGID", "+p PID", "-g PGID", "-p PID" lines until EOF, then kills what
# is registered and every descendant of it. A pid is remembered with its start time so a reused
# pid is never killed. No rlanything import: it must start fast and cannot fail on an import path.
WATCHDOG = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
def stat(pid):
    try:
        text = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2]), fields[19]  # state, ppid, pgid, start time
groups, pids = set(), {}
for line in sys.stdin:
    op, kind, num = line[0], line[1], int(line[2:])
    if kind == "g":
        (groups.add if op == "+" else groups.discard)(num)
    elif op == "+":
        pids[num] = (stat(num) or (0, 0, 0, None))[3]
    else:
        pids.pop(num, None)
for _ in range(3):  # again, for anything forked meanwhile
    table = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := stat(p)) and s[0] not in "ZX"}
    doomed = {p for p, s in table.items() if s[2] in groups}
    doomed |= {p for p, started in pids.items() if started is not None and p in table and table[p][3] == started}
    while True:  # and their descendants, which may have left the group (torch elastic workers do)
        more = {p for p, s in table.items() if s[1] in doomed} - doomed
        if not more:
            break
        doomed |= more
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if not doomed:
        break
"""

_lock = threading.Lock()
_watchdog: subprocess.Popen | None = None


def _forget_watchdog() -> None:
    """In a fork()ed child: the parent's pipe must not keep the parent's watchdog waiting."""
    global _watchdog
    if _watchdog is not None and _watchdog.stdin is not None:
        try:
            _watchdog.stdin.close()  # the file object, not its fd: no double close later
        except OSError:
            pass
    _watchdog = None


os.register_at_fork(after_in_child=_forget_watchdog)


def _tell(line: str) -> None:
    global _watchdog
    with _lock:
        if _watchdog is None or _watchdog.poll() is not None:
            _watchdog = subprocess.Popen(
                [sys.executable, "-S", "-c", WATCHDOG],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C and group kills do not reach it
            )
        try:
            os.write(_watchdog.stdin.fileno(), f"{line}\n".encode())  # < PIPE_BUF: one atomic write
        except OSError:  # it died under us: a fresh one next time
            _watchdog = None


def guard(pid: int, *, group: bool) -> None:
    """Kill `pid` (its whole process group when `group`) when this process ends, however it ends."""
    _tell(f"+{'g' if group else 'p'}{pid}")


def release(pid: int, *, group: bool) -> None:
    """Undo `guard` (the process was stopped, or is meant to outlive us)."""
    if _watchdog is not None:
        _tell(f"-{'g' if group else 'p'}{pid}")


def spawn(command: list[str], **popen_kw) -> subprocess.Popen:
    """subprocess.Popen in a new process group that dies with this process (see the module
    docstring). Stop it with `stop_popen`."""
    proc = subprocess.Popen(command, start_new_session=True, **popen_kw)
    guard(proc.pid, group=True)
    return proc


# ---------------------------------------------------------------- looking and stopping


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, parent pid, process group) of a process, None if gone (Linux /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting to be reaped counts as ended)."""
    if Path("/proc").is_dir():
        stat = _proc_stat(pid)
        return stat is not None and stat[0] not in "ZX"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _live_stats() -> dict[int, tuple[str, int, int]]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) and stat[0] not in "ZX":
            out[int(entry.name)] = stat
    return out


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    if not Path("/proc").is_dir():
        return [pgid] if alive(pgid) else []
    return [pid for pid, stat in _live_stats().items() if stat[2] == pgid]


def descendants(pid: int) -> list[int]:
    """Live children, grandchildren, ... of `pid` (Linux /proc), parents before children."""
    children: dict[int, list[int]] = {}
    for child, stat in _live_stats().items():
        children.setdefault(stat[1], []).append(child)
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


def stop(pid: int, *, group: bool, grace: float = 10.0, signum: int = signal.SIGTERM) -> bool:
    """Send `signum` to `pid` (its process group when `group`), wait up to `grace` seconds for
    it to end, then SIGKILL what is left and wait for that too. -> True if something was running."""
    send = (lambda s: os.killpg(pid, s)) if group else (lambda s: os.kill(pid, s))
    remaining = (lambda: group_members(pid)) if group else (lambda: [pid] if alive(pid) else [])
    try:
        if not remaining():  # (zombies still take signals)
            raise ProcessLookupError
        send(signum)
    except (ProcessLookupError, PermissionError):
        release(pid, group=group)
        return False
    deadline = time.monotonic() + grace
    while remaining() and time.monotonic() < deadline:
        time.sleep(0.1)
    if remaining():
        try:
            send(signal.SIGKILL)
        except ProcessLookupError:
            pass
        while remaining() and time.monotonic() < deadline + 10:
            time.sleep(0.05)
    release(pid, group=group)
    return True


def stop_popen(proc: subprocess.Popen, grace: float = 10.0, signum: int = signal.SIGTERM) -> None:
    """`stop` the process group a `spawn`ed process leads, and reap the leader."""
    if proc.poll() is None:
        stop(proc.pid, group=True, grace=grace, signum=signum)
    else:  # the leader is gone; members may remain
        stop(proc.pid, group=True, grace=0, signum=signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
