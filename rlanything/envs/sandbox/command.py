"""The command line of one sandboxed run: util-linux's `setpriv` (the throw-away uid, no groups,
no_new_privs) and `prlimit` (the rlimits) in front of bubblewrap's argv (the code's whole view of
the machine) or, in the weak mode, of the interpreter itself. Nothing here starts a process:
`supervise` runs what these functions build. The why of each flag is in the package docstring.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from rlanything.environment import SandboxConfig

WORKDIR = "/sandbox"  # the code's working folder inside bubblewrap
BWRAP_PROCESSES = 2  # bwrap outside + bwrap as the namespace's init: counted by RLIMIT_NPROC
KEEPER_PROCESSES = 1  # the run's keeper (supervise.py), ours: counted when we keep our uid


@dataclass(frozen=True)
class Runtime:
    """What runs the code here, as `probe.runtime` found it: the interpreter, bwrap or why not, the uids."""

    python: str  # the interpreter that runs the code (same path inside and outside)
    prefix: str  # its installation prefix, bound read-only (with /usr)
    uid: int | None  # the first of the uids bwrap (or the weak child) runs as (`run_uid`); None: we keep ours
    bwrap: str | None  # bwrap's path when it runs here, else None
    notes: str  # why bwrap cannot run, or ""
    setpriv: str = "setpriv"  # util-linux's setpriv and prlimit
    prlimit: str = "prlimit"


def clean_env(home: str, tmp: str) -> dict[str, str]:
    """The code's whole environment: no inherited tokens or secrets."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": tmp}


def own_process_count() -> int:
    """Processes whose real uid is ours (RLIMIT_NPROC counts all of them)."""
    me, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += os.stat(entry.path).st_uid == me
            except OSError:
                pass
    return count


def wrappers(tools: tuple[str, str], limits: SandboxConfig, cpu_s: int, nproc: int, uid: int | None) -> list[str]:
    """setpriv (the throw-away uid, no groups, no_new_privs) then prlimit (the rlimits): the
    command they prefix runs with those, and so does everything it starts."""
    mem, fsize = limits.memory_mb * 2**20, limits.max_file_mb * 2**20
    drop = ["--reuid", str(uid), "--regid", str(uid), "--clear-groups"] if uid is not None else []
    return [
        tools[0],
        *drop,
        "--no-new-privs",
        tools[1],
        f"--cpu={cpu_s}:{cpu_s + 1}",
        f"--as={mem}",
        f"--fsize={fsize}",
        f"--nproc={nproc}",
        "--nofile=64",
        "--core=0",
        "--",
    ]


def limits_prefix(rt: Runtime, uid: int | None, limits: SandboxConfig, wall_s: float, weak: bool) -> list[str]:
    """The `wrappers` of one run as `uid` (`probe.run_uid`): RLIMIT_NPROC counts the code's
    processes, bwrap's own two, and (when we keep our uid) every process we already run and the
    run's keeper; CPU seconds cover the wall clock."""
    nproc = limits.max_processes + (0 if weak else BWRAP_PROCESSES)
    nproc += 0 if uid is not None else own_process_count() + KEEPER_PROCESSES
    cpu_s = max(1, math.ceil(wall_s)) + 1
    return wrappers((rt.setpriv, rt.prlimit), limits, cpu_s, nproc, uid)


def bwrap_argv(bwrap: str, prefix: str, limits: SandboxConfig, files: dict[str, int]) -> list[str]:
    """bwrap and its options, up to the command it runs: `prefix` (the interpreter's) and /usr
    read-only, three private tmpfs of `limits.disk_mb`, and `files` (name -> readable fd)
    written into the working folder."""
    size = str(limits.disk_mb * 2**20)
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/sbin",
        "/sbin",
    ]
    if prefix != "/usr" and not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        size,
        "--tmpfs",
        "/tmp",
        "--perms",
        "1777",
        "--size",
        size,
        "--tmpfs",
        "/dev/shm",
        "--perms",
        "0700",
        "--size",
        size,
        "--tmpfs",
        WORKDIR,
    ]
    for name, fd in files.items():
        argv += ["--perms", "0644", "--file", str(fd), f"{WORKDIR}/{name}"]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR, "--clearenv"]
    for key, value in clean_env(WORKDIR, "/tmp").items():
        argv += ["--setenv", key, value]
    return argv
