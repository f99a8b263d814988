"""Hostile generated code, run through the real sandbox the two ways the coding environment runs
code: as a solution program (stdio) and as a generated assert-style test against a solution.

Each case sets `escaped = True` only if its attack worked in a way it can see from inside; the
host side checks the rest. For every case and both ways we assert: it returns in time; it is
recorded as a failure (the stdio run does not print ESCAPED, the statement test fails); nothing
with the case's marker appears in the host's /tmp, /dev/shm, home folder, checkout, a fake
world-writable run folder or the suite's folders (which are compared before/after); no process
with the marker in its command line (or of the sandbox's throw-away uid) is left; no host
secret (a world-readable mlflow.db of "another run", our environment, the checkout) shows up
in its output; a sentinel process of ours and pytest itself stay alive.
"""

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlanything.environment import SandboxConfig
from rlanything.envs.sandbox import PRIVATE_PREFIX, run_program, run_tests, runtime, sweep_orphans
from rlanything.envs.sandbox.probe import UID_SLOTS

LIMITS = SandboxConfig(timeout_s=1.0, memory_mb=256, max_file_mb=1, max_processes=8, disk_mb=4)
CHECKOUT = Path(__file__).resolve().parents[2]
HOME = Path(os.path.expanduser("~"))
SECRET = "RLA-SECRET-" + secrets.token_hex(8)  # in the fake mlflow.db and in our environment

# Placeholders replaced per case: MARK (unique per run), DBPATH, RUNDIR, HOSTHOME, CHECKOUT,
# PORT (a port we listen on), OURPID (pytest's pid), SENTINEL (a process of ours).
CASES = {
    # --- writing outside the working folder ---------------------------------------------------
    "write_tmp": "write('/tmp/MARK', 'x')\nos.makedirs('/tmp/MARK-dir/a')\nescaped = False",
    "write_dev_shm": "write('/dev/shm/MARK', 'x')\nescaped = False",
    "write_cwd_parent": "write('../MARK', 'x')\nescaped = True",
    "write_home": "write(os.path.expanduser('~/MARK'), 'x')\nwrite('HOSTHOME/MARK', 'x')\nescaped = True",
    "write_run_folder": "write('RUNDIR/MARK', 'x')\nescaped = True",
    "write_checkout": "write('CHECKOUT/MARK', 'x')\nescaped = True",
    "write_usr": "write('/usr/lib/MARK', 'x')\nescaped = True",
    "write_root_and_dev": "escaped = False\nfor p in ('/MARK', '/dev/MARK', '/proc/MARK', '/bin/MARK'):\n"
    "    try:\n        write(p, 'x')\n        escaped = True\n"
    "    except OSError:\n        pass",
    "fill_tmp_small_files": "n = 0\ntry:\n    for n in range(3000):\n        with open(f'/tmp/MARK-{n}', 'wb') as f:\n            f.write(b'x' * 4096)\n"
    "except OSError:\n    pass\nescaped = n >= 2999",
    "fill_cwd_and_shm": "n = 0\ntry:\n    for n in range(3000):\n        with open(f'MARK-{n}', 'wb') as f:\n            f.write(b'x' * 4096)\n"
    "        with open(f'/dev/shm/MARK-{n}', 'wb') as f:\n            f.write(b'x' * 4096)\nexcept OSError:\n    pass\n"
    "escaped = n >= 2999",
    "huge_file": "f = open('/tmp/MARK-big', 'wb')\nfor _ in range(8):\n    f.write(b'x' * 2**20)\n    f.flush()\n"
    "escaped = True",
    "symlink_in_tmp": "os.symlink('/etc/shadow', '/tmp/MARK-link')\nos.symlink('/root', '/tmp/MARK-root')\n"
    "escaped = os.path.exists('/tmp/MARK-link') or os.path.exists('/tmp/MARK-root/.bashrc')",
    "dotdot_paths": "escaped = False\nfor p in ('../../../../tmp/MARK', '/sandbox/../../tmp/MARK-b', '../../../../dev/shm/MARK'):\n"
    "    try:\n        write(p, 'x')\n    except OSError:\n        pass\n"
    "for p in ('../../../../etc/passwd', '../' * 8 + 'RUNDIR/../MARK'):\n"
    "    escaped |= os.path.exists(p)",
    "leave_state_for_later": "names = ('/tmp/rla-note', '/dev/shm/rla-note', 'rla-note', os.path.expanduser('~/rla-note'))\n"
    "escaped = any(os.path.exists(p) for p in names)\nfor p in names:\n"
    "    write(p, 'answer: 42')",
    "chmod_chown": "escaped = False\nfor act in (lambda: os.chown('main.py', 0, 0), lambda: os.chmod('/usr/bin/python3', 0o4777),\n"
    "            lambda: os.chmod('/', 0o777), lambda: os.chown('/tmp', 0, 0),\n"
    "            lambda: os.chmod('/proc/self/exe', 0o4777)):\n"
    "    try:\n        act()\n        escaped = True\n    except OSError:\n        pass",
    "write_proc": "escaped = False\nfor path, value in (('/proc/self/oom_score_adj', '-1000'), ('/proc/sysrq-trigger', 'b'),\n"
    "                    ('/proc/sys/kernel/hostname', 'MARK'), ('/proc/sys/vm/drop_caches', '3')):\n"
    "    try:\n        write(path, value)\n        escaped = True\n    except OSError:\n        pass",
    # --- reading what is not ours -------------------------------------------------------------
    "read_other_runs_mlflow_db": "try:\n    data = open('DBPATH', 'rb').read()\nexcept OSError:\n    data = b''\n"
    "import glob\nfound = glob.glob('/tmp/**/mlflow.db', recursive=True)\n"
    "escaped = b'RLA-SECRET' in data or bool(found)\nprint(data[:200], found)",
    "read_host_proc_cmdline": "seen = []\nfor pid in os.listdir('/proc'):\n    if pid.isdigit():\n        try:\n"
    "            seen.append(open(f'/proc/{pid}/cmdline', 'rb').read())\n        except OSError:\n"
    "            pass\nescaped = any(b'pytest' in c or b'rla-hostile-sentinel' in c for c in seen) or len(seen) > 3\n"
    "print(len(seen))",
    "read_our_environ": "try:\n    env = open('/proc/OURPID/environ', 'rb').read()\nexcept OSError:\n    env = b''\n"
    "escaped = b'RLA-SECRET' in env or 'RLA_HOSTILE_SECRET' in os.environ",
    "read_etc_shadow_passwd": "escaped = False\nfor p in ('/etc/shadow', '/etc/passwd', '/etc/hostname'):\n    try:\n"
    "        print(open(p).read()[:100])\n        escaped = True\n    except OSError:\n        pass",
    "read_checkout": "try:\n    text = open('CHECKOUT/pyproject.toml').read()\nexcept OSError:\n    text = ''\n"
    "escaped = 'rlanything' in text or os.path.exists('CHECKOUT')",
    "read_home": "escaped = any(os.path.exists(os.path.join('HOSTHOME', n)) for n in HOME_NAMES)",
    "ptrace_host_process": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "escaped = libc.ptrace(16, OURPID, 0, 0) == 0 or libc.ptrace(16, SENTINEL, 0, 0) == 0",
    # --- namespaces, privileges, system calls --------------------------------------------------
    "unshare_user_command": "import subprocess\ndone = subprocess.run(['unshare', '-U', 'true'], capture_output=True)\n"
    "escaped = done.returncode == 0",
    "unshare_ctypes": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "escaped = any(libc.unshare(flag) == 0 for flag in (0x10000000, 0x00020000, 0x40000000))\n"
    "escaped |= hasattr(os, 'unshare') and os.unshare(os.CLONE_NEWUSER) is None",
    "setrlimit_raise": "import resource\nescaped = False\n"
    "for r in (resource.RLIMIT_NPROC, resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE):\n"
    "    soft, hard = resource.getrlimit(r)\n    try:\n"
    "        resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
    "        escaped = True\n    except (ValueError, OSError):\n        pass",
    "ctypes_syscalls": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "calls = [libc.syscall(165, b'none', b'/tmp', b'tmpfs', 0, None), libc.setuid(0), libc.chroot(b'/tmp'),\n"
    "         libc.syscall(169, 0xfee1dead, 672274793, 0x4321fedc, None), libc.sethostname(b'x', 1)]\n"
    "escaped = any(c == 0 for c in calls)",
    "mount_and_su": "import subprocess\nruns = [subprocess.run(c, capture_output=True) for c in\n"
    "        (['mount', '-t', 'tmpfs', 'x', '/tmp'], ['su', '-c', 'true'], ['chroot', '/', 'true'])]\n"
    "escaped = any(r.returncode == 0 for r in runs)",
    "execve_shell": "os.execv('/bin/sh', ['sh', '-c', 'echo x > /tmp/MARK; echo x > HOSTHOME/MARK; cat /etc/shadow; "
    "exec sleep 30'])",
    "network_localhost": "import socket\ntry:\n    socket.create_connection(('127.0.0.1', PORT), timeout=0.5)\n"
    "    escaped = True\nexcept OSError:\n    escaped = False",
    "network_external_and_dns": "import socket\nescaped = False\nfor act in (lambda: socket.getaddrinfo('pypi.org', 443),\n"
    "            lambda: socket.create_connection(('1.1.1.1', 53), timeout=0.5)):\n"
    "    try:\n        act()\n        escaped = True\n    except OSError:\n        pass",
    # --- processes, time, memory, output ------------------------------------------------------
    "fork_bomb": "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "thread_bomb": "import threading, time\nn = 0\ntry:\n    for n in range(10000):\n"
    "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\nexcept RuntimeError:\n"
    "    pass\nescaped = n > 100",
    "memory_bomb": "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))",
    "infinite_loop": "while True:\n    pass",
    "sleep_past_timeout": "import time\ntime.sleep(30)\nescaped = True",
    "ignores_sigterm": "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nif os.fork() == 0:\n"
    "    os.execv(sys.executable, [sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)', 'MARK'])\ntime.sleep(30)",
    "daemonize_double_fork": "import time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
    "        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', 'MARK'])\n"
    "    os._exit(0)\ntime.sleep(0.2)\nescaped = False",
    "kill_parent": "import signal\nfor pid in (OURPID, SENTINEL, os.getppid()):\n    try:\n"
    "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\nescaped = False",
    "kill_everything": "import subprocess\nsubprocess.run(['kill', '-9', '-1'])\nos.kill(-1, 9)\nescaped = False",
    "close_stdout": "os.close(1)\nos.close(2)\nescaped = False",
    "huge_output": "while True:\n    print('x' * 10000)",
    "read_stdin_forever": "import time\nwhile True:\n    sys.stdin.read()\n    time.sleep(0.01)",
}
PROLOGUE = """import os, sys
HOME_NAMES = HOMENAMES

def write(path, text):  # unbuffered: an error cannot hide in a file object's silent close
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
"""


@pytest.fixture(scope="module")
def host():
    """What the hostile code aims at: a fake other run's world-readable mlflow.db, a world-writable
    run folder, a port we listen on, a sentinel process of ours."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="rla-hostile-host-"))
    base.chmod(0o755)
    other_run, run_dir = base / "other-run", base / "run"
    other_run.mkdir(mode=0o755)
    run_dir.mkdir()
    run_dir.chmod(0o777)
    db = other_run / "mlflow.db"
    db.write_text(f"SQLite format 3 {SECRET} metrics params")
    db.chmod(0o644)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "rla-hostile-sentinel"])
    os.environ["RLA_HOSTILE_SECRET"] = SECRET
    yield {"base": base, "db": db, "run_dir": run_dir, "listener": listener, "sentinel": sentinel}
    del os.environ["RLA_HOSTILE_SECRET"]
    sentinel.kill()
    sentinel.wait()
    listener.close()
    subprocess.run(["rm", "-rf", str(base)], check=True)


def program(case: str, mark: str, host: dict) -> str:
    home_names = sorted(n for n in os.listdir(HOME) if n != ".pyenv")[:20]  # .pyenv: the interpreter may be bound
    source = PROLOGUE + CASES[case]
    for key, value in (
        ("MARK", mark),
        ("DBPATH", str(host["db"])),
        ("RUNDIR", str(host["run_dir"])),
        ("HOSTHOME", str(HOME)),
        ("CHECKOUT", str(CHECKOUT)),
        ("HOMENAMES", repr(home_names)),
        ("PORT", str(host["listener"].getsockname()[1])),
        ("OURPID", str(os.getpid())),
        ("SENTINEL", str(host["sentinel"].pid)),
    ):
        source = source.replace(key, value)
    return source


def marked_processes(mark: str) -> list[str]:
    first = runtime().uid  # every run takes one of the process's UID_SLOTS uids from here
    uids = range(first, first + UID_SLOTS) if first is not None else range(0)
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            owner = os.stat(entry.path).st_uid
        except OSError:
            continue
        if mark.encode() in cmdline or owner in uids:
            found.append(f"{entry.name} uid={owner} {cmdline[:120]!r}")
    return found


def traces(mark: str, roots: list[Path]) -> list[str]:
    """Paths under `roots` (the top level of the shared ones) whose name holds the marker."""
    found = []
    for root in roots:
        try:
            found += [str(root / n) for n in os.listdir(root) if mark in n]
        except OSError:
            pass
    return found


def accepted(listener: socket.socket) -> int:
    """Connections waiting on our port (accepted and closed, so that one case cannot spoil the next)."""
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mode) for p in root.rglob("*")}


@pytest.mark.parametrize("way", ["solution", "statement_test"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_code_is_contained(case, way, host):
    mark = f"rla-hostile-{case}-{secrets.token_hex(4)}"
    source = program(case, mark, host)
    before = tree(host["base"])
    start = time.monotonic()
    if way == "solution":  # as a stdio solution; the marker rides on argv into every process it forks
        result = run_program(source + "\nif escaped:\n    print('ESCAPED')", "", LIMITS, argv=["main.py", mark])
        elapsed, bound = time.monotonic() - start, LIMITS.timeout_s + 4.0
        output = result.stdout + result.stderr
        assert not (result.returncode == 0 and "ESCAPED" in result.stdout), output[-2000:]
        assert len(result.stdout) <= 2**20
    else:  # as a generated assert-style test run against a correct solution
        passed = run_tests("def solution(x):\n    return x", [{"code": source + "\nassert escaped"}], limits=LIMITS)
        elapsed, bound = time.monotonic() - start, LIMITS.timeout_s * 3 + 1.0 + 4.0
        output = ""
        assert passed == [False]
    assert elapsed < bound, f"took {elapsed:.1f} s"
    assert SECRET not in output and 'name = "rlanything"' not in output and "root:" not in output
    roots = [Path("/tmp"), Path("/dev/shm"), HOME, CHECKOUT, Path("/usr/lib"), Path("/"), host["run_dir"]]
    deadline = time.monotonic() + 3.0
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marked_processes(mark) == []
    found = traces(mark, roots)
    notes = [p for p in (Path("/tmp/rla-note"), Path("/dev/shm/rla-note")) if p.exists()]
    for path in found + notes:  # an escape must not spoil the cases after it
        subprocess.run(["rm", "-rf", str(path)], check=False)
    assert found == [] and notes == [] and tree(host["base"]) == before
    assert host["sentinel"].poll() is None  # our own processes live on
    assert accepted(host["listener"]) == 0  # nobody connected to us


def command_lines(mark: str) -> list[list[bytes]]:
    """The argv of each process with `mark` in its command line (zombies have none)."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if mark.encode() in cmdline:
            found.append(cmdline.split(b"\0")[:-1])
    return found


@pytest.mark.parametrize("moment", ["start-up", "running"])
@pytest.mark.parametrize("isolation", ["bubblewrap", "weak"])
def test_a_killed_parent_takes_its_sandbox_along(isolation, moment):
    """SIGKILL the process that runs the sandbox (as the OOM killer would): nothing survives it,
    whether it dies during the run's start-up (as soon as the run's first process exists, when
    bwrap and its namespace's init have not yet asked to die with their parent) or once the
    program and its fork run; with bubblewrap, and in the weak mode (bwrap hidden from the parent)."""
    mark = f"rla-hostile-orphan-{secrets.token_hex(4)}"
    hide_bwrap = (
        "import shutil\nwhich = shutil.which\nshutil.which = lambda name: None if name == 'bwrap' else which(name)\n"
    )
    script = (
        (hide_bwrap if isolation == "weak" else "")
        + "from rlanything.environment import SandboxConfig\nfrom rlanything.envs.sandbox import run_program\n"
        + f"limits = SandboxConfig(timeout_s=60, isolation={isolation!r})\n"
        + f"run_program('import os, time\\nos.fork()\\ntime.sleep(60)', limits=limits, argv=['main.py', {mark!r}])"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(CHECKOUT)})

    def started() -> bool:
        argvs = command_lines(mark)
        if moment == "start-up":  # the run's first process, its keeper, exists
            return any(len(argv) > 3 and argv[3].endswith(b"/keeper.py") for argv in argvs)
        return sum(argv[1:] == [b"-I", b"-S", b"main.py", mark.encode()] for argv in argvs) >= 2  # program + fork

    deadline = time.monotonic() + 90  # start-up (imports, the bwrap probe) is slow on a loaded machine
    while not started() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started() and parent.poll() is None
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marked_processes(mark) == []
    # the killed process never removed its private folder; the next sandbox run's sweep does
    left = list(Path(tempfile.gettempdir()).glob(f"{PRIVATE_PREFIX}{parent.pid}-*"))
    assert left, "the killed run left no private folder: the test did not reach run_program"
    assert set(sweep_orphans()) >= set(left)
    assert not any(path.exists() for path in left)


def test_the_catalogue_is_large_enough():
    assert len(CASES) >= 35
