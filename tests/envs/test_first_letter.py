import pytest

from rlanything.algo.parsing import parse_answer
from rlanything.config import build_config
from rlanything.envs import env_class, initial_specs, make_env
from rlanything.envs.first_letter import LETTER_ORDER, FirstLetterEnv


def env_config(letters="ae", n=3):
    return build_config(
        {
            "env": {
                "kind": "first_letter",
                "options": {"letters": letters},
                "num_problems": n,
                "answer_fallback": "first_word",
            }
        }
    ).env


def play(spec, response):
    config = env_config()
    env = make_env(config)
    prompt = env.reset(spec)
    result = env.step(parse_answer(response, fallback=config.answer_fallback)[0])
    return prompt, result, env.outcome()


def test_kind_dispatches_and_the_prompt_states_the_rule():
    assert env_class("first_letter") is FirstLetterEnv
    spec = initial_specs(env_config(), seed=0)[0]
    prompt, result, _ = play(spec, "apple")
    assert "'a', 'e'" in prompt and prompt.startswith("Topic words: ")
    assert result.done and result.observation == ""


@pytest.mark.parametrize(
    "response, outcome",
    [
        ("apple pie", 1),
        ("  Eagle", 1),
        ("\\boxed{egg} not banana", 1),
        ("banana apple", -1),
        ("", -1),
        ("\\boxed{ }", -1),
        ("\\boxed{banana} apple", -1),
        ("'apple'", -1),
    ],
)
def test_outcome_reads_the_first_letter_of_the_boxed_answer_or_first_word(response, outcome):
    spec = {"letters": "ae", "seed": 5}
    assert play(spec, response)[2] == outcome


def test_no_answer_fails():
    env = FirstLetterEnv()
    env.reset({"letters": "a", "seed": 0})
    env.step(None)
    assert env.outcome() == -1


def test_specs_differ_per_slot_and_rebuild_the_same_prompt():
    specs = initial_specs(env_config(n=4), seed=2)
    assert [s["seed"] for s in specs] == [200_006, 200_007, 200_008, 200_009]
    assert all(s["letters"] == "ae" for s in specs)
    prompts = [FirstLetterEnv().reset(s) for s in specs]
    assert len(set(prompts)) == len(specs)  # each slot's seed picks its own topic words
    assert FirstLetterEnv().reset(dict(specs[0])) == prompts[0]


@pytest.mark.parametrize(
    "spec, reason",
    [
        ({"letters": "a"}, "spec keys"),
        ({"letters": "A", "seed": 0}, "lowercase"),
        ({"letters": "aa", "seed": 0}, "distinct"),
        ({"letters": "", "seed": 0}, "non-empty"),
        ({"letters": "a", "seed": "1"}, "integer"),
    ],
)
def test_bad_specs_name_the_problem(spec, reason):
    with pytest.raises(ValueError, match=reason):
        FirstLetterEnv.validate_spec(env_config(), spec)


def test_bad_configured_letters_fail_at_start_up():
    with pytest.raises(ValueError, match="lowercase"):
        initial_specs(env_config(letters="a1"), seed=0)


def test_rule_rewrites_step_the_letter_set_and_parse_back():
    spec = {"letters": "ae", "seed": 7}
    harder = FirstLetterEnv.parse_rewrite(spec, FirstLetterEnv.rule_rewrite(spec, "harder"))
    assert harder == {"letters": "a", "seed": 7}  # e is rarer than a among the vocabulary's first letters
    easier = FirstLetterEnv.parse_rewrite(spec, FirstLetterEnv.rule_rewrite(spec, "easier"))
    assert easier == {"letters": "aec", "seed": 7}  # the most frequent letter not yet allowed
    FirstLetterEnv.validate_spec(env_config(), easier)
    with pytest.raises(ValueError, match="single letter"):
        FirstLetterEnv.rule_rewrite({"letters": "a", "seed": 0}, "harder")
    with pytest.raises(ValueError, match="every letter"):
        FirstLetterEnv.rule_rewrite({"letters": LETTER_ORDER, "seed": 0}, "easier")
    assert '"ae"' in FirstLetterEnv.rewrite_instructions(spec, "harder")


def test_malformed_rewrites_are_rejected():
    spec = {"letters": "a", "seed": 0}
    for bad, reason in [
        ("no box", "no \\\\boxed"),
        ('\\boxed{{"letters": "A"}}', "lowercase"),
        ('\\boxed{{"seed": 3}}', "unknown parameters"),
    ]:
        with pytest.raises(ValueError, match=reason):
            FirstLetterEnv.parse_rewrite(spec, bad)
