"""`ShardedEngine`: a call cut into slices played in turn, each row on its own noise stream and
each shard with its own prefix cache (the Ray executor's layout, run locally)."""

import numpy as np
import pytest

from rlanything.models.engines.generation import PrefixCache
from rlanything.models.engines.shards import ShardedEngine, shard_bounds
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.loading import load_model

SAMPLE = dict(max_new_tokens=6, temperature=1.0, top_p=1.0, seed=5)


@pytest.fixture(scope="module")
def engine(tiny_model_path, tiny_tokenizer):
    return TransformersEngine(load_model(tiny_model_path), tiny_tokenizer, batch_size=4)


def prompts(n: int) -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [rng.integers(5, 300, size=int(rng.integers(4, 14))).tolist() for _ in range(n)]


def test_shard_bounds_cover_every_row_once():
    for n, k in [(10, 3), (7, 2), (2, 5), (0, 2)]:
        bounds = shard_bounds(n, k)
        assert [i for lo, hi in bounds for i in range(lo, hi)] == list(range(n))
        assert len(bounds) == min(n, k) and max((hi - lo for lo, hi in bounds), default=0) <= -(-n // k)


def test_one_shard_is_the_engine_itself(engine):
    rows = prompts(5)
    plain = engine.generate(rows, **SAMPLE)
    one = ShardedEngine(engine, 1).generate(rows, **SAMPLE)
    assert [(g.token_ids, g.logprobs) for g in one] == [(g.token_ids, g.logprobs) for g in plain]


def test_shards_draw_each_rows_noise_and_keep_a_cache_each(engine):
    """3 shards of 7 rows: the same tokens as one call (each row's noise stream is its index in
    the whole call), log-probs to float rounding. The caller's cache gets the shards' token
    counts; its second call reuses the first's KV, kept per shard."""
    rows = prompts(7)
    plain = engine.generate(rows, **SAMPLE)
    sharded, cache = ShardedEngine(engine, 3), PrefixCache()
    first = sharded.generate(rows, prefix_cache=cache, **SAMPLE)
    assert [g.token_ids for g in first] == [g.token_ids for g in plain]
    np.testing.assert_allclose(
        np.concatenate([g.logprobs for g in first]), np.concatenate([g.logprobs for g in plain]), atol=1e-5
    )
    assert cache.prompt_tokens == sum(map(len, rows)) and cache.reused_tokens == 0
    assert not cache.rows  # the KV stays with the shards
    turn2 = [p + g.token_ids + [9] for p, g in zip(rows, first)]
    sharded.generate(turn2, prefix_cache=cache, **SAMPLE)
    assert cache.prompt_tokens == sum(map(len, rows)) + sum(map(len, turn2))
    assert cache.reused_tokens >= sum(len(p) + len(g.token_ids) for p, g in zip(rows, first)) - len(rows)
    other = PrefixCache()  # a new caller: the shards start empty
    sharded.generate(turn2, prefix_cache=other, **SAMPLE)
    assert other.reused_tokens == 0
