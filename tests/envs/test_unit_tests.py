"""The RM as a unit-test writer (rm.role unit_tests): parsing its replies, the pass matrix of its
tests on the policy's solutions through the real sandbox, and the rewards of that matrix."""

import os
import secrets
import socket
import time

import numpy as np
import pytest

from rlanything.algo.unit_test_rewards import correct_test_pass_fraction, unit_test_scores
from rlanything.config import EnvConfig
from rlanything.envs.coding import load_problem
from rlanything.envs.unit_tests import function_name, parse_unit_test, pass_matrix, style_of, unit_test_request

ENV = EnvConfig(kind="coding", options={"source": "sample", "sandbox": {"timeout_s": 2.0}})
SUM = {
    "source": "inline",
    "prompt": "Read two integers a and b on one line and print a + b.",
    "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}],
    "setup": "",
    "prefix": "",
    "reference": "a, b = map(int, input().split())\nprint(a + b)",
}
ADD = {
    "source": "inline",
    "prompt": "def add(a, b):\n    '''Return a + b.'''\n",
    "tests": [{"code": "assert add(1, 2) == 3"}],
    "setup": "",
    "prefix": "def add(a, b):\n    '''Return a + b.'''\n",
    "reference": "    return a + b",
}
# the policy's answers (what \boxed{} held): two right programs, two wrong ones
SOLUTIONS = [
    "print(sum(map(int, input().split())))",
    "a, b = map(int, input().split())\nprint(a + b)",
    "print(input().split()[0])",  # prints a
    "a, b = map(int, input().split())\nprint(a * b)",
]
RIGHT = np.array([True, True, False, False])


def test_parse_stdio_and_assert_tests_and_say_why_not():
    assert parse_unit_test('so \\boxed{{"input": "2 3", "output": "5\\n"}}', "stdio") == (
        {"input": "2 3\n", "output": "5\n"},
        None,
    )
    assert parse_unit_test("\\boxed{Input: 2 3\nOutput: 5}", "stdio") == ({"input": "2 3\n", "output": "5"}, None)
    assert parse_unit_test("\\boxed{```python\nassert add(1, 1) == 2\n```}", "assert") == (
        {"code": "assert add(1, 1) == 2"},
        None,
    )
    for text, style, why in [
        ("the answer is 5", "stdio", "no \\boxed{}"),
        ("\\boxed{}", "stdio", "empty \\boxed{}"),
        ("\\boxed{5}", "stdio", "not a JSON object with input and output"),
        ('\\boxed{{"input": "1"}}', "stdio", "keys must be input and output, got ['input']"),
        ('\\boxed{{"input": ["1"], "output": "2"}}', "stdio", "input and output must be strings (or numbers)"),
        ("\\boxed{add(1, 1) == 2}", "assert", "no assert statement"),
        ("\\boxed{assert add(1, 1 == 2}", "assert", "not Python: '(' was never closed"),
        ("\\boxed{assert " + "1" * 5000 + "}", "assert", "longer than 4000 characters"),
    ]:
        assert parse_unit_test(text, style) == (None, why), text


def test_the_request_names_the_form_and_the_function():
    stdio, function = load_problem(SUM), load_problem(ADD)
    assert style_of(stdio) == "stdio" and style_of(function) == "assert"
    assert function_name(function) == "add"
    assert '\\boxed{{"input": "2 3\\n", "output": "5\\n"}}' in unit_test_request(stdio)
    assert "assert statement" in unit_test_request(function) and "`add`" in unit_test_request(function)
    humaneval = load_problem({"source": "humaneval", "id": "HumanEval/0"})
    assert function_name(humaneval) == "has_close_elements"


def test_pass_matrix_and_rewards_of_a_hand_built_task_through_the_sandbox():
    """3 generated tests on 2 right and 2 wrong solutions: a good test, a wrong one, an
    unparseable one. Expected by hand: test 0 (2 3 -> 5) passes both right programs, fails
    "prints a" (2) and "a * b" (6): correct, catches 2, reward +2. Test 1 (3 1 -> 3) is wrong
    (3 + 1 = 4): fails both right programs, passes both wrong ones (3 and 3): reward -2.
    Test 2 has no box: -2, never run."""
    replies = [
        'A small case: \\boxed{{"input": "2 3", "output": "5"}}',
        'Edge: \\boxed{{"input": "3 1", "output": "3"}}',
        "I think the program should print the sum.",
    ]
    tests = [parse_unit_test(r, "stdio")[0] for r in replies]
    assert tests[2] is None
    matrix = pass_matrix(ENV, SUM, tests, SOLUTIONS + [None])  # a fifth solution: no answer at all
    assert matrix.tolist() == [
        [True, True, False, False, False],
        [False, False, True, True, False],
        [False, False, False, False, False],
    ]
    scores = unit_test_scores(matrix, np.r_[RIGHT, False], np.array([True, True, False]))
    # with the missing answer a third wrong solution: test 0 fails it too (3 caught)
    assert scores["reward"].tolist() == [3.0, -2.0, -2.0]
    assert scores["correct"].tolist() == [True, False, False]
    assert scores["incorrect_caught"].tolist() == [3, 1, 0]
    assert correct_test_pass_fraction(matrix, scores["correct"]).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_assert_tests_run_against_function_solutions():
    tests = [{"code": "assert add(2, 3) == 5"}, {"code": "assert add(-1, 1) == 0"}, {"code": "assert add(2, 2) == 5"}]
    answers = ["    return a + b", "def add(a, b):\n    return a - b", "return a + b"]  # body, whole, lost indent
    matrix = pass_matrix(ENV, ADD, tests, answers)
    assert matrix.tolist() == [[True, False, True], [True, False, True], [False, False, False]]


def test_hostile_generated_tests_are_contained_and_fail_alone():
    """Generated assert tests are untrusted code: each (test, solution) pair runs in a sandbox
    process of its own, so one that writes outside, forks without end, reaches the network or
    kills its process fails itself, leaves nothing behind, and a good test beside it still passes."""
    mark = "rla-ut-" + secrets.token_hex(6)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    home = os.path.expanduser("~")
    hostile = [
        f"assert open('/tmp/{mark}', 'w').write('x') and open('{home}/{mark}', 'w').write('x')",
        "assert [__import__('os').fork() for _ in iter(int, 1)]",
        f"assert __import__('socket').create_connection(('127.0.0.1', {port}), timeout=0.5)",
        "assert __import__('os')._exit(0)",
        "assert __import__('os').kill(-1, 9) or True",
    ]
    tests = [{"code": "assert add(2, 3) == 5"}] + [{"code": code} for code in hostile]
    start = time.monotonic()
    matrix = pass_matrix(ENV, ADD, tests, ["    return a + b"])
    took = time.monotonic() - start
    try:
        listener.accept()
        connected = True
    except BlockingIOError:
        connected = False
    listener.close()
    assert matrix[:, 0].tolist() == [True, False, False, False, False, False]
    assert not connected
    assert not os.path.exists(f"/tmp/{mark}") and not os.path.exists(f"{home}/{mark}")
    assert took < 60, took  # every run ended within its limits


@pytest.mark.parametrize("style", ["stdio", "assert"])
def test_unparsed_tests_and_missing_answers_run_nothing(style, monkeypatch):
    import rlanything.envs.unit_tests as unit_tests

    calls = []
    monkeypatch.setattr(unit_tests, "run_tests", lambda *a, **k: calls.append(a) or [True])
    spec = SUM if style == "stdio" else ADD
    matrix = pass_matrix(ENV, spec, [None, None], [None, "print(1)"])
    assert matrix.shape == (2, 2) and not matrix.any() and calls == []
