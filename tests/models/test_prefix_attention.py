"""Attention over a shared prompt prefix held once (models/engines/prefix_attention.py): by hand, against
SDPA over the concatenated keys, inside a model, and in the engine (same samples as without)."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

import rlanything.models.engines.transformers_engine as engine_module
from rlanything.models.engines.decode import positions
from rlanything.models.engines.generation import PrefixCache
from rlanything.models.engines.prefix_attention import NAME, SharedPrefix, attention, shared_prefix_attention
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.judge import verdict_choice
from rlanything.models.loading import load_model
from rlanything.models.prompts import policy_messages, render


class Layer:
    layer_idx = 0


def test_one_query_by_hand():
    # one head, d = 1, scale 1: prefix key 0 (value 2), own key ln 3 (value 6): weights 1/4 and
    # 3/4 -> 0.25 · 2 + 0.75 · 6 = 5
    prefix = SharedPrefix([torch.zeros(1, 1, 1)], [torch.full((1, 1, 1), 2.0)])
    key, value = torch.full((1, 1, 1, 1), math.log(3)), torch.full((1, 1, 1, 1), 6.0)
    out, _ = attention(Layer(), torch.ones(1, 1, 1, 1), key, value, None, scaling=1.0, shared_prefix=prefix)
    assert out.shape == (1, 1, 1, 1) and out.item() == pytest.approx(5.0)
    # the own key masked out: only the prefix is left
    masked = torch.zeros(1, 1, 1, 1, dtype=torch.bool)
    out, _ = attention(Layer(), torch.ones(1, 1, 1, 1), key, value, masked, scaling=1.0, shared_prefix=prefix)
    assert out.item() == pytest.approx(2.0)
    assert prefix.used == {0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("queries,mask", [(1, "bool"), (1, "additive"), (1, None), (4, "bool"), (4, None)])
def test_equals_sdpa_over_the_concatenated_keys(queries, mask, dtype):
    """(B, H, q, d) queries, 2 KV heads for 6 query heads (GQA), a 5-column prefix and 4 own
    columns (row 0 with its first column masked): SDPA over [prefix, own] with the prefix visible.
    bf16 takes the own scores as (K·qᵀ)ᵀ, the reference is fp32 SDPA on the same bf16 numbers."""
    torch.manual_seed(0)
    b, heads, kv, d, p, s = 2, 6, 2, 8, 5, max(4, queries)
    q = torch.randn(b, heads, queries, d).to(dtype)
    pk, pv = torch.randn(kv, p, d).to(dtype), torch.randn(kv, p, d).to(dtype)
    k, v = torch.randn(b, kv, s, d).to(dtype), torch.randn(b, kv, s, d).to(dtype)
    visible = torch.ones(b, 1, queries, s, dtype=torch.bool).tril(s - queries)  # causal, bottom-right
    if mask is not None:
        visible[0, :, :, 0] = False
    additive = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, -math.inf)
    given = {"bool": visible, "additive": additive, None: None}
    prefix = SharedPrefix([pk], [pv])
    got, _ = attention(Layer(), q, k, v, given[mask], scaling=0.3, shared_prefix=prefix)
    keys = torch.cat([pk.expand(b, -1, -1, -1), k], 2).repeat_interleave(heads // kv, 1).float()
    values = torch.cat([pv.expand(b, -1, -1, -1), v], 2).repeat_interleave(heads // kv, 1).float()
    full = torch.cat([torch.ones(b, 1, queries, p, dtype=torch.bool), visible], -1)
    expected = F.scaled_dot_product_attention(q.float(), keys, values, attn_mask=full, scale=0.3).transpose(1, 2)
    assert got.shape == (b, queries, heads, d) and got.dtype == dtype
    tolerance = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}
    torch.testing.assert_close(got.float(), expected, **tolerance)


def test_without_a_prefix_it_is_sdpa():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 3, 8), torch.randn(2, 2, 3, 8)

    class Module(Layer):
        num_key_value_groups = 2
        is_causal = True

    got, _ = attention(Module(), q, k, v, None, scaling=0.5)
    expected = F.scaled_dot_product_attention(q, k, v, scale=0.5, is_causal=True, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(got, expected)


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


def test_a_model_with_the_prefix_held_once_gives_the_logits_of_whole_sequences(model):
    """Rows = prefix + own tokens (one row left-padded): logits of the own tokens as if each row
    had been fed whole; the implementation is the model's own again after the block."""
    torch.manual_seed(2)
    vocab = model.config.vocab_size
    prefix, own = torch.randint(3, vocab, (1, 7)), torch.randint(3, vocab, (3, 5))
    attn = torch.ones(3, 5, dtype=torch.long)
    attn[1, :2] = 0
    whole_attn = torch.cat([torch.ones(3, 7, dtype=torch.long), attn], 1)
    whole_ids = torch.cat([prefix.expand(3, -1), own], 1)
    with torch.no_grad():
        expected = model(input_ids=whole_ids, attention_mask=whole_attn, position_ids=positions(whole_attn)).logits
        with shared_prefix_attention(model) as switched:
            assert switched and model.config._attn_implementation == NAME
            cache = DynamicCache(config=model.config)
            model(input_ids=prefix, cache=cache, use_cache=True)
            shared = SharedPrefix([x.keys[0] for x in cache.layers], [x.values[0] for x in cache.layers])
            got = model(input_ids=own, attention_mask=attn, position_ids=positions(attn) + 7, shared_prefix=shared)
            shared.check()  # every layer read the prefix
        assert model.config._attn_implementation == "sdpa"
    real = attn.bool()
    torch.testing.assert_close(got.logits[real], expected[:, 7:][real], atol=1e-4, rtol=1e-4)


def test_a_model_that_drops_the_prefix_fails_loudly(model):
    shared = SharedPrefix([torch.zeros(1, 1, 1)] * model.config.num_hidden_layers, [torch.zeros(1, 1, 1)] * 2)
    with torch.no_grad():
        model(input_ids=torch.ones(1, 3, dtype=torch.long), shared_prefix=shared)  # SDPA: keyword unused
    with pytest.raises(RuntimeError, match="ignored the shared prefix"):
        shared.check()
    with pytest.raises(ValueError), shared_prefix_attention(model):
        raise ValueError
    assert model.config._attn_implementation == "sdpa"  # restored on the way out of an error too


def chat(tokenizer, text):
    return render(tokenizer, policy_messages("You are a careful calculator. Answer in \\boxed{}.", [text], []))[1]


@pytest.mark.parametrize("choice", [False, True])
def test_the_engine_samples_as_without_a_shared_prefix(model, tiny_tokenizer, tokens_fed, monkeypatch, choice):
    """Prompts sharing their system prompt, some repeated (a tree prefill past the prefix), in two
    turns (the second reusing the first's rows past the prefix): the same tokens and log-probs
    as with the prefix inside every row, and the prefix fed once per call."""
    engine = TransformersEngine(model, tiny_tokenizer, batch_size=3)
    first = [chat(tiny_tokenizer, f"Calculate {i} + {2 * i}.") for i in (1, 2, 2, 3, 11)]
    shared = min(next(n for n in range(len(p)) if p[n] != first[0][n]) for p in first[1:] if p != first[0])
    assert shared >= engine_module.MIN_SHARED
    second = [p + tiny_tokenizer.encode(" ok, next: 1 + 1.", add_special_tokens=False) for p in first]
    opts = dict(max_new_tokens=6, temperature=1.0, top_p=1.0)
    if choice:  # the RM's constrained verdict, decoded in the pass
        opts["choice"] = verdict_choice(tiny_tokenizer)

    def turns():
        cache, out = PrefixCache(), []
        for seed, ps in enumerate((first, second)):
            out.append(engine.generate(ps, seed=seed, prefix_cache=cache, **opts))
        return out, cache.reused_tokens

    with tokens_fed(model) as fed:
        held_once, reused = turns()
    assert fed[0] == (1, shared) and reused > 0  # the prefix's own forward opens the call
    monkeypatch.setattr(engine_module, "MIN_SHARED", 10**9)
    in_every_row, _ = turns()
    for got, expected in zip(held_once, in_every_row):
        assert [g.token_ids for g in got] == [g.token_ids for g in expected]
        assert [g.choice for g in got] == [g.choice for g in expected]
        for a, b in zip(got, expected):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_a_model_that_cannot_switch_keeps_its_attention():
    class Plain(torch.nn.Module):  # not a transformers PreTrainedModel
        config = type("Config", (), {"_attn_implementation": "sdpa"})()

    with shared_prefix_attention(Plain()) as switched:
        assert not switched


@pytest.mark.parametrize("mask", ["bool", None])
def test_long_forwards_go_in_chunks_of_queries_with_the_same_result(monkeypatch, mask):
    """An admission forward's scores (B, H, q, P + S) past SCORE_BYTES: the queries go in chunks
    (here 96 bytes: one query row of 2·6·(5+7)·4 bytes is 576, so a chunk of 1), each chunk with
    its rows of the mask, and the output equals the one-piece forward."""
    import rlanything.models.engines.prefix_attention as prefix_attention

    torch.manual_seed(1)
    b, heads, kv, d, p, s = 2, 6, 2, 8, 5, 7
    q, k, v = torch.randn(b, heads, s, d), torch.randn(b, kv, s, d), torch.randn(b, kv, s, d)
    visible = torch.ones(b, 1, s, s, dtype=torch.bool).tril()
    visible[1, :, :, :2] = False  # row 1 left-padded by two columns
    visible[1, :, :2, :2] = torch.eye(2, dtype=torch.bool)  # its pad queries see themselves
    prefix = SharedPrefix([torch.randn(kv, p, d)], [torch.randn(kv, p, d)])
    given = visible if mask else None
    whole, _ = attention(Layer(), q, k, v, given, scaling=0.3, shared_prefix=prefix)
    calls = []
    inner = prefix_attention._prefix_attention
    monkeypatch.setattr(prefix_attention, "_prefix_attention", lambda *a: calls.append(1) or inner(*a))
    monkeypatch.setattr(prefix_attention, "SCORE_BYTES", 96)
    chunked, _ = attention(Layer(), q, k, v, given, scaling=0.3, shared_prefix=prefix)
    assert len(calls) == s  # one query a chunk
    assert torch.allclose(whole, chunked, atol=1e-6)
