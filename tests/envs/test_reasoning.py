import pytest

from rlanything.config import build_config
from rlanything.envs import env_class, initial_specs, make_env
from rlanything.envs.reasoning import ReasoningGymEnv, build_entry

EASY = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
}


def env_config(dataset="basic_arithmetic", params=EASY, n=3):
    return build_config({"env": {"options": {"dataset": dataset, "dataset_config": params}, "num_problems": n}}).env


def play(spec, answer):
    env = make_env(env_config())
    question = env.reset(spec)
    result = env.step(answer)
    return question, result, env.outcome()


def test_generator_answer_wins_and_wrong_answer_loses():
    spec = initial_specs(env_config(), seed=0)[1]
    entry = build_entry(spec)["entry"]
    question, result, outcome = play(spec, entry["answer"])
    assert question == entry["question"] and question.startswith("Calculate")
    assert result.done and outcome == 1
    assert play(spec, str(int(entry["answer"]) + 1))[2] == -1
    assert play(spec, None)[2] == -1  # no parseable answer


def test_specs_rebuild_the_same_problem_and_differ_per_slot():
    specs = initial_specs(env_config(n=4), seed=3)
    assert len(specs) == 4
    assert build_entry(specs[0])["entry"] == build_entry(dict(specs[0]))["entry"]
    assert len({build_entry(s)["entry"]["question"] for s in specs}) == len(specs)  # a problem per slot
    assert initial_specs(env_config(n=4), seed=3) == specs


def test_other_generators_work_through_the_same_env():
    for name in ("gsm_symbolic", "countdown"):
        spec = initial_specs(env_config(name, {}, 1), seed=0)[0]
        entry = build_entry(spec)["entry"]
        assert play(spec, entry["answer"])[2] == 1, name


def test_bad_spec_names_the_problem():
    with pytest.raises(ValueError, match="max_digitz"):
        initial_specs(env_config(params={"max_digitz": 2}), seed=0)
    with pytest.raises(ValueError, match="unknown environment"):
        env_class("nethack")


def test_rewrite_round_trip_and_malformed_rewrites():
    spec = initial_specs(env_config(), seed=0)[0]
    text = ReasoningGymEnv.rewrite_instructions(spec, "harder")
    assert "max_digits" in text and "harder" in text
    new = ReasoningGymEnv.parse_rewrite(spec, 'Bigger numbers: \\boxed{{"max_digits": 2, "min_digits": 2}}')
    assert new["config"]["max_digits"] == 2 and new["config"]["operators"] == ["+"] and new["seed"] == spec["seed"]
    ReasoningGymEnv.validate_spec(env_config(), new)
    for bad, reason in [
        ("no box", "no \\\\boxed"),
        ("\\boxed{max_digits=2}", "not JSON"),
        ("\\boxed{[1]}", "JSON object"),
        ('\\boxed{{"colour": 1}}', "unknown parameters"),
    ]:
        with pytest.raises(ValueError, match=reason):
            ReasoningGymEnv.parse_rewrite(spec, bad)
    with pytest.raises(ValueError, match="invalid reasoning-gym spec"):
        ReasoningGymEnv.validate_spec(env_config(), {**spec, "config": {**spec["config"], "min_digits": 5}})


def test_worked_example_is_a_solved_problem_of_a_reserved_seed():
    from rlanything.algo.parsing import parse_answer
    from rlanything.envs.heldout import EXAMPLE_SEED, is_heldout_seed
    from rlanything.envs.reasoning import worked_example

    plain = make_env(env_config())
    spec = initial_specs(env_config(), seed=0)[0]
    plain.reset(spec)
    assert plain.example is None  # off unless the config asks

    config = build_config({"env": {"options": {"dataset_config": EASY, "worked_example": True}, "num_problems": 3}}).env
    env = make_env(config)
    harder = {**spec, "config": {**EASY, "max_digits": 2, "min_digits": 2}}
    for s in (spec, harder):
        question = env.reset(s)
        ((example_question, example_answer),) = env.example
        entry = build_entry({**s, "seed": EXAMPLE_SEED})["entry"]
        assert example_question == entry["question"] != question
        assert entry["metadata"]["difficulty"] == build_entry(s)["entry"]["metadata"]["difficulty"]  # same knobs
        a, b = (int(x) for x in example_question.removeprefix("Calculate ").rstrip(".").split(" + "))
        assert example_answer == f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."
        # the shown answer is what the verifier accepts for the example
        example_env = make_env(config)
        example_env.reset({**s, "seed": EXAMPLE_SEED})
        example_env.step(parse_answer(example_answer, fallback="none")[0])
        assert example_env.outcome() == 1
    env.reset(spec)
    assert env.example == (worked_example(spec),)
    # never a problem of training (any run seed) nor of evaluation
    assert not is_heldout_seed(EXAMPLE_SEED)
    for run_seed in (0, 1, 7, -3):
        assert EXAMPLE_SEED not in {s["seed"] for s in initial_specs(env_config(n=64), seed=run_seed)}
