"""One program in the sandbox: its files in, its command built, run under its keeper, its
outputs read back, its private folder removed (and those of killed processes swept).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rlanything import procs
from rlanything.environment import SandboxConfig
from rlanything.envs.sandbox.command import bwrap_argv, clean_env, limits_prefix
from rlanything.envs.sandbox.probe import checked_runtime, run_uid
from rlanything.envs.sandbox.supervise import run_until_deadline

PRIVATE_PREFIX = "rlanything-sandbox-"  # + pid + "-": a run's private folder in the system temp folder


@dataclass(frozen=True)
class ProgramResult:
    returncode: int | None  # None: killed at the wall-clock deadline
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    uid: int  # the uid the sandbox ran as, seen from outside
    isolation: str  # "bubblewrap" or "weak"


def run_program(
    code: str,
    stdin: str = "",
    limits: SandboxConfig = SandboxConfig(),
    *,
    wall_s: float | None = None,
    files: dict[str, str] | None = None,
    argv: list[str] | None = None,
) -> ProgramResult:
    """Run Python `code` as a script in the sandbox, feeding `stdin`.

    wall_s: wall-clock deadline (default limits.timeout_s); files: extra files written into the
    work dir first; argv: run these arguments instead of the script (after `python -I -S`).
    Raises SandboxUnavailable where bwrap cannot run unless `limits.isolation` is `weak`.

    >>> run_program("print(int(input()) * 2)", "21\\n").stdout
    '42\\n'
    """
    rt = checked_runtime(limits)
    uid = run_uid(rt.uid)  # its own: RLIMIT_NPROC is per uid
    weak = rt.bwrap is None
    wall_s = limits.timeout_s if wall_s is None else wall_s
    sweep_orphans()
    private = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-"))  # 0700, ours: the outputs live here
    fds: dict[str, int] = {}
    try:
        contents = {"main.py": code, **(files or {})}
        if weak:
            prefix, cwd, env = _weak_workdir(private, contents, uid)
        else:
            fds = {name: _memfile(text) for name, text in contents.items()}
            prefix, cwd, env = bwrap_argv(rt.bwrap, rt.prefix, limits, fds), "/", {}
        out_path, err_path = private / ".stdout", private / ".stderr"
        cmd = [*limits_prefix(rt, uid, limits, wall_s, weak), *prefix, rt.python, "-I", "-S", *(argv or ["main.py"])]
        start = time.monotonic()
        returncode, timed_out = run_until_deadline(
            cmd, stdin, cwd=cwd, env=env, fds=fds, wall_s=wall_s, outputs=(out_path, err_path)
        )
        return ProgramResult(
            returncode=None if timed_out else returncode,
            stdout=_read(out_path),
            stderr=_read(err_path),
            timed_out=timed_out,
            wall_s=time.monotonic() - start,
            uid=uid if uid is not None else os.getuid(),
            isolation="weak" if weak else "bubblewrap",
        )
    finally:
        for fd in fds.values():
            os.close(fd)
        shutil.rmtree(private, ignore_errors=True)


def _weak_workdir(private: Path, contents: dict[str, str], uid: int | None) -> tuple[list[str], str, dict[str, str]]:
    """The weak mode's working folder, `private`/work holding `contents` (file name -> text);
    as root, it and its files belong to the throw-away `uid`, which may pass through `private`
    (o+x) but not list it. -> (command prefix: none, cwd, environment)."""
    workdir = private / "work"
    workdir.mkdir()
    for name, text in contents.items():
        (workdir / name).write_text(text)
    if uid is not None:
        private.chmod(0o711)
        for path in (workdir, *workdir.iterdir()):
            os.chown(path, uid, uid)
    return [], str(workdir), clean_env(str(workdir), str(workdir))


def _read(path: Path, limit: int = 1 << 20) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _memfile(text: str) -> int:
    """A readable fd holding `text` (no path anyone could open)."""
    fd = os.memfd_create("sandbox-file", 0)
    os.write(fd, text.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def sweep_orphans(tmp: str | Path | None = None) -> list[Path]:
    """Remove the private folders of `run_program` calls whose process is gone: a process killed
    during a run (SIGKILL, the OOM killer) never reached its cleanup. A folder's name carries its
    process id; only our own user's folders are touched. -> what was removed."""
    removed = []
    for path in Path(tmp or tempfile.gettempdir()).glob(f"{PRIVATE_PREFIX}*-*"):
        owner = path.name.removeprefix(PRIVATE_PREFIX).split("-", 1)[0]
        try:
            mine = path.lstat().st_uid == os.getuid()
        except OSError:  # removed meanwhile
            continue
        if owner.isdigit() and mine and not procs.alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
