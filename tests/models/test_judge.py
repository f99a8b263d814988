"""RM judging on a tiny random model, both verdict modes."""

import math

import pytest

from rlanything.algo.parsing import parse_step_score
from rlanything.models.engines.generation import Choice, PrefixCache
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.judge import judge_steps
from rlanything.models.loading import load_model

STEPS = [
    {
        "traj_id": 0,
        "task_id": "s0000v00",
        "step_idx": 0,
        "task": "Calculate 2 + 2.",
        "history": [],
        "response": "2 + 2 = \\boxed{4}",
        "observation": "",
    },
    {
        "traj_id": 1,
        "task_id": "s0000v00",
        "step_idx": 1,
        "task": "Go north.",
        "history": [("\\boxed{look}", "You see a door.")],
        "response": "\\boxed{open door}",
        "observation": "Opened.",
    },
]


@pytest.fixture(scope="module")
def engine(tiny_model_path, tiny_tokenizer):
    return TransformersEngine(load_model(tiny_model_path), tiny_tokenizer, batch_size=4)


def judge(engine, tokenizer, verdict, seed=0, max_new_tokens=8):
    return judge_steps(
        engine,
        tokenizer,
        STEPS,
        judgments_per_step=3,
        verdict=verdict,
        max_new_tokens=max_new_tokens,
        temperature=0.8,
        top_p=1.0,
        seed=seed,
    )


def test_constrained_verdicts_always_parse_and_are_trainable_tokens(engine, tiny_tokenizer):
    rows = judge(engine, tiny_tokenizer, "constrained")
    assert len(rows) == 2 * 3
    assert [(r["traj_id"], r["judge_idx"]) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    for r in rows:
        assert r["parsed"] and r["step_score"] in (-1, 1) and r["verdict_mode"] == "constrained"
        assert r["reasoning"].endswith(f"\\boxed{{{r['step_score']}}}")
        assert tiny_tokenizer.decode(r["response_ids"]).endswith(f"\\boxed{{{r['step_score']}}}")
        assert len(r["logprobs"]) == len(r["response_ids"]) and all(lp <= 0 for lp in r["logprobs"])
        assert f"Step to judge (step {r['step_idx'] + 1})" in r["prompt"]
        assert r["p_plus"] is None  # decoded in the generation pass: the other option was not scored
    # the verdict's log-probs are the model's own: a teacher-forced pass reproduces them
    for r in rows[:2]:
        scored = engine.score([r["prompt_ids"]], [r["response_ids"]], temperature=0.8)[0]
        assert scored[-4:] == pytest.approx(r["logprobs"][-4:], abs=1e-4)


def test_a_direct_verdict_samples_no_reasoning_and_trains_only_the_verdict(engine, tiny_tokenizer):
    rows = judge(engine, tiny_tokenizer, "constrained", max_new_tokens=0)
    encode = lambda text: tiny_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    opener_and_closer = len(encode("\n\\boxed{")) + len(encode("}"))
    for r in rows:
        assert r["reasoning"] == f"\n\\boxed{{{r['step_score']}}}" and r["parsed"]
        # the response is the verdict alone: "\n\\boxed{", "1" or "-1" (1 or 2 tokens), "}"
        assert len(r["response_ids"]) - opener_and_closer == (1 if r["step_score"] == 1 else 2)
        scored = engine.score([r["prompt_ids"]], [r["response_ids"]], temperature=0.8)[0]
        assert scored == pytest.approx(r["logprobs"], abs=1e-4)
    # the same prompt judged three times differs only in the sampled verdict
    assert len({tuple(r["prompt_ids"]) for r in rows if r["traj_id"] == 0}) == 1


def test_a_direct_verdicts_m_judgments_cost_one_scoring_and_follow_its_probabilities(
    engine, tiny_tokenizer, tokens_fed
):
    """Direct verdicts: what the model is fed does not grow with m (one scoring of each step with
    each option), and 400 judgments of a step fall on +1 at the rate the model gives "1" against
    "-1" after the opener, renormalised: within 4 standard deviations."""
    feeds = []
    for m in (1, 400):
        with tokens_fed(engine.model) as fed:
            rows = judge_steps(
                engine, tiny_tokenizer, STEPS[:1], judgments_per_step=m, verdict="constrained",
                max_new_tokens=0, temperature=0.8, top_p=1.0, seed=5,
            )  # fmt: skip
        feeds.append(sum(n for _, n in fed))
    assert feeds[0] == feeds[1] > 0
    opener = tiny_tokenizer.encode("\n\\boxed{", add_special_tokens=False)
    prompt = rows[0]["prompt_ids"]
    first = {
        value: engine.score(
            [prompt], [opener + tiny_tokenizer.encode(text, add_special_tokens=False)], temperature=0.8
        )[0][len(opener)]
        for value, text in ((1, "1"), (-1, "-1"))
    }
    p = math.exp(first[1]) / (math.exp(first[1]) + math.exp(first[-1]))
    share = sum(r["step_score"] == 1 for r in rows) / len(rows)
    assert abs(share - p) < 4 * math.sqrt(p * (1 - p) / len(rows)) + 1e-9, (share, p)
    assert {r["step_score"] for r in rows} == {1, -1}  # both drawn: 0.05 < p < 0.95 for this model
    assert [r["judge_idx"] for r in rows] == list(range(400))


def test_direct_verdict_n_picks_1_iff_the_judges_nth_uniform_is_below_p1(engine, tiny_tokenizer):
    """Direct verdicts: judgment j of step k is draw k·m + j of `random.Random(seed)`, compared
    with p("1") / (p("1") + p("-")) right after prompt + "\\n\\boxed{" (a teacher-forced pass);
    its response and log-probs are the verdict's alone."""
    import random

    from rlanything.models.judge import verdict_choice

    choice = verdict_choice(tiny_tokenizer)
    rows = judge(engine, tiny_tokenizer, "constrained", seed=4, max_new_tokens=0)
    draws = random.Random(4)
    for r in rows:
        first = [
            engine.score([r["prompt_ids"]], [choice.opener + choice.options[v]], temperature=0.8)[0][len(choice.opener)]
            for v in (1, -1)
        ]
        p_one = math.exp(first[0]) / (math.exp(first[0]) + math.exp(first[1]))
        assert r["step_score"] == (1 if draws.random() < p_one else -1)
        assert r["response_ids"] == choice.opener + choice.options[r["step_score"]] + choice.closer


def test_constrained_verdicts_vary_with_the_seed(engine, tiny_tokenizer):
    scores = {tuple(r["step_score"] for r in judge(engine, tiny_tokenizer, "constrained", seed=s)) for s in range(6)}
    assert len(scores) > 1


def test_free_mode_records_unparseable_judgments(engine, tiny_tokenizer):
    rows = judge(engine, tiny_tokenizer, "free")
    assert len(rows) == 6
    for r in rows:  # a random model never writes a verdict box: every judgment is unparseable
        assert r["verdict_mode"] == "free"
        assert r["p_plus"] is None and r["unchosen_logprobs"] is None  # only one verdict was scored
        assert r["parsed"] == (parse_step_score(r["reasoning"]) is not None)
        if not r["parsed"]:
            assert r["step_score"] == 0
    assert not any(r["parsed"] for r in rows)


def test_unknown_mode_is_refused(engine, tiny_tokenizer):
    with pytest.raises(ValueError, match="verdict mode"):
        judge(engine, tiny_tokenizer, "lenient")


class TwoPass(TransformersEngine):
    """An engine that cannot decode a Choice (as vLLM): the judge scores both verdicts afterwards."""

    decodes_choices = False


def test_a_verdict_decoded_in_the_pass_needs_no_scoring_pass(engine, tiny_tokenizer, tokens_fed):
    """In the pass, the judgments end on decoding steps (one token per row: the verdict's);
    with two passes a scoring forward over several tokens per row follows."""
    feeds = {}
    for name, judge_engine in (("in", engine), ("two", TwoPass(engine.model, tiny_tokenizer, batch_size=4))):
        with tokens_fed(engine.model) as fed:
            judge(judge_engine, tiny_tokenizer, "constrained", seed=3)
        feeds[name] = fed
    verdict = len(tiny_tokenizer.encode("\n\\boxed{-1}", add_special_tokens=False))
    assert all(n == rows for rows, n in feeds["in"][-verdict:])
    assert feeds["two"][-1][1] >= 3 * feeds["two"][-1][0]
    assert sum(n for _, n in feeds["in"]) < sum(n for _, n in feeds["two"])


def test_constrained_verdicts_reuse_the_reasoning_kv_within_the_budget(engine, tiny_tokenizer, tokens_fed):
    """Two passes (engines without `decodes_choices`): the verdict is scored after prompt +
    reasoning: with the KV kept from generation only the verdict tokens run again; without it
    (budget 0) everything runs; same verdicts either way."""
    config = engine.model.config
    per_token = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * 4
    )
    partial = per_token * 2.5 * 150  # judge prompts + reasoning: ~110-160 tokens -> about 2 of 6 rows kept
    runs = {}
    for budget in (float("inf"), 0, partial):
        limited = TwoPass(engine.model, tiny_tokenizer, batch_size=4, keep_bytes=budget)
        with tokens_fed(engine.model) as fed:
            rows = judge(limited, tiny_tokenizer, "constrained", seed=3)
        runs[budget] = (rows, max(n / r for r, n in fed[-2:]))  # the verdict scoring: tokens fed per row
    rows, scoring = runs[float("inf")]
    verdict_tokens = len(tiny_tokenizer.encode("\n\\boxed{-1}", add_special_tokens=False))
    assert scoring <= 1 + verdict_tokens  # the last prompt/reasoning token + the verdict
    assert runs[0][1] > 40  # the whole judge prompt again
    for other, _ in (runs[0], runs[partial]):  # a few rows kept, the others run again
        assert [(r["step_score"], r["response_ids"]) for r in other] == [
            (r["step_score"], r["response_ids"]) for r in rows
        ]
        for a, b in zip(other, rows):
            assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-5)


def test_the_engine_keeps_rows_up_to_its_byte_budget(engine, tiny_tokenizer):
    prompts = [[1, 2, 3] + [10 + k] * (20 + k) for k in range(6)]
    config = engine.model.config
    per_token = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * 4
    )
    for budget, kept in ((float("inf"), 6), (per_token * 60, 2), (per_token * 10, 0), (0, 0)):
        cache = PrefixCache()
        limited = TransformersEngine(engine.model, tiny_tokenizer, batch_size=4, keep_bytes=budget)
        limited.generate(prompts, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=0, prefix_cache=cache)
        assert len(cache.rows) == kept
        assert sum(k.nbytes + v.nbytes for _, k, v in cache.rows) <= budget
        assert all(k.shape[2] == len(t) >= 23 for t, k, _ in cache.rows)


@pytest.mark.parametrize("max_new_tokens", [1, 8])
def test_the_verdict_decoded_in_the_generation_pass_follows_the_models_probabilities(
    engine, tiny_tokenizer, max_new_tokens
):
    """The engine appends the verdict while decoding (no second scoring pass): judgment n picks 1
    iff its row's last uniform is below p("1") / (p("1") + p("-")) after prompt + reasoning +
    "\\n\\\\boxed{", as a teacher-forced pass computes them; an EOS gave way to the opener."""
    from rlanything.models.engines.decode import uniforms
    from rlanything.models.judge import verdict_choice

    choice = verdict_choice(tiny_tokenizer)
    rows = judge(engine, tiny_tokenizer, "constrained", seed=4, max_new_tokens=max_new_tokens)
    picked = set()
    for n, r in enumerate(rows):
        tail = len(choice.opener) + len(choice.options[r["step_score"]]) + len(choice.closer)
        reasoning = r["response_ids"][: len(r["response_ids"]) - tail]
        assert len(reasoning) <= max_new_tokens and not set(reasoning) & set(engine.eos_ids)
        assert r["response_ids"][len(reasoning) :] == choice.opener + choice.options[r["step_score"]] + choice.closer
        context = r["prompt_ids"] + reasoning
        first = [
            engine.score([context], [choice.opener + choice.options[v]], temperature=0.8)[0][len(choice.opener)]
            for v in (1, -1)
        ]
        p_one = math.exp(first[0]) / (math.exp(first[0]) + math.exp(first[1]))
        u = float(uniforms(4, n, max_new_tokens + 1)[-1])
        assert r["step_score"] == (1 if u < p_one else -1)
        picked.add(r["step_score"])
        scored = engine.score([r["prompt_ids"]], [r["response_ids"]], temperature=0.8)[0]
        assert scored == pytest.approx(r["logprobs"], abs=1e-4)


def test_the_verdict_rule_picks_the_first_option_whose_cumulative_probability_exceeds_u(tiny_tokenizer):
    """`Choice.pick`, the one rule of both paths: p(1) = 0.2 / (0.2 + 0.6) = 0.25."""
    import torch

    from rlanything.models.judge import verdict_choice

    choice = verdict_choice(tiny_tokenizer)
    for dtype in (torch.float32, torch.float64):  # the decoder's logits; the fallback's scores
        firsts = torch.tensor([0.2, 0.6], dtype=dtype).log()
        assert [choice.pick(firsts, u) for u in (0.0, 0.1, 0.2499, 0.2501, 0.9, 0.999999)] == [1, 1, 1, -1, -1, -1]
    three = Choice([0], {7: [1], 8: [2], 9: [3]}, [4])
    firsts = torch.tensor([0.1, 0.3, 0.1]).log()  # renormalised [0.2, 0.6, 0.2], cumulative [0.2, 0.8, 1.0]
    assert [three.pick(firsts, u) for u in (0.1, 0.5, 0.85)] == [7, 8, 9]


def test_the_two_pass_verdict_draws_with_the_same_rule_from_its_own_random_stream(engine, tiny_tokenizer):
    """Engines without `decodes_choices`: judgment n picks 1 iff the n-th draw of
    random.Random(seed) is below p("1") / (p("1") + p("-")) after prompt + reasoning + "\\n\\\\boxed{"."""
    import random

    from rlanything.models.judge import verdict_choice

    choice = verdict_choice(tiny_tokenizer)
    rows = judge(TwoPass(engine.model, tiny_tokenizer, batch_size=4), tiny_tokenizer, "constrained", seed=5)
    rng = random.Random(5)
    for r in rows:
        tail = len(choice.opener) + len(choice.options[r["step_score"]]) + len(choice.closer)
        context = r["prompt_ids"] + r["response_ids"][: len(r["response_ids"]) - tail]
        first = [
            engine.score([context], [choice.opener + choice.options[v]], temperature=0.8)[0][len(choice.opener)]
            for v in (1, -1)
        ]
        p_one = math.exp(first[0]) / (math.exp(first[0]) + math.exp(first[1]))
        assert r["step_score"] == (1 if rng.random() < p_one else -1)
        assert r["p_plus"] == pytest.approx(p_one, abs=1e-4)  # judgments.p_plus: the draw's probability


def test_the_chosen_tokens_are_the_reasoning_and_the_verdicts_first_token():
    """rm.train_forced_tokens false trains these only: opener [7, 8], options 1 -> [3] and
    -1 -> [4, 3], closer [9]; the model chose its reasoning and the option's first token."""
    from rlanything.models.judge import chosen_tokens

    choice = Choice([7, 8], {1: [3], -1: [4, 3]}, [9])
    assert chosen_tokens([11, 12, 7, 8, 4, 3, 9], -1, choice) == [True, True, False, False, True, False, False]
    assert chosen_tokens([7, 8, 3, 9], 1, choice) == [False, False, True, False]  # a direct verdict
    with pytest.raises(ValueError, match="does not end with the constrained verdict -1"):
        chosen_tokens([7, 8, 3, 9], -1, choice)
    with pytest.raises(ValueError, match="not a constrained judgment"):
        chosen_tokens([11, 3, 9], 1, choice)  # a free verdict has no appended opener
