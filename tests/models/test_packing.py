"""Prefix-tree packing: shared prompts run once, with the log-probs and gradients of padded rows."""

import random

import torch

from rlanything.models.engines.transformers_engine import response_logprobs
from rlanything.models.loading import load_model
from rlanything.models.training import packing
from rlanything.models.training.packing import PrefixTree, pack, packed_response_logprobs


def shared_batch(seed: int = 0):
    """3 prompts with 1-3 responses each; the second response of a prompt repeats the first's
    first two tokens, so the tree shares response tokens too."""
    rng = random.Random(seed)
    seqs, lens = [], []
    for _ in range(3):
        prompt = [rng.randrange(3, 200) for _ in range(rng.randrange(5, 30))]
        for k in range(rng.randrange(1, 4)):
            response = [rng.randrange(3, 200) for _ in range(rng.randrange(1, 12))]
            if k == 1:
                response = seqs[-1][len(prompt) : len(prompt) + 2] + response
            seqs.append(prompt + response)
            lens.append(len(response))
    return seqs, lens


def test_tree_of_hand_written_sequences():
    tree = PrefixTree.build([[5, 6, 7, 9], [5, 6, 8], [4]])
    assert tree.tokens == [5, 6, 7, 9, 8, 4]
    assert tree.parents == [-1, 0, 1, 2, 1, -1]
    assert tree.depths == [0, 1, 2, 3, 2, 0]
    assert tree.paths == [[0, 1, 2, 3], [0, 1, 4], [5]]
    seen = tree.ancestors(7).int().tolist()
    assert seen[3] == [1, 1, 1, 1, 0, 0, 0]  # 9 sees 5 6 7 and itself
    assert seen[4] == [1, 1, 0, 0, 1, 0, 0]  # 8 sees 5 6, not 7 or 9
    assert seen[5] == [0, 0, 0, 0, 0, 1, 0]  # a second root sees only itself
    assert seen[6] == [0, 0, 0, 0, 0, 0, 1]  # a pad column sees only itself


def test_long_rows_share_only_when_attention_stays_within_padded_rows(monkeypatch):
    monkeypatch.setattr(packing, "SHORT_ROW", 4)
    # 3 sequences of 10 tokens sharing 8: 8 + 3·2 = 14 nodes, 14² = 196 ≤ 3·10² = 300: one row
    prompt = list(range(8))
    trees, groups = pack([prompt + [20, 21], prompt + [22, 23], prompt + [24, 25]])
    assert groups == [[0, 1, 2]] and len(trees[0].tokens) == 14
    # nothing shared: 20 nodes, 20² = 400 > 2·10² = 200: a row each, as padding would
    trees, groups = pack([list(range(10)), list(range(10, 20))])
    assert groups == [[0], [1]]
    monkeypatch.setattr(packing, "SHORT_ROW", 20)  # short rows always share
    trees, groups = pack([list(range(10)), list(range(10, 20))])
    assert groups == [[0, 1]]


def test_logprobs_and_gradients_equal_padded_rows(tiny_model_path):
    model = load_model(tiny_model_path)
    model.train()
    seqs, lens = shared_batch()
    params = [p for p in model.parameters() if p.requires_grad]
    padded, mask = response_logprobs(model, seqs, lens, 0, 0.7)
    packed, packed_mask = packed_response_logprobs(model, seqs, lens, 0, 0.7)
    assert torch.equal(mask, packed_mask)
    assert torch.allclose(padded[mask], packed[mask], atol=1e-5)
    assert (packed[~mask] == 0).all()
    grads = torch.autograd.grad((padded * mask).sum(), params)
    packed_grads = torch.autograd.grad((packed * packed_mask).sum(), params)
    for a, b in zip(grads, packed_grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_each_distinct_prefix_is_fed_once(tiny_model_path):
    model = load_model(tiny_model_path)
    seqs, lens = shared_batch(1)
    fed = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, args, out: fed.append(args[0].shape))
    try:
        with torch.no_grad():
            packed_response_logprobs(model, seqs, lens, 0, 1.0)
    finally:
        hook.remove()
    trees, _ = pack(seqs)
    distinct = len({tuple(s[:k]) for s in seqs for k in range(1, len(s) + 1)})
    assert sum(len(t.tokens) for t in trees) == distinct < sum(map(len, seqs))
    assert fed == [torch.Size([len(trees), max(len(t.tokens) for t in trees)])]


def test_gradients_do_not_depend_on_the_thread_count(tiny_model_path):
    """Repeated sequences make a node's logits serve several response tokens; their gradient
    must be summed in a fixed order. (`logits[picked]` summed them with float atomics across
    threads, so a resumed run under load differed from an uninterrupted one in the last bits.)"""
    model = load_model(tiny_model_path)
    model.train()
    seqs, lens = shared_batch(2)
    seqs, lens = seqs * 4, lens * 4  # every response 4 times, as in a group of equal answers
    params = [p for p in model.parameters() if p.requires_grad]
    threads = torch.get_num_threads()
    grads = {}
    try:
        for n in (1, 4, 1, 4):
            torch.set_num_threads(n)
            packed, mask = packed_response_logprobs(model, seqs, lens, 0, 0.7)
            grads.setdefault(n, []).append(torch.autograd.grad((packed * mask).sum(), params))
    finally:
        torch.set_num_threads(threads)
    reference = grads[1][0]
    for got in grads[1][1:] + grads[4]:
        assert all(torch.equal(a, b) for a, b in zip(reference, got))


def test_an_eager_model_gets_the_mask_it_can_add(tiny_model_path):
    """Eager attention adds a 4D mask to its scores: the ancestor mask reaches it as 0 / dtype
    min (a bool mask added 1 to the seen scores and hid nothing: log-probs off by ~0.3)."""
    model = load_model(tiny_model_path)
    seqs, lens = shared_batch(3)
    with torch.no_grad():
        padded, mask = response_logprobs(model, seqs, lens, 0, 0.7)
        model.set_attn_implementation("eager")
        packed, _ = packed_response_logprobs(model, seqs, lens, 0, 0.7)
    assert model.config._attn_implementation == "eager"
    assert torch.allclose(padded[mask], packed[mask], atol=1e-5)
