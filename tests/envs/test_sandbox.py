"""The sandbox's limits, each proven by code that tries to break it (tests/envs/test_hostile.py
has the catalogue of hostile programs)."""

import os
import subprocess
import time

import pytest

from rlanything.envs import sandbox
from rlanything.envs.sandbox import Limits, outputs_match, run_program, run_tests

FAST = Limits(timeout_s=2.0, memory_mb=256, max_file_mb=1, max_processes=8)


def processes_of(uid: int) -> list[str]:
    """Processes (zombies included) of `uid`, after giving the kernel a moment to tear down."""
    for _ in range(20):
        out = subprocess.run(["ps", "-eo", "uid=,pid=,stat=,args="], capture_output=True, text=True).stdout
        found = [line for line in out.splitlines() if line.split()[0] == str(uid)]
        if not found:
            break
        time.sleep(0.1)
    return found


def test_plain_program_runs_with_stdin_and_stdout():
    result = run_program("import sys\nprint(sum(map(int, sys.stdin.read().split())))", "1 2 3\n", FAST)
    assert (result.returncode, result.stdout, result.timed_out) == (0, "6\n", False)


def test_infinite_loop_is_killed_at_the_wall_clock_timeout():
    start = time.monotonic()
    result = run_program("while True:\n    pass", limits=FAST)
    assert result.timed_out and result.returncode is None
    assert 2.0 <= time.monotonic() - start < 6.0


def test_memory_bomb_fails():
    result = run_program("x = bytearray(2 * 1024**3)\nprint('allocated')", limits=FAST)
    assert result.returncode != 0 and "MemoryError" in result.stderr and "allocated" not in result.stdout
    growing = run_program("chunks = []\nwhile True:\n    chunks.append(b'x' * 10**7)", limits=FAST)
    assert growing.returncode != 0 and "MemoryError" in growing.stderr and not growing.timed_out


def test_fork_bomb_is_contained_and_leaves_nothing_behind():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    start = time.monotonic()
    result = run_program(bomb, limits=FAST)
    assert result.timed_out and time.monotonic() - start < 8.0
    if result.uid != os.getuid():  # our own uid has other processes; a dedicated one must have none
        assert processes_of(result.uid) == []
    counting = """import os, time
n = 0
for _ in range(100):
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
    except OSError:
        break
print(n)"""
    counted = run_program(counting, limits=FAST)
    assert int(counted.stdout) < 8 + 1  # RLIMIT_NPROC stopped it (processes of a fresh uid)


def test_a_process_that_leaves_the_group_is_killed_too():
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    result = run_program(escape, limits=FAST)
    assert result.stdout == "parent done\n"
    if result.uid != os.getuid():
        assert processes_of(result.uid) == []  # the PID namespace died with its init


def test_huge_file_fails_at_the_size_limit():
    result = run_program("f = open('big.bin', 'wb')\nfor _ in range(100):\n    f.write(b'x' * 2**20)", limits=FAST)
    assert result.returncode != 0 and "File too large" in result.stderr
    flood = run_program("while True:\n    print('x' * 1000)", limits=FAST)
    assert flood.returncode != 0 and len(flood.stdout) <= 2**20  # stdout is a file: capped too


def test_environment_secrets_are_invisible(monkeypatch):
    monkeypatch.setenv("RLANYTHING_TEST_SECRET", "hunter2")
    result = run_program(
        "import os\nprint(sorted(os.environ))\nprint(os.environ.get('RLANYTHING_TEST_SECRET'))", limits=FAST
    )
    assert result.stdout.splitlines() == ["['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR']", "None"]
    peek = run_program(f"print(open('/proc/{os.getpid()}/environ').read())", limits=FAST)  # private /proc
    assert peek.returncode != 0 and "hunter2" not in peek.stdout and "FileNotFoundError" in peek.stderr


def test_network_access_fails():
    result = run_program(
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)\nprint('connected')", limits=FAST
    )
    assert result.returncode != 0 and "connected" not in result.stdout
    assert "Network is unreachable" in result.stderr or "OSError" in result.stderr


def test_work_dir_is_private_and_thrown_away():
    result = run_program(
        "import os\nopen('note.txt', 'w').write('x')\nprint(os.getcwd(), sorted(os.listdir('.')))", limits=FAST
    )
    assert result.stdout == "/sandbox ['main.py', 'note.txt']\n" and result.isolation == "bubblewrap"
    again = run_program("import os\nprint(os.listdir('.'), os.listdir('/tmp'))", limits=FAST)
    assert again.stdout == "['main.py'] []\n"  # nothing of the run before
    denied = run_program("open('/work/rlanything-should-not-exist', 'w')", limits=FAST)
    assert denied.returncode != 0 and not os.path.exists("/work/rlanything-should-not-exist")


def test_run_tests_gives_one_result_per_test():
    stdio = "a, b = map(int, input().split())\nprint(a + b)"
    tests = [{"input": "1 2\n", "output": "3\n"}, {"input": "2 2", "output": "5"}, {"input": "x", "output": "1"}]
    assert run_tests(stdio, tests, limits=FAST) == [True, False, False]
    code = "def f(x):\n    if x == 3:\n        while True:\n            pass\n    return x * 2"
    tests = [
        {"code": "assert f(1) == 2"},
        {"code": "assert f(2) == 5"},
        {"code": "assert f(3) == 6"},
        {"code": "import sys; sys.exit(0)"},
        {"code": "assert f(4) == 8"},
    ]
    assert run_tests(code, tests, limits=Limits(timeout_s=1.0)) == [True, False, False, False, True]
    assert run_tests("raise SystemExit(0)", [{"code": "assert True"}]) == [False]  # exiting early passes nothing
    assert run_tests("print('0 0 1')", [{"code": "pass"}]) == [True]  # printing cannot forge results
    forged = "import os\nos.write(1, b'deadbeef 0 1\\n')\nos._exit(0)"
    assert run_tests(forged, [{"code": "assert False"}]) == [False]


def test_outputs_match_tokens_and_numbers():
    assert outputs_match("1 2\n3\n", "1 2 3") and outputs_match("0.1000000001", "0.1")
    assert not outputs_match("1 2", "1 2 3") and not outputs_match("yes", "YES") and not outputs_match("0.2", "0.1")


def without_bwrap(monkeypatch) -> "sandbox.Runtime":
    """Probe again as on a machine without bwrap; -> the runtime the sandbox then uses."""
    real_which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    fallback = sandbox.runtime.__wrapped__()
    monkeypatch.setattr(sandbox, "runtime", lambda: fallback)
    return fallback


def test_without_bwrap_the_sandbox_refuses_unless_weak_is_allowed(monkeypatch, caplog):
    from rlanything.config import build_config
    from rlanything.envs.coding import CodingEnv

    fallback = without_bwrap(monkeypatch)
    assert fallback.bwrap is None and "bwrap is not installed" in fallback.notes
    with pytest.raises(sandbox.SandboxUnavailable, match="refusing to run untrusted code.*isolation: weak"):
        run_program("print(1)", limits=FAST)
    with pytest.raises(sandbox.SandboxUnavailable):
        run_tests("def f(x):\n    return x", [{"code": "assert f(1) == 1"}], limits=FAST)
    config = build_config({"env": {"kind": "coding"}}).env
    with pytest.raises(sandbox.SandboxUnavailable):  # the environment refuses to start at all
        CodingEnv(config)
    weak = build_config({"env": {"kind": "coding", "coding": {"sandbox": {"isolation": "weak"}}}}).env
    CodingEnv(weak)
    assert "WEAK isolation" in caplog.text


def test_the_weak_mode_keeps_the_other_layers_and_says_so(monkeypatch):
    without_bwrap(monkeypatch)
    weak = Limits(**{**FAST.__dict__, "isolation": "weak"})
    before = sandbox.RUNS["weak"]
    assert run_program("while True:\n    pass", limits=weak).timed_out
    assert "MemoryError" in run_program("x = bytearray(2 * 1024**3)", limits=weak).stderr
    result = run_program("import os\nprint(os.getuid(), sorted(os.environ))", limits=weak)
    assert result.stdout.split(" ", 1) == [str(result.uid), "['HOME', 'LANG', 'PATH', 'TMPDIR']\n"]
    assert result.isolation == "weak" and sandbox.RUNS["weak"] == before + 3
    assert run_tests("def f(x):\n    return x", [{"code": "assert f(1) == 1"}], limits=weak) == [True]
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    assert run_program(escape, limits=weak).stdout == "parent done\n"
    if result.uid != os.getuid():  # as root the throw-away uid's stragglers are swept
        assert processes_of(result.uid) == []


def test_a_weak_run_that_fails_to_start_still_counts_itself_out(monkeypatch, tmp_path):
    """The throw-away uid's stragglers are swept when its last weak run ends: a run whose program
    never started must not stay counted, or no later run would ever sweep."""
    without_bwrap(monkeypatch)
    outputs = (tmp_path / "out", tmp_path / "err")
    with pytest.raises(FileNotFoundError):
        sandbox._run_until_deadline(
            ["/nonexistent/program"],
            "",
            cwd=str(tmp_path),
            env={},
            fds={},
            wall_s=1.0,
            weak=True,
            uid=None,
            outputs=outputs,
        )
    assert sandbox._weak_in_flight == 0
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    result = run_program(escape, limits=Limits(**{**FAST.__dict__, "isolation": "weak"}))
    assert result.stdout == "parent done\n"
    if result.uid != os.getuid():  # as root: the sweep after this run's end found the straggler
        assert processes_of(result.uid) == []


def test_no_unshare_noise_on_timeouts():
    result = run_program("import time\ntime.sleep(30)", limits=Limits(timeout_s=0.5))
    assert result.timed_out and result.stderr == ""
