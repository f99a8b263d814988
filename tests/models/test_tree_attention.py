"""Tree attention: packed rows attended segment by segment give the log-probs and gradients of
each sequence run alone."""

import random

import pytest
import torch
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

from rlanything.algo.losses import token_logprobs
from rlanything.models.loading import load_model
from rlanything.models.training import packing, tree_attention
from rlanything.models.training.packing import PrefixTree, pack, packed_response_logprobs
from rlanything.models.training.tree_attention import NAME, TreePlan, row_calls


def gqa_model() -> LlamaForCausalLM:
    """A random tiny Llama with 2 query heads per KV head (the tiny checkpoint has none)."""
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config).train()


def nested_batch(seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """Branches at several depths: a prompt, two continuations that branch again, a sequence
    that is a prefix of another, a repeated sequence, one unrelated sequence, and a long
    unrelated one (with SHORT_ROW small it gets a row of its own, of another width)."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, 300) for _ in range(n)]

    prompt, a, b = [5] + tokens(22), tokens(9), tokens(6)  # first tokens fix the sorted order
    seqs = [
        prompt + a + tokens(5),
        prompt + a + tokens(7),
        prompt + a + tokens(1),
        prompt + b,
        prompt + b + tokens(11),  # its prefix prompt + b is a sequence too
        prompt + tokens(3),
        prompt + a + tokens(2),
        [6] + tokens(13),  # unrelated, in the prompt's row
        [7] + tokens(74),  # unrelated, long: a row of its own
    ]
    seqs.append(list(seqs[0]))  # a repeat: the same path twice
    lens = [5, 7, 1, 6, 11, 3, 2, 4, 30, 5]
    return seqs, lens


def alone(model, seqs, lens, temperature):
    """Each sequence in a row of its own, plain causal SDPA -> its response log-probs."""
    out = []
    for seq, n in zip(seqs, lens):
        logits = model(input_ids=torch.tensor([seq])).logits[0, len(seq) - n - 1 : len(seq) - 1]
        out.append(token_logprobs(logits, torch.tensor(seq[len(seq) - n :]), temperature=temperature))
    return out


@pytest.fixture
def tree_everywhere(monkeypatch):
    """Tree attention on rows of any size, chunks of 4 queries (long segments in several calls,
    short siblings together), rows of at most 100 nodes unless sharing pays."""
    monkeypatch.setattr(tree_attention, "TREE_MIN_NODES", 0)
    monkeypatch.setattr(tree_attention, "CHUNK", 4)
    monkeypatch.setattr(packing, "SHORT_ROW", 100)
    calls = []
    inner = AttentionInterface._global_mapping[NAME]

    def counted(*args, tree_plan=None, **kwargs):
        calls.append(tree_plan is not None)
        return inner(*args, tree_plan=tree_plan, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, NAME, counted)

    def no_mask(self, width):
        raise AssertionError("the tree path built an (N, N) mask")

    monkeypatch.setattr(PrefixTree, "ancestors", no_mask)
    return calls


def compare(model, autocast, atol, grad_tol):
    seqs, lens = nested_batch()
    trees, _ = pack(seqs)
    assert len(trees) == 2 and len({len(t.tokens) for t in trees}) == 2  # two rows, padded
    params = [model.model.layers[0].self_attn.q_proj.weight, model.model.layers[-1].self_attn.k_proj.weight]
    params.append(model.model.layers[1].mlp.up_proj.weight)
    with autocast:
        reference = alone(model, seqs, lens, 0.7)
        packed, mask = packed_response_logprobs(model, seqs, lens, 0, 0.7)
    for row, (ref, n) in enumerate(zip(reference, lens)):
        assert torch.allclose(packed[row, packed.shape[1] - n :], ref, atol=atol), row
    assert (packed[~mask] == 0).all()
    grads = torch.autograd.grad(sum(r.sum() for r in reference), params)
    packed_grads = torch.autograd.grad((packed * mask).sum(), params)
    for a, b in zip(grads, packed_grads):
        assert (a - b).abs().max() <= grad_tol * a.abs().max()


def test_fp32_equals_each_sequence_alone(tree_everywhere):
    compare(gqa_model(), torch.autocast("cpu", enabled=False), atol=1e-5, grad_tol=1e-5)
    assert tree_everywhere == [True] * 3  # every layer went through the plan


def test_bf16_equals_each_sequence_alone(tree_everywhere):
    compare(gqa_model(), torch.autocast("cpu", dtype=torch.bfloat16), atol=0.1, grad_tol=0.05)
    assert tree_everywhere == [True] * 3


def test_tiny_checkpoint_takes_the_tree_path(tree_everywhere, tiny_model_path):
    model = load_model(tiny_model_path).train()
    compare(model, torch.autocast("cpu", enabled=False), atol=1e-5, grad_tol=1e-5)
    assert tree_everywhere == [True] * model.config.num_hidden_layers


def test_small_rows_and_other_attention_keep_the_mask_path(monkeypatch):
    seqs, lens = nested_batch()
    model = gqa_model()
    ran = []
    inner = AttentionInterface._global_mapping[NAME]
    monkeypatch.setitem(AttentionInterface._global_mapping, NAME, lambda *a, **k: ran.append(1) or inner(*a, **k))
    with torch.no_grad():
        masked, _ = packed_response_logprobs(model, seqs, lens, 0, 1.0)  # rows under TREE_MIN_NODES
        assert not ran
        monkeypatch.setattr(tree_attention, "TREE_MIN_NODES", 0)
        tree, _ = packed_response_logprobs(model, seqs, lens, 0, 1.0)
        assert len(ran) == 3 and torch.allclose(masked, tree, atol=1e-5)
        model.set_attn_implementation("eager")  # not what the mask path ran: left as it is
        packed_response_logprobs(model, seqs, lens, 0, 1.0)
    assert model.config._attn_implementation == "eager" and len(ran) == 3


def test_calls_see_exactly_each_nodes_ancestors(monkeypatch):
    """Random trees (branching anywhere, several roots): every node is the query of one call,
    whose keys hold all its ancestors, masked to exactly them."""
    rng = random.Random(1)
    for chunk in (1, 3, 256):
        monkeypatch.setattr(tree_attention, "CHUNK", chunk)
        parents = [-1]
        for node in range(1, 60):
            parents.append(rng.choice([node - 1, node - 1, rng.randrange(-1, node)]))
        seen = PrefixTree(parents=parents).ancestors(len(parents))
        queried = []
        for call in row_calls(0, parents):
            queries = torch.arange(len(parents))[call.queries]
            keys = torch.arange(len(parents))[call.keys]
            sub = seen[queries][:, keys]
            assert torch.equal(sub, call.mask if call.mask is not None else torch.ones_like(sub))
            assert torch.equal(sub.sum(1), seen[queries].sum(1))  # no ancestor left out
            queried += queries.tolist()
        assert sorted(queried) == list(range(len(parents)))
    assert TreePlan.build([parents], 64).order[60:].eq(60).all()  # pads: the zero column
