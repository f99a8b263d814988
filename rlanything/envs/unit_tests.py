r"""The coding setting's reward model writes unit tests (rm.role unit_tests): what it is asked,
how its answer is read, and the pass matrix of its tests on the policy's solutions.

A test's form follows the problem's ground truth: an `assert` statement for function problems
(HumanEval, statement tests), an input / expected-output pair for stdio problems. The RM
answers inside \boxed{}: `\boxed{assert add(2, 3) == 5}` or
`\boxed{{"input": "2 3\n", "output": "5\n"}}` (a JSON object; "Input: ... Output: ..." lines
are read too). Anything else is unparseable, with the reason recorded.

Every generated test runs on every solution in the sandbox (`envs.sandbox`, the limits of
`env.options.sandbox`), each (test, solution) pair in a process of its own: a generated test
is untrusted code like a solution, and one that kills its process (`os._exit`, a fork bomb)
fails itself only, never its neighbours. A stdio test is data, not code: the solution runs on it.
"""

from __future__ import annotations

import ast
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from rlanything.algo.parsing import extract_last_boxed
from rlanything.envs.coding import load_problem, solution_program, strip_fence
from rlanything.envs.sandbox import run_tests

MAX_TEST_CHARS = 4000  # a longer "test" is a dump, not a test
SANDBOX_THREADS = 4  # sandboxed runs at once (each is its own process)


def style_of(problem: dict[str, Any]) -> str:
    """ "stdio" when the ground truth feeds stdin, else "assert" (statement tests)."""
    return "stdio" if any("input" in t for t in problem["tests"]) else "assert"


def function_name(problem: dict[str, Any]) -> str | None:
    """The function a statement test should call: `candidate = NAME` in the setup (HumanEval),
    else the last top-level `def` of the prefix or the reference."""
    match = re.search(r"^candidate = (\w+)\s*$", problem["setup"] or "", re.M)
    if match:
        return match.group(1)
    for source in (problem["prefix"], problem["reference"]):
        names = re.findall(r"^def (\w+)\(", source or "", re.M)
        if names:
            return names[-1]
    return None


def unit_test_request(problem: dict[str, Any]) -> str:
    """The RM's user message: the problem and the form of the one test to write."""
    if style_of(problem) == "stdio":
        return (
            f"## Problem\n{problem['prompt'].strip()}\n\n"
            "Write ONE test case for a program that solves this problem: an input and the exact output a "
            "correct program prints for it. Think briefly, then give the test as a JSON object inside "
            '\\boxed{}, for example \\boxed{{"input": "2 3\\n", "output": "5\\n"}}.'
        )
    name = function_name(problem) or "the function"
    return (
        f"## Problem\n```python\n{problem['prompt'].rstrip()}\n```\n\n"
        f"Write ONE unit test for `{name}`: a single Python assert statement that calls it on an input and "
        "checks the exact result a correct implementation returns. Think briefly, then give only the assert "
        f"inside \\boxed{{}}, for example \\boxed{{assert {name}(...) == ...}}."
    )


def unit_test_form(spec: dict[str, Any]) -> tuple[str, str, tuple[str, str]]:
    """A coding problem's spec -> (style, request, example): the form of the test the RM writes
    for it (`style_of`), the RM's user message (`unit_test_request`) and a solved request of that
    form (`unit_test_example`)."""
    problem = load_problem(spec)
    style = style_of(problem)
    return style, unit_test_request(problem), unit_test_example(style)


# One solved request per form, shown to the RM as an earlier chat turn (its problem is none of
# ours). SmolLM2-135M wrote 0 parseable tests of 32 without it and 8 of 32 with it (measured,
# 8 shipped problems x 4 samples, temperature 1).
_EXAMPLE_PROBLEMS = {
    "stdio": {"prompt": "Read an integer n from standard input and print n squared.", "tests": [{"input": ""}]},
    "assert": {"prompt": 'def square(n):\n    """Return n * n."""\n', "tests": [], "prefix": "def square(n):"},
}
_EXAMPLE_REPLIES = {
    "stdio": 'For n = 4 a correct program prints 16.\n\\boxed{{"input": "4\\n", "output": "16\\n"}}',
    "assert": "square(4) is 4 * 4 = 16.\n\\boxed{assert square(4) == 16}",
}


def unit_test_example(style: str) -> tuple[str, str]:
    """(request, reply): a solved request of the form `style` asks for.

    >>> request, reply = unit_test_example("assert")
    >>> parse_unit_test(reply, "assert")
    ({'code': 'assert square(4) == 16'}, None)
    """
    problem = {"setup": "", "prefix": "", "reference": None, **_EXAMPLE_PROBLEMS[style]}
    return unit_test_request(problem), _EXAMPLE_REPLIES[style]


def parse_unit_test(text: str, style: str) -> tuple[dict | None, str | None]:
    """The RM's reply -> (test, None) or (None, why it is unparseable).

    >>> parse_unit_test(r"I check 2 + 3. \\boxed{assert add(2, 3) == 5}", "assert")
    ({'code': 'assert add(2, 3) == 5'}, None)
    >>> parse_unit_test(r'\\boxed{{"input": "2 3", "output": 5}}', "stdio")
    ({'input': '2 3\\n', 'output': '5'}, None)
    >>> parse_unit_test("no box", "stdio")
    (None, 'no \\\\boxed{}')
    """
    box = extract_last_boxed(text)
    if box is None:
        return None, "no \\boxed{}"
    body = strip_fence(box).strip()
    if not body:
        return None, "empty \\boxed{}"
    if len(body) > MAX_TEST_CHARS:
        return None, f"longer than {MAX_TEST_CHARS} characters"
    return _parse_stdio(body) if style == "stdio" else _parse_assert(body)


def _parse_assert(body: str) -> tuple[dict | None, str | None]:
    try:
        tree = ast.parse(body)
    except SyntaxError as err:
        return None, f"not Python: {err.msg}"
    if not any(isinstance(node, ast.Assert) for node in ast.walk(tree)):
        return None, "no assert statement"
    return {"code": body}, None


def _parse_stdio(body: str) -> tuple[dict | None, str | None]:
    pair = None
    try:
        value = json.loads(body)
        if isinstance(value, dict):
            pair = value
    except json.JSONDecodeError:
        match = re.fullmatch(r"(?is)\s*input\s*:\s*(.*?)\s*output\s*:\s*(.*?)\s*", body)
        if match:
            pair = {"input": match.group(1), "output": match.group(2)}
    if pair is None:
        return None, "not a JSON object with input and output"
    if set(pair) != {"input", "output"}:
        return None, f"keys must be input and output, got {sorted(pair)}"
    scalar = (str, int, float)
    if not all(isinstance(v, scalar) and not isinstance(v, bool) for v in pair.values()):
        return None, "input and output must be strings (or numbers)"
    stdin = str(pair["input"])
    return {"input": stdin if stdin.endswith("\n") else stdin + "\n", "output": str(pair["output"])}, None


def pass_matrix(env_config, spec: dict[str, Any], tests: list[dict | None], answers: list[str | None]) -> np.ndarray:
    """tests (K,), None for unparsed ones; answers (S,), the solutions (None: no answer given)
    -> (K, S) bool: test k passes on solution s. Unparsed tests and missing answers are False
    without running anything."""
    problem = load_problem(spec)
    limits = env_config.options.sandbox
    programs = [solution_program(problem, a) if isinstance(a, str) else None for a in answers]
    matrix = np.zeros((len(tests), len(answers)), dtype=bool)
    jobs = [(k, s) for k, test in enumerate(tests) if test is not None for s, p in enumerate(programs) if p]
    run = lambda k, s: run_tests(programs[s], [tests[k]], setup=problem["setup"], limits=limits)[0]  # noqa: E731
    with ThreadPoolExecutor(SANDBOX_THREADS) as pool:
        for (k, s), ok in zip(jobs, pool.map(lambda job: run(*job), jobs)):
            matrix[k, s] = ok
    return matrix
