"""Critic summaries and rewrite validation (the library pieces of step 7)."""

import pandas as pd

from rlanything.agent.adapt_tasks import first_valid
from rlanything.config import build_config
from rlanything.envs.reasoning import ReasoningGymEnv
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.loading import load_model
from rlanything.models.rewriters import ModelRewriter, RuleRewriter, extractive_summary, failed_steps

ENV = build_config({}).env
SPEC = {
    "dataset": "basic_arithmetic",
    "seed": 5,
    "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
}


def frames():
    outcomes = pd.DataFrame({"traj_id": [0, 1, 2], "outcome": [-1, -1, 1], "valid": [True, True, True]})
    judgments = pd.DataFrame(
        {
            "traj_id": [0, 0, 1, 1, 2, 2],
            "step_idx": [0] * 6,
            "judge_idx": [0, 1] * 3,
            "step_score": [-1, -1, -1, 1, -1, -1],
            "reasoning": ["wrong sum \\boxed{-1}", "no box \\boxed{-1}", "bad", "ok", "x", "y"],
        }
    )
    steps = pd.DataFrame({"traj_id": [0, 1, 2], "step_idx": [0, 0, 0], "response": ["I say \\boxed{7}", "8", "9"]})
    return outcomes, judgments, steps


def test_failed_steps_are_those_every_judgment_rejected_in_failed_trajectories():
    items = failed_steps(*frames(), limit=5)
    # traj 0: failed, both −1 -> kept; traj 1: one +1 -> not; traj 2: succeeded -> not
    assert items == [
        {
            "traj_id": 0,
            "step_idx": 0,
            "response": "I say \\boxed{7}",
            "reasons": ["wrong sum \\boxed{-1}", "no box \\boxed{-1}"],
        }
    ]
    summary = extractive_summary(items)
    assert summary == "- step 1: the agent wrote «I say \\boxed{7}»; the judge said: wrong sum \\boxed{-1}"
    assert "No step" in extractive_summary([])


def test_first_valid_keeps_the_first_good_rewrite_and_records_the_rest():
    answers = ["no box here", '\\boxed{{"max_digits": 1}}', '\\boxed{{"max_digits": 2}}', '\\boxed{{"max_digits": 3}}']
    new, text, errors = first_valid(ReasoningGymEnv, ENV, SPEC, answers)
    assert new["config"]["max_digits"] == 2 and text == answers[2]
    assert len(errors) == 2 and "no \\boxed" in errors[0] and "changes nothing" in errors[1]
    new, text, errors = first_valid(ReasoningGymEnv, ENV, SPEC, ['\\boxed{{"min_digits": 4}}'])  # min > max
    assert new is None and "invalid reasoning-gym spec" in errors[0]


def test_rule_rewriter_goes_through_the_same_validation():
    [[harder]] = RuleRewriter(ReasoningGymEnv).propose([{"spec": SPEC, "direction": "harder"}], 3, seed=0)
    new, _, errors = first_valid(ReasoningGymEnv, ENV, SPEC, [harder])
    assert errors == [] and new["config"] == {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}
    [[easier]] = RuleRewriter(ReasoningGymEnv).propose([{"spec": SPEC, "direction": "easier"}], 3, seed=0)
    new, _, _ = first_valid(ReasoningGymEnv, ENV, SPEC, [easier])
    assert new["config"] == {"min_terms": 1, "max_terms": 1, "min_digits": 1, "max_digits": 1}
    [[floor]] = RuleRewriter(ReasoningGymEnv).propose([{"spec": new, "direction": "easier"}], 3, seed=0)
    assert floor.startswith("(no rule rewrite: no integer max_* knob")
    none, text, errors = first_valid(ReasoningGymEnv, ENV, new, [floor])
    assert none is None and text == floor  # recorded with the rule's reason, not the parse error of its text
    assert errors == [floor.strip("()").removeprefix("no rule rewrite: ")] and "boxed" not in errors[0]


def test_model_rewriter_answers_every_attempt(tiny_model_path, tiny_tokenizer):
    engine = TransformersEngine(load_model(tiny_model_path), tiny_tokenizer)
    rewriter = ModelRewriter(engine, tiny_tokenizer, max_new_tokens=8, temperature=0.7)
    request = {
        "task": "Calculate 1 + 2.",
        "spec": SPEC,
        "direction": "harder",
        "critic_summary": "fine",
        "instructions": ReasoningGymEnv.rewrite_instructions(SPEC, "harder"),
    }
    answers = rewriter.propose([request, request], attempts=3, seed=1)
    assert [len(a) for a in answers] == [3, 3] and all(isinstance(t, str) for a in answers for t in a)
    new, _, errors = first_valid(ReasoningGymEnv, ENV, SPEC, answers[0])  # a random model writes no JSON
    assert new is None and len(errors) == 3
    assert len(rewriter.summarise(["task"], [[]], seed=0)) == 1
