"""The transformers engine on a tiny random model: ids, log-probs, seeds, EOS handling."""

import math

import pytest
import torch

from rlanything.models.engine import TransformersEngine, left_pad, response_logprobs
from rlanything.models.loading import load_model
from rlanything.models.prompts import policy_messages, render


@pytest.fixture(scope="module")
def engine(tiny_model_path, tiny_tokenizer):
    return TransformersEngine(load_model(tiny_model_path), tiny_tokenizer, batch_size=3)


def prompts(tokenizer, n=5):
    return [render(tokenizer, policy_messages("sys", [f"Calculate {i} + {i * 3}."], []))[1] for i in range(n)]


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_generations_have_ids_logprobs_and_text(engine, tiny_tokenizer):
    gens = engine.generate(prompts(tiny_tokenizer), max_new_tokens=12, temperature=1.0, top_p=1.0, seed=1)
    assert len(gens) == 5
    for g in gens:
        assert 1 <= len(g.token_ids) <= 12 and len(g.logprobs) == len(g.token_ids)
        assert all(lp <= 0 and math.isfinite(lp) for lp in g.logprobs)
        assert g.finish_reason in ("stop", "length")
        assert (g.finish_reason == "stop") == (g.token_ids[-1] in engine.eos_ids)
        assert g.text == tiny_tokenizer.decode(g.token_ids, skip_special_tokens=True)


def test_same_seed_same_samples_other_seed_differs(engine, tiny_tokenizer):
    kw = dict(max_new_tokens=10, temperature=1.0, top_p=1.0)
    a = engine.generate(prompts(tiny_tokenizer), seed=5, **kw)
    b = engine.generate(prompts(tiny_tokenizer), seed=5, **kw)
    c = engine.generate(prompts(tiny_tokenizer), seed=6, **kw)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_equal_a_teacher_forced_pass(engine, tiny_tokenizer, temperature):
    """PPO's first ratio must be 1: the trainer's forward reproduces the engine's log-probs."""
    ps = prompts(tiny_tokenizer)
    gens = engine.generate(ps, max_new_tokens=10, temperature=temperature, top_p=0.9, seed=3)
    seqs = [p + g.token_ids for p, g in zip(ps, gens)]
    lens = [len(g.token_ids) for g in gens]
    with torch.no_grad():
        logprobs, mask = response_logprobs(engine.model, seqs, lens, tiny_tokenizer.pad_token_id, temperature)
    for row, g in enumerate(gens):
        got = logprobs[row][mask[row]].tolist()
        assert got == pytest.approx(g.logprobs, abs=1e-4)
    scored = engine.score(ps, [g.token_ids for g in gens], temperature=temperature)
    for s, g in zip(scored, gens):
        assert s == pytest.approx(g.logprobs, abs=1e-4)


def test_low_temperature_concentrates(engine, tiny_tokenizer):
    ps = prompts(tiny_tokenizer, 2)
    cold = engine.generate(ps, max_new_tokens=6, temperature=0.05, top_p=1.0, seed=0)
    again = engine.generate(ps, max_new_tokens=6, temperature=0.05, top_p=1.0, seed=99)
    assert [g.token_ids for g in cold] == [g.token_ids for g in again]  # ~greedy whatever the seed
    assert all(lp > -0.5 for g in cold for lp in g.logprobs)


def test_repeated_prompts_share_one_prefill_and_sample_as_before(engine, tiny_tokenizer):
    """G rollouts of a task (m judgments of a step) repeat a prompt: its prefill runs once per
    distinct prompt, and the samples and log-probs are those of separate prefills."""

    class Separate(TransformersEngine):
        def _shared_prefill(self, ids, attn):
            return None

    ps = prompts(tiny_tokenizer, 2)
    batch = [ps[0], ps[1], ps[0], ps[0], ps[1], ps[1]]  # sorted by length into batches of 3
    separate = Separate(engine.model, tiny_tokenizer, batch_size=3)
    shapes = []
    hook = engine.model.register_forward_pre_hook(lambda m, args, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                                  with_kwargs=True)  # fmt: skip
    try:
        shared = engine.generate(batch, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=4)
    finally:
        hook.remove()
    width = max(map(len, ps))
    prefills = [s for s in shapes if s[1] > 1]
    assert prefills and all(s[0] < 3 and s[1] == width - 1 for s in prefills)  # distinct prompts only, all but the last token
    assert all(s[1] == 1 for s in shapes if s not in prefills)  # generate itself only decodes
    alone = separate.generate(batch, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=4)
    assert [g.token_ids for g in shared] == [g.token_ids for g in alone]
    for a, b in zip(shared, alone):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    scored = engine.score(batch, [g.token_ids for g in shared], temperature=1.0)
    for s, g in zip(scored, shared):
        assert s == pytest.approx(g.logprobs, abs=1e-4)
