"""The transformers engine on a tiny random model: ids, log-probs, seeds, EOS handling."""

import math

import pytest
import torch

from rlanything import memory
from rlanything.models.engines.generation import PrefixCache, left_pad
from rlanything.models.engines.kv_planner import KvPlanner
from rlanything.models.engines.transformers_engine import MIN_SHARED, TransformersEngine, response_logprobs
from rlanything.models.judge import verdict_choice
from rlanything.models.loading import load_model
from rlanything.models.prompts import policy_messages, render


@pytest.fixture(scope="module")
def engine(tiny_model_path, tiny_tokenizer):
    return TransformersEngine(load_model(tiny_model_path), tiny_tokenizer, batch_size=3)


def prompts(tokenizer, n=5):
    return [render(tokenizer, policy_messages("sys", [f"Calculate {i} + {i * 3}."], []))[1] for i in range(n)]


def shared_prefix(ps):
    """The engine's SharedPrefix length for a call's prompts: their common beginning, all but
    one token of the shortest at most, 0 below MIN_SHARED."""
    n, shortest = 0, min(map(len, ps))
    while n < shortest - 1 and len({p[n] for p in ps}) == 1:
        n += 1
    return n if n >= MIN_SHARED else 0


def assert_same_samples(got, expected):
    """Same tokens, log-probs equal up to float noise (a different but equivalent computation)."""
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    for a, b in zip(got, expected):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


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
    """G rollouts of a task (m judgments of a step) repeat a prompt and all prompts share their
    instructions: the prefill runs each distinct prefix once (one forward over the batch's
    prefix tree, past the call's shared prefix, which its own forward runs first), and the
    samples and log-probs are those of separate prefills."""

    class Separate(KvPlanner):
        def tree_prefill(self, trees, groups, width, prefix=None):
            return None

    ps = prompts(tiny_tokenizer, 2)
    batch = [ps[0], ps[1], ps[0], ps[0], ps[1], ps[1]]  # batches of 3: both prompts in each
    separate = TransformersEngine(engine.model, tiny_tokenizer, batch_size=3)
    separate.kv = Separate(engine.model, tiny_tokenizer.pad_token_id)
    shapes = []
    hook = engine.model.register_forward_pre_hook(
        lambda m, args, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        shared = engine.generate(batch, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=4)
    finally:
        hook.remove()
    common = shared_prefix(ps)
    assert common > 0  # the chat template and the system prompt
    # prefixes of all but the last token, past the shared prefix: fewer than a batch's 3 rows hold
    distinct = len({tuple(p[common:k]) for p in ps for k in range(common + 1, len(p))})
    assert distinct < 3 * (len(ps[0]) - 1 - common)
    prefills = [s for s in shapes if s[1] > 1]
    assert prefills == [(1, common), (1, distinct), (1, distinct)]  # one tree per batch, each prefix once
    assert all(s[1] == 1 for s in shapes if s not in prefills)  # generate itself only decodes
    assert_same_samples(shared, separate.generate(batch, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=4))
    scored = engine.score(batch, [g.token_ids for g in shared], temperature=1.0)
    for s, g in zip(scored, shared):
        assert s == pytest.approx(g.logprobs, abs=1e-4)


@pytest.fixture(params=["unbounded", "budget"])
def budget(request):
    """The process's memory budget for a test: none (library use), or a run's default (half the
    machine), under which each admission asks the budget and a call keeps at most a quarter of
    it. An engine built without a `keep_bytes` once reserved the whole budget there, and kept
    nothing."""
    if request.param == "budget":
        memory.set_budget(None)
    yield request.param
    memory._budget[0] = float("inf")


def test_a_turn_reuses_the_kv_of_the_previous_turn_and_samples_as_without(engine, tiny_tokenizer, tokens_fed, budget):
    """Multi-turn rollouts: turn t's prompt extends turn t-1's prompt + reply, so only the new
    tokens are prefilled; samples and log-probs are those of a full prefill, with or without a
    memory budget."""
    observations = [[f"Calculate {i} + {i * 3}."] for i in range(5)]
    responses: list[list[str]] = [[] for _ in range(5)]
    cache, before = PrefixCache(), None
    kw = dict(max_new_tokens=8, temperature=1.0, top_p=1.0)
    for turn in range(3):
        ps = [render(tiny_tokenizer, policy_messages("sys", observations[e], responses[e]))[1] for e in range(5)]
        matched = cache.match(ps)
        if before is None:
            assert all(k == 0 for _, k in matched)
        else:  # each prompt reuses at least its own previous prompt, from the row that holds it
            for p, b, (row, k) in zip(ps, before, matched):
                assert k >= len(b) and cache.rows[row][0][:k] == p[:k]
        counted = cache.prompt_tokens, cache.reused_tokens
        with tokens_fed(engine.model) as fed:
            kept = engine.generate(ps, seed=turn, prefix_cache=cache, **kw)
        assert cache.prompt_tokens - counted[0] == sum(map(len, ps))
        reused = cache.reused_tokens - counted[1]
        assert reused == 0 or sum(map(len, ps)) - len(ps) >= reused >= sum(k for _, k in matched)
        # the engine feeds whichever costs fewer columns: the un-reused tokens on top of kept
        # rows (padded to the longest) or the prompts' prefix tree; never a full prefill, never
        # less than the prefixes no kept row holds
        shared = shared_prefix(ps)  # its own forward opens the call; reuse and trees start past it
        padded = shared + len(ps) * max(len(p) - max(k, shared) for p, (_, k) in zip(ps, matched))
        unseen = len({tuple(p[:j]) for p, (_, k) in zip(ps, matched) for j in range(k + 1, len(p) + 1)})
        assert not shared or fed[0] == (1, shared)
        fed = sum(n for _, n in fed)
        decode = len(ps) * (kw["max_new_tokens"] - 1)  # one per row per decode step
        assert unseen <= fed <= min(padded, sum(map(len, ps))) + decode
        assert turn == 0 or reused > 0  # this history grows by a few tokens a turn: reuse wins
        assert_same_samples(kept, engine.generate(ps, seed=turn, **kw))
        scored = engine.score(ps, [g.token_ids for g in kept], temperature=1.0)
        for s, g in zip(scored, kept):
            assert s == pytest.approx(g.logprobs, abs=1e-4)
        # kept: this call's prompts + replies, each but maybe its last token (sampled last, never fed)
        assert len(cache.rows) == len(ps)
        for tokens, keys, values in cache.rows:
            whole = next(p + g.token_ids for p, g in zip(ps, kept) if (p + g.token_ids)[: len(tokens)] == tokens)
            assert len(tokens) >= len(whole) - 1 and keys.shape[2] == values.shape[2] == len(tokens)
        before = ps
        for e, g in enumerate(kept):
            responses[e].append(g.text)
            observations[e].append("ok, next.")


def test_prefix_cache_match_finds_the_longest_common_prefix():
    layers, heads, dim = 2, 1, 4
    kv = lambda n: torch.zeros(layers, heads, n, dim)  # noqa: E731
    cache = PrefixCache([([1, 2, 3, 4], kv(4), kv(4)), ([1, 2, 9], kv(3), kv(3))])
    assert cache.match([[1, 2, 3, 4, 5], [1, 2, 9, 9], [7, 1], [1, 2, 3]]) == [(0, 4), (1, 3), (0, 0), (0, 2)]
    # the last: 3 tokens match row 0, capped at len - 1 so one token is left to feed
    assert PrefixCache().match([[1, 2]]) == [(0, 0)]


def test_a_later_batch_reuses_the_kv_of_an_earlier_batch_of_the_same_call(engine, tiny_tokenizer, tokens_fed):
    """The RM judges step k and step k+1 of a trajectory in one call: step k+1's prompt repeats
    step k's history. Batches run shortest first, so the longer prompt reuses the shorter's KV."""
    short = prompts(tiny_tokenizer, 1)[0]
    long = short + tiny_tokenizer.encode(" and then some more words to read", add_special_tokens=False)
    one_by_one = TransformersEngine(engine.model, tiny_tokenizer, batch_size=1)
    kw = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, seed=2)
    with tokens_fed(engine.model) as fed:
        kept = one_by_one.generate([long, short], prefix_cache=PrefixCache(), **kw)
    first_forwards = [n for rows, n in fed if n > 1]  # prefills (then 1-token decode steps)
    # the prompts' shared prefix (all of the short one but its last token, fed by its admission),
    # then the long prompt's extension only
    assert shared_prefix([long, short]) == len(short) - 1
    assert first_forwards == [len(short) - 1, len(long) - len(short)]
    assert_same_samples(kept, one_by_one.generate([long, short], **kw))


def test_finish_cuts_after_the_first_eos_and_keeps_an_engines_own_reason(tiny_tokenizer):
    from rlanything.models.engines.generation import eos_ids, finish

    eos = eos_ids([2, 7], tiny_tokenizer)
    assert eos == sorted({2, 7, tiny_tokenizer.eos_token_id})
    assert eos_ids(None, tiny_tokenizer) == [tiny_tokenizer.eos_token_id]
    stopped = finish([5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4], eos, tiny_tokenizer, reason="length")
    assert (stopped.token_ids, stopped.logprobs, stopped.finish_reason) == ([5, 6, 7], [-0.1, -0.2, -0.3], "stop")
    assert finish([5, 6], [-0.1, -0.2], eos, tiny_tokenizer).finish_reason == "length"  # max_new_tokens
    assert finish([5, 6], [-0.1, -0.2], eos, tiny_tokenizer, reason="abort").finish_reason == "abort"  # vLLM's own
    assert finish([5, 6], [-0.1, -0.2], eos, tiny_tokenizer).text == tiny_tokenizer.decode(
        [5, 6], skip_special_tokens=True
    )


def test_sliding_window_models_decode_in_fixed_batches_with_the_same_logprobs(tiny_model_path, tiny_tokenizer):
    """Caches with sliding-window layers cannot be rebuilt row by row: `model.generate` in fixed
    batches (torch's seed per batch); log-probs still those of a teacher-forced pass."""
    fixed = TransformersEngine(load_model(tiny_model_path), tiny_tokenizer, batch_size=2)
    fixed.continuous = False  # what a sliding-window config sets (decode.full_attention)
    assert not fixed.decodes_choices
    ps = prompts(tiny_tokenizer)
    with pytest.raises(ValueError, match="Choice"):
        fixed.generate(ps, max_new_tokens=6, temperature=0.7, top_p=1.0, seed=2, choice=verdict_choice(tiny_tokenizer))
    gens = fixed.generate(ps, max_new_tokens=6, temperature=0.7, top_p=1.0, seed=2)
    again = fixed.generate(ps, max_new_tokens=6, temperature=0.7, top_p=1.0, seed=2)
    assert [g.token_ids for g in gens] == [g.token_ids for g in again]
    scored = fixed.score(ps, [g.token_ids for g in gens], temperature=0.7)
    for s, g in zip(scored, gens):
        assert 1 <= len(g.token_ids) <= 6 and s == pytest.approx(g.logprobs, abs=1e-4)
