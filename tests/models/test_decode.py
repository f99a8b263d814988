"""Continuous batching (models/engines/decode.py): the sampling rule by hand, the seed rule replayed from a
teacher-forced pass, samples independent of the batch, rows refilled as others end."""

import math

import pytest
import torch

from rlanything.models.engines.decode import Decoder, GrowingLayer, sample, uniforms
from rlanything.models.engines.generation import left_pad
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.loading import load_model
from rlanything.models.prompts import policy_messages, render


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


def prompts(tokenizer, n=5):
    # different lengths: rows join and end at different steps
    return [
        render(tokenizer, policy_messages("sys", [f"Calculate {i} + {i * 3}." + " again" * i], []))[1] for i in range(n)
    ]


def test_sample_picks_the_first_token_whose_cumulative_probability_exceeds_u():
    logits = torch.tensor([[0.5, 0.2, 0.3]]).log()
    tokens, logprobs = sample(logits, torch.tensor([0.6]), temperature=1.0, top_p=1.0)
    assert tokens.tolist() == [1] and logprobs.tolist() == pytest.approx([math.log(0.2)])  # cdf 0.5 0.7 1.0
    # nucleus at 0.7: tokens 0 (0.5) and 2 (0.3), cdf 0.5 0.8; u·0.8 = 0.48 -> token 0
    tokens, logprobs = sample(logits, torch.tensor([0.6]), temperature=1.0, top_p=0.7)
    assert tokens.tolist() == [0] and logprobs.tolist() == pytest.approx([math.log(0.5)])  # no truncation
    tokens, _ = sample(logits, torch.tensor([0.7]), temperature=1.0, top_p=0.7)  # 0.56 > 0.5 -> token 2
    assert tokens.tolist() == [2]
    # T = 0.5 squares the probabilities: 0.25, 0.04, 0.09 of 0.38, cdf 0.658 0.763 1.0; the
    # log-prob is that distribution's
    tokens, logprobs = sample(logits, torch.tensor([0.6]), temperature=0.5, top_p=1.0)
    assert tokens.tolist() == [0] and logprobs.tolist() == pytest.approx([math.log(0.25 / 0.38)], rel=1e-5)
    tokens, _ = sample(logits, torch.tensor([0.7]), temperature=0.5, top_p=1.0)
    assert tokens.tolist() == [1]
    # T = 0: argmax, log-prob at T = 1
    tokens, logprobs = sample(logits, torch.tensor([0.99]), temperature=0.0, top_p=1.0)
    assert tokens.tolist() == [0] and logprobs.tolist() == pytest.approx([math.log(0.5)])
    # a zero-probability token is never picked, even at u = 0
    tokens, _ = sample(torch.tensor([[-math.inf, 0.0, 0.0]]), torch.tensor([0.0]), temperature=1.0, top_p=1.0)
    assert tokens.tolist() == [1]


def test_a_growing_layer_returns_what_concatenation_would():
    layer = GrowingLayer(reserve=2)
    parts = [torch.randn(2, 3, n, 4) for n in (3, 1, 1, 1)]  # past the reserve: it grows
    for k in range(len(parts)):
        keys, values = layer.update(parts[k], -parts[k])
        assert torch.equal(keys, torch.cat(parts[: k + 1], 2)) and torch.equal(values, -keys)
    assert layer.get_seq_length() == 6


def cdf_interval(logits: torch.Tensor, token: int, temperature: float, top_p: float) -> tuple[float, float]:
    """Where `token` lies on the unit interval that `sample` maps a uniform onto (row of 1)."""
    probs = torch.softmax(logits.float() / temperature, -1)
    order = torch.arange(len(probs))
    if top_p < 1.0:
        probs, order = probs.sort(descending=True)
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0.0)
    cdf = probs.cumsum(-1) / probs.sum()
    at = int((order == token).nonzero())
    return float(cdf[at] - probs[at] / probs.sum()), float(cdf[at])


@pytest.mark.parametrize("temperature,top_p", [(0.8, 1.0), (1.0, 0.9)])
def test_the_seed_rule_replays_every_sample_from_a_teacher_forced_pass(model, tiny_tokenizer, temperature, top_p):
    """Row i of a call samples with `uniforms(seed, i, ·)`: the documented rule, not an accident
    of the engine's batching, decides every token.

    The teacher-forced pass computes the logits in another order than cached decoding, so they
    differ in the last bits. The random tiny model's distribution is nearly flat over 49,152
    tokens (~2e-5 each, near-ties everywhere in the top-p sort), so such a difference can hand
    the uniform to a neighbouring token: seen once on the CI's CPU. A replaced token must then
    lie within 1e-4 of the uniform on the teacher-forced CDF; another noise stream or another
    rule would miss by ~0.3 on average, and at most 2 of the 16 tokens may be replaced."""
    engine = TransformersEngine(model, tiny_tokenizer, batch_size=2)
    ps = prompts(tiny_tokenizer)
    gens = engine.generate(ps, max_new_tokens=8, temperature=temperature, top_p=top_p, seed=11)
    replaced = 0
    for i, (p, g) in enumerate(zip(ps, gens)):
        ids, attn = left_pad([p + g.token_ids], tiny_tokenizer.pad_token_id)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attn).logits[0, len(p) - 1 : -1]  # (n, V)
        u = uniforms(11, i, len(g.token_ids))
        tokens, _ = sample(logits, u, temperature, top_p)
        logprobs = torch.log_softmax(logits.float() / temperature, -1).gather(-1, torch.tensor(g.token_ids)[:, None])
        for k, (want, got) in enumerate(zip(tokens.tolist(), g.token_ids)):
            if want != got:
                replaced += 1
                low, high = cdf_interval(logits[k], got, temperature, top_p)
                assert low - 1e-4 <= float(u[k]) <= high + 1e-4, (i, k, low, high, float(u[k]))
        assert logprobs.squeeze(-1).tolist() == pytest.approx(g.logprobs, abs=1e-5)
    assert replaced <= 2


def test_samples_do_not_depend_on_how_many_rows_decode_together(model, tiny_tokenizer):
    ps = prompts(tiny_tokenizer, 6)
    kw = dict(max_new_tokens=10, temperature=1.0, top_p=1.0, seed=3)
    runs = [TransformersEngine(model, tiny_tokenizer, batch_size=b).generate(ps, **kw) for b in (1, 2, 6)]
    for other in runs[1:]:
        assert [g.token_ids for g in other] == [g.token_ids for g in runs[0]]
        for a, b in zip(other, runs[0]):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_a_row_that_ends_is_refilled_by_the_next_prompt(model, tiny_tokenizer, monkeypatch):
    """With many end-of-turn ids rows end at different steps; the decode never runs more than
    `batch_size` rows, admits prompts between decoding steps, and needs fewer forwards than fixed
    batches (each decoding until its longest row ends) would."""
    engine = TransformersEngine(model, tiny_tokenizer, batch_size=2)
    engine.eos_ids = list(range(0, tiny_tokenizer.vocab_size, 9))  # ~1 in 9 sampled tokens ends a row
    ps = prompts(tiny_tokenizer, 6)
    joined = []  # (rows in flight, rows joining) per admission
    admit = Decoder.admit
    monkeypatch.setattr(
        Decoder, "admit", lambda self, idx, *a: joined.append((self.live, len(idx))) or admit(self, idx, *a)
    )
    shapes = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        gens = engine.generate(ps, max_new_tokens=12, temperature=1.0, top_p=1.0, seed=5)
    finally:
        hook.remove()
    lengths = [len(g.token_ids) for g in gens]
    assert len(set(lengths)) > 1 and any(g.finish_reason == "stop" for g in gens)
    assert max(rows for rows, _ in shapes) <= 2
    assert any(live > 0 for live, _ in joined) and sum(n for _, n in joined) == 6  # joined while a row decoded
    by_length = sorted(range(6), key=lambda i: len(ps[i]))
    fixed = sum(max(lengths[i] for i in by_length[b : b + 2]) for b in range(0, 6, 2))
    assert len(shapes) < fixed  # fixed batches: a prefill and (longest - 1) decode steps each, at least
    reference = TransformersEngine(model, tiny_tokenizer, batch_size=6)
    reference.eos_ids = engine.eos_ids
    again = reference.generate(ps, max_new_tokens=12, temperature=1.0, top_p=1.0, seed=5)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]


def test_rows_at_once_is_the_batch_size_unless_memory_is_short(model, tiny_tokenizer):
    import psutil

    engine = TransformersEngine(model, tiny_tokenizer, batch_size=7)
    assert engine.rows_at_once(100) == 7
    huge = TransformersEngine(model, tiny_tokenizer, batch_size=10**12)
    rows = huge.rows_at_once(1000)
    c = model.config
    dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per_row = 2 * c.num_hidden_layers * c.num_key_value_heads * dim * 4 * 1000
    per_row += 16 * c.vocab_size
    assert 1 <= rows <= psutil.virtual_memory().available / 4 / per_row * 1.1
