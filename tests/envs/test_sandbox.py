"""The sandbox's limits, each proven by code that tries to break it (tests/envs/test_hostile.py
has the catalogue of hostile programs)."""

import collections
import json
import os
import subprocess
import sys
import time

import pytest

from rlanything.environment import SandboxConfig
from rlanything.envs import sandbox
from rlanything.envs.sandbox import outputs_match, probe, run_program, run_tests
from rlanything.envs.sandbox.supervise import run_until_deadline

FAST = SandboxConfig(timeout_s=2.0, memory_mb=256, max_file_mb=1, max_processes=8)
WEAK = FAST.model_copy(update={"isolation": "weak"})


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


def test_a_run_beside_a_fork_bomb_still_starts():
    """RLIMIT_NPROC counts a uid's processes: a bomb that filled its limit must not leave a run
    started beside it unable to fork its own sandbox (they ran as one uid once, and a correct
    generated test failed beside a hostile one)."""
    import threading

    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    bombing = threading.Thread(target=run_program, args=(bomb,), kwargs={"limits": FAST, "wall_s": 6.0})
    bombing.start()
    try:
        time.sleep(2.0)  # the bomb has long filled its limit of 8 processes
        beside = run_program("print(2 + 3)", limits=FAST)
    finally:
        bombing.join()
    assert beside.stdout == "5\n" and beside.returncode == 0, beside


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
    assert run_tests(code, tests, limits=SandboxConfig(timeout_s=1.0)) == [True, False, False, False, True]
    assert run_tests("raise SystemExit(0)", [{"code": "assert True"}]) == [False]  # exiting early passes nothing
    assert run_tests("print('0 0 1')", [{"code": "pass"}]) == [True]  # printing cannot forge results
    forged = "import os\nos.write(1, b'deadbeef 0 1\\n')\nos._exit(0)"
    assert run_tests(forged, [{"code": "assert False"}]) == [False]


def test_outputs_match_tokens_and_numbers():
    assert outputs_match("1 2\n3\n", "1 2 3") and outputs_match("0.1000000001", "0.1")
    assert not outputs_match("1 2", "1 2 3") and not outputs_match("yes", "YES") and not outputs_match("0.2", "0.1")


def without_bwrap(monkeypatch) -> "sandbox.Runtime":
    """Probe again as on a machine without bwrap; -> the runtime the sandbox then uses."""
    real_which = probe.shutil.which
    monkeypatch.setattr(probe.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    fallback = probe.runtime.__wrapped__()
    monkeypatch.setattr(probe, "runtime", lambda: fallback)
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
    results = [
        run_program("while True:\n    pass", limits=WEAK),
        run_program("x = bytearray(2 * 1024**3)", limits=WEAK),
        run_program("import os\nprint(os.getuid(), sorted(os.environ))", limits=WEAK),
    ]
    assert results[0].timed_out and "MemoryError" in results[1].stderr
    result = results[2]
    assert result.stdout.split(" ", 1) == [str(result.uid), "['HOME', 'LANG', 'PATH', 'TMPDIR']\n"]
    assert {r.isolation for r in results} == {"weak"}
    runs = collections.Counter()
    assert run_tests("def f(x):\n    return x", [{"code": "assert f(1) == 1"}], limits=WEAK, runs=runs) == [True]
    assert runs == {"weak": 1}


def test_a_coding_replay_counts_its_programs_by_isolation(monkeypatch):
    """What verify's metric verify/sandbox_weak_runs adds up: the programs each replay of a
    coding trajectory ran, by isolation (here one per stdio test)."""
    from rlanything.config import build_config
    from rlanything.envs.coding import load_problem
    from rlanything.envs.verification import verify_episode

    options = {"source": "sample", "sandbox": {"timeout_s": 3.0, "isolation": "weak"}}
    config = build_config({"env": {"kind": "coding", "options": options}}).env
    spec = {"source": "sample", "id": "rla-001"}
    problem = load_problem(spec)
    episode = {"traj_id": 0, "task_id": "s0000v00", "termination": "done", "error": None, "pending": False}
    runs = collections.Counter()
    row = verify_episode(config, episode, json.dumps(spec), [problem["reference"]], runs)
    assert row["outcome"] == 1 and runs == {"bubblewrap": len(problem["tests"])}
    without_bwrap(monkeypatch)
    verify_episode(config, episode, json.dumps(spec), [problem["reference"]], runs)
    assert runs == {"bubblewrap": len(problem["tests"]), "weak": len(problem["tests"])}


def test_a_weak_run_leaves_no_process_behind_as_any_user(monkeypatch):
    """No PID namespace in the weak mode: the run's keeper, a subreaper, adopts and kills what
    the program left running, a setsid() daemon included, whichever uid the program ran as."""
    without_bwrap(monkeypatch)
    mark = f"rla-weak-daemon-{os.getpid()}-{time.monotonic_ns()}"
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    result = run_program(escape, limits=WEAK, argv=["main.py", mark])
    assert result.stdout == "parent done\n"
    assert marked(mark) == []


def marked(mark: str) -> list[str]:
    """Processes (zombies included) with `mark` in their command line, after a moment's grace."""
    for _ in range(20):
        out = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
        found = [line for line in out.splitlines() if mark in line]
        if not found:
            break
        time.sleep(0.1)
    return found


def test_the_keeper_exits_as_its_command_did(tmp_path):
    """A run's returncode is its command's (an exit status, a signal, or 127 with the reason when
    it cannot start); the command gets our stdin, exactly our environment and a session of its own."""
    outputs = (tmp_path / "out", tmp_path / "err")

    def run(cmd: list[str], stdin: str = "", env: dict[str, str] | None = None) -> tuple[int | None, bool]:
        return run_until_deadline(cmd, stdin, cwd=str(tmp_path), env=env or {}, fds={}, wall_s=10.0, outputs=outputs)

    assert run([sys.executable, "-c", "raise SystemExit(3)"]) == (3, False)
    assert run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]) == (-15, False)
    assert run(["/nonexistent/program"]) == (127, False)
    assert "cannot start /nonexistent/program" in outputs[1].read_text()
    script = (
        "import json, os, sys\nprint(json.dumps([sys.stdin.read(), open('/proc/self/environ').read(), os.getsid(0)]))"
    )
    assert run([sys.executable, "-I", "-c", script], "in", {"A": "1"}) == (0, False)
    stdin, env, session = json.loads(outputs[0].read_text())
    assert (stdin, env) == ("in", "A=1\x00") and session != os.getsid(0)  # a session of its own, not ours


def test_no_unshare_noise_on_timeouts():
    result = run_program("import time\ntime.sleep(30)", limits=SandboxConfig(timeout_s=0.5))
    assert result.timed_out and result.stderr == ""
