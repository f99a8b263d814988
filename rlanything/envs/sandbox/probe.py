"""What this machine allows, probed once per process: whether bubblewrap runs here, which
interpreter the sandbox user can reach, and which isolation a configuration accepts.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from rlanything.environment import SandboxConfig
from rlanything.envs.sandbox.command import Runtime, bwrap_argv, own_process_count, wrappers

log = logging.getLogger(__name__)

SANDBOX_UID_BASE = 200_000
UID_SLOTS = 64  # throw-away uids per process, one per run in turn (`run_uid`)


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot run here and the configuration does not allow the weak mode."""


def _world_reachable(path: str) -> bool:
    """Can a stranger (neither owner nor group) read and run `path`? Each parent needs o+x."""
    real = Path(os.path.realpath(path))
    try:
        if real.stat().st_mode & 0o005 != 0o005:
            return False
        return all(parent.stat().st_mode & 0o001 for parent in real.parents)
    except OSError:
        return False


def _python_candidates() -> list[tuple[str, str]]:
    """(interpreter, prefix) pairs: ours first, then the system's python3."""
    seen, out = set(), []
    for path in (getattr(sys, "_base_executable", ""), sys.executable, "/usr/bin/python3"):
        real = os.path.realpath(path) if path else ""
        if real and real not in seen and os.path.isfile(real):
            seen.add(real)
            prefix = (
                os.path.realpath(sys.base_prefix)
                if real.startswith(os.path.realpath(sys.base_prefix) + "/")
                else str(Path(real).parent.parent)
            )
            out.append((real, prefix))
    return out


@functools.cache
def sandbox_uid() -> int | None:
    """The first of this process's UID_SLOTS throw-away uids when we are root, else None (we
    keep ours)."""
    return SANDBOX_UID_BASE + os.getpid() % 10_000 * UID_SLOTS if os.geteuid() == 0 else None


_next_slot = itertools.count()
_slot_lock = threading.Lock()


def run_uid(first: int | None) -> int | None:
    """The throw-away uid of one run, the next of this process's UID_SLOTS from `first`
    (`Runtime.uid`), or None where we keep ours. RLIMIT_NPROC counts a uid's processes, so runs
    at the same time must not share one: a fork bomb filling its limit would leave a run beside
    it unable to start (measured: a correct test failed beside a hostile one)."""
    if first is None:
        return None
    with _slot_lock:
        return first + next(_next_slot) % UID_SLOTS


def _probe_bwrap(bwrap: str, python: str, prefix: str, uid: int | None, tools: tuple[str, str]) -> str:
    """'' if bwrap runs `python` here as `uid`, else why not."""
    nproc = 64 + (0 if uid is not None else own_process_count())
    cmd = [
        *wrappers(tools, SandboxConfig(), 30, nproc, uid),
        *bwrap_argv(bwrap, prefix, SandboxConfig(), {}),
        python,
        "-I",
        "-S",
        "-c",
        "pass",
    ]
    try:
        done = subprocess.run(
            cmd, env={}, cwd="/", capture_output=True, timeout=30, stdin=subprocess.DEVNULL, check=False
        )
    except (OSError, subprocess.SubprocessError) as err:
        return f"{type(err).__name__}: {err}"
    return "" if done.returncode == 0 else done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"


@functools.cache
def runtime() -> Runtime:
    """Probe once whether bubblewrap runs here, and which interpreter the sandbox user can run."""
    uid = sandbox_uid()
    pythons = [(p, pre) for p, pre in _python_candidates() if uid is None or _world_reachable(p)]
    if not pythons:
        raise SandboxUnavailable(
            "no Python interpreter the sandbox user can run: ours lies in a folder other users cannot "
            "enter; install a system python3 (apt-get install python3)"
        )
    tools = (shutil.which("setpriv"), shutil.which("prlimit"))
    if None in tools:
        raise SandboxUnavailable("util-linux's setpriv and prlimit are needed (apt-get install util-linux)")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        why = "bwrap is not installed (apt-get install bubblewrap, or make system-deps)"
        return Runtime(*pythons[0], uid, None, why, *tools)
    why = ""
    for python, prefix in pythons:
        why = _probe_bwrap(bwrap, python, prefix, uid, tools)
        if not why:
            return Runtime(python, prefix, uid, bwrap, "", *tools)
    return Runtime(*pythons[0], uid, None, f"bwrap cannot run here: {why}", *tools)


def checked_runtime(limits: SandboxConfig) -> Runtime:
    """The runtime `limits.isolation` accepts here; SandboxUnavailable if none (weak mode: a warning)."""
    if limits.isolation not in ("bubblewrap", "weak"):
        raise ValueError(f"sandbox isolation must be bubblewrap or weak, got {limits.isolation!r}")
    rt = runtime()
    if rt.bwrap is None:
        if limits.isolation != "weak":
            raise SandboxUnavailable(
                f"refusing to run untrusted code: {rt.notes}. Install bubblewrap, or set "
                "env.options.sandbox.isolation: weak to accept a sandbox without a private file system "
                "view and without network isolation"
            )
        _warn_weak(rt.notes)
    return rt


@functools.cache
def _warn_weak(notes: str) -> None:
    log.warning(
        "sandbox: WEAK isolation (%s): generated code can read world-readable files, write to "
        "world-writable folders and use the network",
        notes,
    )
