"""A generation call cut into shards: the layout both executors share (`run.shards`).

A row's numbers depend on its batch mates: the padding and KV layout of its decode batch change
the attention's summation order, so its logits move by ~1e-6 with them (models/engines/ray_engine.py).
The shard layout therefore decides a run's samples bit for bit, and the executor only decides
where the shards run. `run.executor: local` with `run.shards: N` plays the N shards one after
another in this process (`ShardedEngine`); `run.executor: ray` plays the same N shards on its
workers. Each shard keeps its own `PrefixCache` from call to call, here and on a worker, so the
two write the same files.

One condition: a shard's batches must be cut alike. An engine decodes `batch_size` rows at once,
fewer only when their KV cache would take over a quarter of the free memory
(`TransformersEngine.rows_at_once`); a process that short of memory batches differently, and its
samples then differ in the last bits.
"""

from __future__ import annotations

from collections.abc import Callable

from rlanything.models.engines.generation import Generation, GenerationEngine, PrefixCache


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous, balanced slices of n rows, empty ones left out.

    >>> shard_bounds(10, 3), shard_bounds(1, 2)
    ([(0, 3), (3, 6), (6, 10)], [(0, 1)])
    """
    bounds = [(n * k // shards, n * (k + 1) // shards) for k in range(shards)]
    return [(lo, hi) for lo, hi in bounds if hi > lo]


class ShardedEngine:
    """A `GenerationEngine` that plays each call as `shards` slices of its rows, in turn, on one
    inner engine: the batches a Ray run's workers decode (each row keeps its index in the whole
    call, `row_ids`, which picks its noise stream). The caller's `PrefixCache` stands for one
    cache per shard, kept here for its next call (as a worker keeps them), and gets their token
    counts. Each shard's cache holds up to the engine's KV budget."""

    def __init__(self, engine: GenerationEngine, shards: int):
        self.engine, self.shards = engine, shards
        self._caller: PrefixCache | None = None  # the caller whose shard caches are kept
        self._caches: list[PrefixCache] = []

    @property
    def eos_ids(self) -> list[int]:
        return self.engine.eos_ids

    @property
    def weights(self) -> str:
        return self.engine.weights

    @property
    def decodes_choices(self) -> bool:
        return self.engine.decodes_choices

    def _shard_caches(self, prefix_cache: PrefixCache | None) -> list[PrefixCache | None]:
        if prefix_cache is None:
            return [None] * self.shards
        if self._caller is not prefix_cache:  # a new caller: the last one's KV is not needed again
            self._caller, self._caches = prefix_cache, [PrefixCache() for _ in range(self.shards)]
        return self._caches

    def _each_shard(self, n: int, prefix_cache: PrefixCache | None, play: Callable) -> list:
        """`play(lo, hi, shard's cache)` for every shard of n rows, in order -> their results, one
        list; the caller's cache gets the shards' token counts."""
        caches, out = self._shard_caches(prefix_cache), []
        for (lo, hi), cache in zip(shard_bounds(n, self.shards), caches):
            before = (cache.prompt_tokens, cache.reused_tokens) if cache is not None else None
            out += play(lo, hi, cache)
            if before is not None:
                prefix_cache.prompt_tokens += cache.prompt_tokens - before[0]
                prefix_cache.reused_tokens += cache.reused_tokens - before[1]
        return out

    def generate(self, prompts, *, prefix_cache=None, row_ids=None, **kwargs) -> list[Generation]:
        ids = list(row_ids) if row_ids is not None else list(range(len(prompts)))
        return self._each_shard(
            len(prompts),
            prefix_cache,
            lambda lo, hi, cache: self.engine.generate(
                prompts[lo:hi], prefix_cache=cache, row_ids=ids[lo:hi], **kwargs
            ),
        )

    def score(self, prompts, continuations, *, temperature, prefix_cache=None) -> list[list[float]]:
        return self._each_shard(
            len(prompts),
            prefix_cache,
            lambda lo, hi, cache: self.engine.score(
                prompts[lo:hi], continuations[lo:hi], temperature=temperature, prefix_cache=cache
            ),
        )
