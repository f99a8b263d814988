"""Greedy decoding, held-out splits kept apart from training for every environment kind, and the
episode records of a greedy evaluation (strict format vs answer fallback)."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))  # the scripted policy of the env tests

from scripted_policy import ScriptedPolicy  # noqa: E402

from rlanything.agent.eval_play import heldout_problems, play_greedy  # noqa: E402
from rlanything.config import build_config  # noqa: E402
from rlanything.envs import heldout  # noqa: E402
from rlanything.envs.base import env_class  # noqa: E402
from rlanything.envs.heldout import NoHeldOutSplit, drop_trained, heldout_specs, is_heldout_seed  # noqa: E402
from rlanything.envs.reasoning import build_entry  # noqa: E402
from rlanything.models.engines.generation import left_pad  # noqa: E402
from rlanything.models.engines.transformers_engine import TransformersEngine, positions  # noqa: E402
from rlanything.models.loading import load_model  # noqa: E402
from rlanything.models.prompts import policy_messages, render  # noqa: E402
from rlanything.seeding import SLOT_STRIDE  # noqa: E402
from rlanything.storage.parquet import read_table, write_table  # noqa: E402
from rlanything.storage.schemas import EVAL_EPISODES  # noqa: E402

RUN_SEEDS = (0, 1, 7, 21_474, 123_456, -3)
ARITH = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
}


# ------------------------------------------------------------------ greedy decoding


def test_temperature_zero_is_deterministic_argmax(tiny_model_path, tiny_tokenizer):
    model = load_model(tiny_model_path)
    engine = TransformersEngine(model, tiny_tokenizer, batch_size=2)
    prompts = [render(tiny_tokenizer, policy_messages("sys", [f"Calculate {i} + {2 * i}."], []))[1] for i in range(3)]
    a = engine.generate(prompts, max_new_tokens=8, temperature=0.0, top_p=1.0, seed=1)
    b = engine.generate(prompts, max_new_tokens=8, temperature=0.0, top_p=0.5, seed=99)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]  # seed and top_p play no part
    sampled = engine.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=1)
    assert [g.token_ids for g in sampled] != [g.token_ids for g in a]  # the random model is far from peaked
    for prompt, gen in zip(prompts, a):
        seq = prompt + gen.token_ids
        ids, attn = left_pad([seq], tiny_tokenizer.pad_token_id)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attn, position_ids=positions(attn)).logits[0].float()
        steps = logits[len(prompt) - 1 : len(seq) - 1]  # the logits that chose each generated token
        assert steps.argmax(-1).tolist() == gen.token_ids
        expected = torch.log_softmax(steps, -1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
        assert gen.logprobs == pytest.approx(expected.tolist(), abs=1e-4)  # log-probs at temperature 1


# ------------------------------------------------------------------ held-out splits kept apart


def training_seeds(kind: str, overrides: list[str], run_seed: int, rewrites: int = 3) -> set[int]:
    """Seeds of the initial buffer and of every chain of rule rewrites (both directions)."""
    config = build_config({}, [f"env.kind={kind}", *overrides]).env
    cls = env_class(kind)
    seeds, frontier = set(), cls.initial_specs(config, run_seed)
    for _ in range(rewrites + 1):
        seeds |= {s["seed"] for s in frontier}
        following = []
        for spec in frontier:
            for direction in ("harder", "easier"):
                try:
                    following.append(cls.parse_rewrite(spec, cls.rule_rewrite(spec, direction)))
                except ValueError:
                    pass
        frontier = following
    return seeds


@pytest.mark.parametrize(
    "kind,overrides",
    [
        (
            "reasoning_gym",
            [
                "env.options.dataset=basic_arithmetic",
                f"env.options.dataset_config={json.dumps(ARITH)}",
                "env.num_problems=16",
            ],
        ),
        ("textworld", ["env.num_problems=16"]),
        ("textworld_express", ["env.num_problems=16"]),
        ("miniwob", ["env.num_problems=16"]),
    ],
)
def test_seeded_heldout_specs_never_share_a_seed_with_training(kind, overrides):
    config = build_config({}, [f"env.kind={kind}", *overrides]).env
    for run_seed in RUN_SEEDS:
        trained = training_seeds(kind, overrides, run_seed)
        splits = {split: heldout_specs(config, split, 50, run_seed) for split in heldout.SPLITS}
        for split, specs in splits.items():
            seeds = [s["seed"] for s in specs]
            assert len(specs) == 50 and len(set(seeds)) == 50, split
            assert not set(seeds) & trained, (split, run_seed)
            assert all(is_heldout_seed(s) for s in seeds)
            assert heldout_specs(config, split, 10, run_seed) == specs[:10]  # a prefix: spares can be drawn
        assert not {s["seed"] for s in splits["in_domain"]} & {s["seed"] for s in splits["ood"]}
        small = [s for s in trained if 0 <= s < 2**31 - SLOT_STRIDE and (run_seed >= 0 and run_seed < 21_474)]
        assert not any(is_heldout_seed(s) for s in small)  # by construction, not only by the explicit check


def test_reasoning_gym_splits_build_problems_and_ood_is_harder():
    config = build_config({}, ["env.kind=reasoning_gym", f"env.dataset_config={json.dumps(ARITH)}"]).env
    cls = env_class("reasoning_gym")
    in_domain, ood = heldout_specs(config, "in_domain", 4, 0), heldout_specs(config, "ood", 4, 0)
    assert all(s["config"] == ARITH for s in in_domain)
    assert ood[0]["config"]["max_digits"] == 3 and ood[0]["config"]["max_terms"] == 4  # two rule steps harder
    for spec in in_domain[:2] + ood[:2]:
        cls.validate_spec(config, spec)
    questions = {cls(config).reset(s) for s in in_domain}
    assert len(questions) == 4


def test_textworld_heldout_games_generate(tmp_path):
    config = build_config({}, ["env.kind=textworld", f"env.options.games_dir={tmp_path}"]).env
    cls = env_class("textworld")
    ood = heldout_specs(config, "ood", 1, 0)[0]
    assert ood["options"]["world_size"] == 4 and ood["options"]["quest_length"] == 4  # bigger and longer
    cls.validate_spec(config, heldout_specs(config, "in_domain", 1, 0)[0])  # generated, walkthrough wins
    cls.validate_spec(config, ood)


def test_textworld_express_heldout_games_come_from_the_test_fold():
    config = build_config({}, ["env.kind=textworld_express"]).env
    cls = env_class("textworld_express")
    in_domain, ood = heldout_specs(config, "in_domain", 1, 0)[0], heldout_specs(config, "ood", 1, 0)[0]
    assert in_domain["fold"] == ood["fold"] == "test" and config.options.fold == "train"
    assert ood["params"]["numLocations"] == 3 and ood["params"]["numItemsToPutAway"] == 2
    for spec in (in_domain, ood):
        cls.validate_spec(config, spec)  # the game has a gold path


def test_coding_heldout_problems_are_outside_the_initial_buffer():
    for overrides in (
        ["env.num_problems=40"],
        ["env.options.problems=[HumanEval/0, HumanEval/1]", "env.num_problems=2"],
    ):
        config = build_config({}, ["env.kind=coding", *overrides]).env
        cls = env_class("coding")
        for run_seed in (0, 5):
            used = {s["id"] for s in cls.initial_specs(config, run_seed)}
            in_domain, ood = (heldout_specs(config, split, 200, run_seed) for split in heldout.SPLITS)
            ids_in, ids_ood = {s["id"] for s in in_domain}, {s["id"] for s in ood}
            assert not (ids_in | ids_ood) & used and not ids_in & ids_ood
            assert len(ids_in) + len(ids_ood) + len(used) == 164  # the pool runs out: every unused problem
            assert heldout_specs(config, "in_domain", 5, run_seed) == in_domain[:5]
    cls.validate_spec(config, in_domain[0])  # its reference passes its tests in the sandbox
    # the rewrites a run can make are inline problems, never a benchmark id
    rewritten = cls.parse_rewrite(
        in_domain[0], cls.rule_rewrite({"source": "humaneval", "id": "HumanEval/0"}, "easier")
    )
    assert rewritten["source"] == "inline"


def test_miniwob_heldout_specs_spec_level():
    from rlanything.envs.miniwob import FAMILIES, OOD_TASKS, MiniWoBEnv, html_dir

    config = build_config({}, ["env.kind=miniwob"]).env
    in_domain, ood = heldout_specs(config, "in_domain", 10, 0), heldout_specs(config, "ood", 10, 0)
    assert [s["task"] for s in in_domain[:5]] == list(config.options.tasks)
    assert all(s["seed"] >= 2**31 for s in in_domain + ood)  # the seed-changing rewrite stays below 2**31
    for spec in in_domain:
        for _, _, variant in MiniWoBEnv.variants(spec):
            assert variant["seed"] == spec["seed"] or variant["seed"] < 2**31
    laddered = {t for ladder in FAMILIES.values() for t in ladder}
    assert not {s["task"] for s in ood} & (laddered | set(config.options.tasks))  # no rewrite reaches them
    assert all((html_dir() / f"{task}.html").is_file() for task in OOD_TASKS)


def test_alfworld_heldout_games_come_from_the_evaluation_folders(tmp_path):
    from rlanything.envs.alfworld import game_path

    for folder in ("train", "valid_seen", "valid_unseen"):
        for task_type in ("pick_and_place_simple", "look_at_obj_in_light"):
            game = tmp_path / "json_2.1.1" / folder / f"{task_type}-x" / "trial_1"
            game.mkdir(parents=True)
            (game / "traj_data.json").write_text(json.dumps({"task_type": task_type}))
            (game / "game.tw-pddl").write_text(json.dumps({"solvable": True}))
    types = "[pick_and_place_simple, look_at_obj_in_light]"
    config = build_config(
        {},
        ["env.kind=alfworld", f"env.options.data_path={tmp_path}/json_2.1.1/train", f"env.options.task_types={types}"],
    ).env
    cls = env_class("alfworld")
    trained = cls.initial_specs(config, 0)
    assert all("split" not in s for s in trained)
    assert {game_path(config, s).parts[-4] for s in trained} == {"train"}
    for split, folder in (("in_domain", "valid_seen"), ("ood", "valid_unseen")):
        specs = heldout_specs(config, split, 4, 0)
        assert {game_path(config, s).parts[-4] for s in specs} == {folder}
    with pytest.raises(ValueError, match="split"):
        game_path(config, {"task_type": "pick_and_place_simple", "index": 0, "split": "train"})


def test_osworld_heldout_specs_spec_level(tmp_path):
    for domain in ("os", "chrome", "gimp"):
        folder = tmp_path / "examples" / domain
        folder.mkdir(parents=True)
        for k in range(4):
            (folder / f"{domain}-{k}.json").write_text(json.dumps({"instruction": "x", "evaluator": {}}))
    config = build_config(
        {},
        [
            "env.kind=osworld",
            f"env.options.examples_dir={tmp_path}",
            "env.options.domains=[os, chrome]",
            "env.num_problems=3",
        ],
    ).env
    used = {(s["domain"], s["example_id"]) for s in env_class("osworld").initial_specs(config, 0)}
    in_domain, ood = heldout_specs(config, "in_domain", 20, 0), heldout_specs(config, "ood", 20, 0)
    assert len(in_domain) == 5 and not {(s["domain"], s["example_id"]) for s in in_domain} & used
    assert {s["domain"] for s in in_domain} <= {"os", "chrome"} and {s["domain"] for s in ood} == {"gimp"}


def test_an_environment_without_heldout_specs_is_named(monkeypatch):
    class Plain:  # a plug-in environment that defines no held-out split
        pass

    monkeypatch.setattr("rlanything.envs.base.env_class", lambda kind: Plain)
    with pytest.raises(NoHeldOutSplit, match="has no held-out split"):
        heldout_specs(build_config({}).env, "in_domain", 4, 0)
    with pytest.raises(ValueError, match="unknown split"):
        heldout_specs(build_config({}).env, "test", 4, 0)


def test_specs_a_run_met_are_dropped():
    config = build_config({}, [f"env.dataset_config={json.dumps(ARITH)}"]).env
    first = heldout_specs(config, "in_domain", 6, 0)
    # a model rewrite that happened to land on a held-out seed, with other knobs
    trained = [first[1], {**first[3], "config": {"max_digits": 2}}]
    specs, dropped = heldout_problems(config, "in_domain", 4, 0, trained)
    assert dropped == 2 and specs == [first[0], first[2], first[4], first[5]]
    with pytest.raises(ValueError, match="none of the"):
        drop_trained(first[:1], first[:1], 1)


# ------------------------------------------------------------------ evaluation episodes


def test_greedy_episodes_count_strict_and_fallback_apart(tiny_tokenizer, tmp_path):
    config = build_config({}, [f"env.dataset_config={json.dumps(ARITH)}", "env.answer_fallback=last_number"]).env
    specs = heldout_specs(config, "in_domain", 4, 0)
    env = env_class("reasoning_gym")(config)
    answers = {}
    for spec in specs:
        question = env.reset(spec)
        a, b = (int(x) for x in question.removeprefix("Calculate ").rstrip(".").split(" + "))
        answers[question] = a + b
    texts = {}
    for k, question in enumerate(answers):  # boxed right, unboxed right, boxed wrong, no answer
        texts[question] = [
            f"so \\boxed{{{answers[question]}}}",
            f"it is {answers[question]}",
            f"\\boxed{{{answers[question] + 1}}}",
            "no idea",
        ][k]
    policy = ScriptedPolicy(tiny_tokenizer, lambda observations: texts[observations[0]])
    rows = play_greedy(policy, tiny_tokenizer, config, specs, "in_domain", max_new_tokens=16)
    assert [r["success"] for r in rows] == [True, True, False, False]
    assert [r["strict_success"] for r in rows] == [True, False, False, False]
    assert [r["boxed"] for r in rows] == [True, False, True, False]
    assert [r["fallback_steps"] for r in rows] == [0, 1, 0, 0]
    assert all(r["valid"] and r["num_steps"] == 1 and r["termination"] == "done" for r in rows)
    assert [r["outcome"] for r in rows] == [1, 1, -1, -1]
    assert all(r["prompt_tokens"] > 0 and r["response_tokens"] > 0 for r in rows)
    path = write_table([{**r, "weights": "w", "iteration": None} for r in rows], EVAL_EPISODES, tmp_path / "e.parquet")
    assert read_table(path, EVAL_EPISODES).success.tolist() == [True, True, False, False]


def test_a_crashing_environment_is_an_invalid_episode(tiny_tokenizer):
    config = build_config({}, [f"env.dataset_config={json.dumps(ARITH)}"]).env
    bad = {"dataset": "basic_arithmetic", "config": {"max_terms": "x"}, "seed": 99_003}
    good = heldout_specs(config, "in_domain", 1, 0)[0]
    policy = ScriptedPolicy(tiny_tokenizer, lambda observations: "\\boxed{1}")
    rows = play_greedy(policy, tiny_tokenizer, config, [bad, good], "in_domain", max_new_tokens=8)
    assert rows[0]["valid"] is False and rows[0]["termination"] == "env_error" and "ValueError" in rows[0]["error"]
    assert rows[1]["valid"] is True and rows[1]["error"] is None


def test_the_worked_example_is_the_first_exchange_of_every_prompt(tiny_tokenizer):
    from rlanything.envs.reasoning import worked_example

    config = build_config({}, [f"env.dataset_config={json.dumps(ARITH)}", "env.options.worked_example=true"]).env
    specs = heldout_specs(config, "in_domain", 3, 0)
    seen = []
    policy = ScriptedPolicy(tiny_tokenizer, lambda observations: seen.append(observations) or "\\boxed{0}")
    rows = play_greedy(policy, tiny_tokenizer, config, specs, "in_domain", max_new_tokens=16)
    assert len(rows) == 3
    for spec, observations in zip(specs, seen):
        question, answer = worked_example(spec)
        assert observations == [question, build_entry(spec)["entry"]["question"]]
    shown = [("Calculate 3 + 3.", "SHOWN")]
    prompt = render(tiny_tokenizer, policy_messages("sys", ["Calculate 1 + 2."], [], shown))[0]
    assert prompt.index("Calculate 3 + 3.") < prompt.index("SHOWN") < prompt.index("Calculate 1 + 2.")
