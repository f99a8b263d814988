"""The keeper of one sandboxed run: started by `supervise.run_until_deadline` as

    python -I -S keeper.py FD COMMAND...

where FD is the read end of a pipe whose only write end our process holds. It stands between us
and the sandbox so that nothing of the sandbox outlives the run, or us, whatever kills us:

1. it makes itself a child subreaper, so every process the sandbox leaves orphaned (bwrap's
   namespace init when bwrap dies, a double-forked `setsid()` daemon in the weak mode) is
   re-parented to it, never to the system's init;
2. it starts COMMAND (in a session of its own, as before) with our stdin, stdout, stderr and
   passed fds, and drops its own copy of the stdin pipe;
3. it waits until COMMAND exits, or until FD reads end-of-file: we closed our end (the wall
   clock ran out, or the run is over) or we died, SIGKILL and the OOM killer included (the
   kernel closes a dead process's fds, so there is no moment at which our death goes unseen);
4. it SIGKILLs all its descendants and reaps them until it has no child left;
5. it exits as COMMAND did: its exit status, or the same signal.

Why not bwrap's `--die-with-parent` alone (which stays, as a second line): bwrap asks for
PR_SET_PDEATHSIG only after its clone(), and its child, the namespace's init, only just before
exec; a parent killed during those milliseconds of start-up left bwrap, or the init, running on
with its code (tests/envs/test_hostile.py::test_a_killed_parent_takes_its_sandbox_along, about 1
run in 5). The weak mode had no such signal at all. One keeper per run, not one per process as
`rlanything.procs`'s watchdog: a subreaper adopts only its own descendants' orphans.

Standard library only and no rlanything import: it must start fast under `-I -S`. Our process
must not fork without exec during a run (a forked child would hold the write end open).
"""

import ctypes
import os
import select
import signal
import sys

PR_SET_DUMPABLE = 4  # 0: no core file if it re-raises a core-dumping signal of its command
PR_SET_CHILD_SUBREAPER = 36


def children(pid: int) -> list[int]:
    """The children of `pid`, of all its threads (Linux /proc)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(child) for child in f.read().split()]
        except OSError:
            pass
    return found


def descendants(pid: int) -> list[int]:
    """Children, grandchildren, ... of `pid`, parents before children."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop(0))
        found += kids
        todo += kids
    return found


def kill_all(top: int, status: int | None) -> int:
    """SIGKILL every descendant and reap, until no child is left (orphans re-parented to us in
    between are found on the next round) -> the wait status of `top` (given when already reaped)."""
    me = os.getpid()
    while True:
        for pid in descendants(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            pid, reaped = os.waitpid(-1, 0)
        except ChildProcessError:
            return status
        if pid == top:
            status = reaped


def exit_as(status: int) -> None:
    """Exit with COMMAND's exit status, or die of the signal that killed it."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is not to terminate: never seen from a wait
    os._exit(os.waitstatus_to_exitcode(status))


def given_environment() -> dict[bytes, bytes]:
    """The environment we were started with, for COMMAND: `os.environ` may hold an LC_CTYPE that
    Python added itself (PEP 538's locale coercion, when the environment names no locale)."""
    with open("/proc/self/environ", "rb") as f:
        return dict(item.split(b"=", 1) for item in f.read().split(b"\0") if item)


def main() -> None:
    watch, command = int(sys.argv[1]), sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    for option, value in ((PR_SET_CHILD_SUBREAPER, 1), (PR_SET_DUMPABLE, 0)):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")
    os.set_inheritable(watch, False)
    try:  # SIGPIPE and SIGXFSZ to their defaults, as subprocess does (Python ignores them)
        top = os.posix_spawn(
            command[0], command, given_environment(), setsid=True, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)
        )
    except OSError as err:
        print(f"sandbox keeper: cannot start {command[0]}: {err}", file=sys.stderr)
        os._exit(127)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the writer of the stdin pipe sees it closed once COMMAND is gone
    os.close(null)
    exited = os.pidfd_open(top)
    ready, _, _ = select.select([watch, exited], [], [])
    status = os.waitpid(top, 0)[1] if exited in ready else None
    exit_as(kill_all(top, status))


if __name__ == "__main__":
    main()
