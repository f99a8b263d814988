"""Where the KV of a batch's prompts comes from before the transformers engine decodes or scores
them (models/engines/transformers_engine.py): rows a `PrefixCache` kept, one forward over the prompts' prefix trees, or
nothing (the decoder's admission forward, or the scoring forward, feeds the prompts whole).

Multi-turn prompts extend the rows kept from the last turn, the RM's judgment of step k+1 repeats
the history it judged at step k, the G rollouts of a problem and the m judgments of a step repeat
their prompt: each source saves a different kind of repeat, and `kv_source` (the one cost rule)
picks the source that feeds the fewest tokens. `KvPlanner` builds the KV it picks and keeps the
ended rows a `PrefixCache` holds for the next call, within a byte budget.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from rlanything.models.engines.decode import Decoder
from rlanything.models.engines.generation import PrefixCache, left_pad
from rlanything.models.engines.prefix_attention import SharedPrefix, forward
from rlanything.models.footprint import kv_bytes_per_token
from rlanything.models.training.packing import PrefixTree, pack, tree_inputs


def kv_size(rows: list) -> int:
    """Bytes of the keys and values of kept rows [(tokens, keys, values)]."""
    return sum(k.nbytes + v.nbytes for _, k, v in rows)


def padded_tokens(seqs: list[list[int]], reused: list[int], start: int = 0) -> int:
    """Tokens a left-padded forward over `seqs` feeds when row n's first max(reused[n], start)
    tokens are already in the cache: rows × the longest part left.
    [[1, 2, 3, 4], [1, 2, 3]], reused [3, 0] -> 2 × max(1, 3) = 6."""
    return len(seqs) * max(len(s) - max(k, start) for s, k in zip(seqs, reused))


def tree_tokens(trees: list[PrefixTree]) -> int:
    """Tokens one forward over packed prefix trees feeds: trees × the largest tree's nodes."""
    return len(trees) * max(len(t.tokens) for t in trees)


def kv_source(seqs: list[list[int]], reused: list[int], trees: list[PrefixTree], start: int = 0) -> str:
    """The cost rule: "reuse", "tree" or "plain", for the KV of `seqs` past their first `start`
    tokens (a SharedPrefix holds those). seqs: what the forward would feed; reused: the tokens of
    each whose KV a kept row holds (`PrefixCache.match`); trees: `packing.pack` of the seqs past
    `start`. Reuse when some row reuses KV and the rest, left-padded on top of it, feeds fewer
    tokens than the tree forward; otherwise the tree forward when it feeds fewer than a plain
    left-padded forward (some prefix repeats); otherwise plain.
    [[1, 2, 3, 4], [1, 2, 3, 5]] (one tree of 5 nodes): reused [3, 3] -> 2 × 1 < 5: "reuse";
    reused [3, 0] -> 2 × 4 ≥ 5, and plain 2 × 4 > 5: "tree"."""
    tree = tree_tokens(trees)
    if any(k > start for k in reused) and padded_tokens(seqs, reused, start) < tree:
        return "reuse"
    return "tree" if tree < padded_tokens(seqs, [0] * len(seqs), start) else "plain"


class KvPlanner:
    """The KV a batch starts from (`prefill` for the decoder, `scoring` for `score`) and the
    ended rows a `PrefixCache` keeps (`keep_row`, up to `keep_bytes`), for one model."""

    def __init__(self, model, pad_id: int, keep_bytes: float = float("inf")):
        self.model, self.pad_id = model, pad_id
        self.keep_bytes = keep_bytes  # KV a PrefixCache may hold (config: kv_reuse_gb)

    def prefill(self, batch: list[list[int]], prefix_cache: PrefixCache | None, kept: list, prefix=None):
        """-> (ids, attn, cache) for a batch of prompts joining the decode, past the `prefix`
        (SharedPrefix) if any: the cache holds the KV of the first columns, from rows kept by the
        last call or this one (`kept`: `reuse`) or from one forward over the prompts' prefix
        trees (`tree_prefill`), as `kv_source` picks; None for a plain prefill. The decoder's
        admission forward feeds each prompt's last token in every case: the rule weighs the
        prompts without it."""
        start = prefix.length if prefix is not None else 0
        trees, groups = pack([p[start:-1] for p in batch])  # the prefill the decode would run
        match = [(0, 0)] * len(batch)
        if prefix_cache is not None:  # rows of the last call and of this call's earlier rows
            source = PrefixCache(prefix_cache.rows + kept)
            match = source.match(batch)
        plan = kv_source([p[:-1] for p in batch], [k for _, k in match], trees, start)
        if prefix_cache is not None:
            prefix_cache.prompt_tokens += sum(map(len, batch))
            prefix_cache.reused_tokens += sum(k for _, k in match) if plan == "reuse" else 0
        if plan == "reuse":
            cache, ids, attn = self.reuse(batch, source, match, start)
            return ids, attn, cache
        ids, attn = left_pad([p[start:] for p in batch], self.pad_id)
        ids, attn = ids.to(self.model.device), attn.to(self.model.device)
        cache = self.tree_prefill(trees, groups, ids.shape[1] - 1, prefix) if plan == "tree" else None
        return ids, attn, cache

    def scoring(self, seqs: list[list[int]], prompts: list[list[int]], prefix_cache: PrefixCache | None):
        """-> (cache, ids, attn) for scoring `seqs` (prompt + continuation) on top of rows a
        `prefix_cache` kept, or None where the packed forward (`packing`: shared prefixes once)
        feeds fewer tokens (`kv_source`)."""
        if prefix_cache is None or not prefix_cache.rows:
            return None
        match = prefix_cache.match(prompts)
        trees, _ = pack(seqs)
        if kv_source(seqs, [k for _, k in match], trees) != "reuse":
            return None
        return self.reuse(seqs, prefix_cache, match)

    def keep_row(self, decoder: Decoder, slot: int, tokens: list[int], kept: list, limit: float | None = None) -> list:
        """[(tokens, keys, values)] of an ended row for `PrefixCache.rows`, or [] past the
        byte budget (`limit`, default `keep_bytes`, with the rows already kept). Its last sampled
        token was never fed: the row keeps the tokens its KV covers."""
        columns = decoder.offset + int(decoder.attn[slot].sum())  # what row_kv would copy
        size = columns * kv_bytes_per_token(self.model.config, decoder.cache.layers[0].keys.element_size())
        if kv_size(kept) + size > (self.keep_bytes if limit is None else limit):
            return []  # checked before the copy: with kv_reuse_gb 0 no row is copied
        keys, values = decoder.row_kv(slot)
        n = min(keys.shape[2], len(tokens))
        return [(tokens[:n], keys[:, :, :n], values[:, :, :n])]

    def reuse(self, batch: list[list[int]], prefix_cache: PrefixCache, match: list[tuple[int, int]], start=0):
        """-> (cache, ids, attn) for a batch whose sequences extend rows of `prefix_cache` by
        `match` ((row, reused tokens) per sequence), the first `start` tokens of every sequence
        left out (a SharedPrefix holds them). Row n's reused KV is right-aligned in the first K
        columns and the rest of its sequence left-padded in the last S: pad columns between the
        two are masked out and position ids follow the mask (as generate computes them), so the
        model sees each sequence at the positions it would have without reuse."""
        match = [(row, max(k, start) - start) for row, k in match]  # reused tokens past `start`
        batch = [p[start:] for p in batch]
        reused = max(k for _, k in match)
        rest = max(len(p) - k for p, (_, k) in zip(batch, match))
        ids = torch.full((len(batch), reused + rest), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        _, keys0, _ = prefix_cache.rows[0]
        layers, heads, _, dim = keys0.shape
        keys = keys0.new_zeros((layers, len(batch), heads, reused, dim))
        values = torch.zeros_like(keys)
        for n, (prompt, (row, k)) in enumerate(zip(batch, match)):
            ids[n, reused - k : reused] = torch.tensor(prompt[:k], dtype=torch.long)
            ids[n, ids.shape[1] - (len(prompt) - k) :] = torch.tensor(prompt[k:], dtype=torch.long)
            attn[n, reused - k : reused] = 1
            attn[n, ids.shape[1] - (len(prompt) - k) :] = 1
            if k:
                _, row_keys, row_values = prefix_cache.rows[row]
                keys[:, n, :, reused - k :] = row_keys[:, :, start : start + k]
                values[:, n, :, reused - k :] = row_values[:, :, start : start + k]
        cache = DynamicCache(config=self.model.config)
        for layer in range(layers):
            cache.update(keys[layer], values[layer], layer)
        return cache, ids.to(self.model.device), attn.to(self.model.device)

    def tree_prefill(
        self, trees: list[PrefixTree], groups: list[list[int]], width: int, prefix: SharedPrefix | None = None
    ) -> DynamicCache:
        """KV cache of every prompt but its last token, each distinct prefix computed once, laid
        out as left-padded rows (B, width columns): the decoder's admission forward then feeds
        only the last prompt token. Full-attention models only (the continuous path). With a
        `prefix`, the trees hold what follows it and attend to it.

        The G rollouts of a problem and the m judgments of a step repeat their prompt, and all
        judge prompts share their instructions: a forward over the prompts' prefix trees
        (`models.training.packing`) runs each shared token once, then each row gathers its path's KV.
        trees, groups: `packing.pack` of the batch's prompts without their last token."""
        ids, pos, mask = tree_inputs(trees, self.pad_id)
        device = self.model.device
        packed = DynamicCache(config=self.model.config)
        inputs = dict(input_ids=ids.to(device), attention_mask=mask.to(device), cache=packed, use_cache=True)
        forward(self.model, prefix, pos.to(device), logits_to_keep=1, **inputs)
        nodes = ids.shape[1]
        pad_node = len(trees) * nodes  # an all-zero node for the pad columns (masked)
        index = torch.full((sum(map(len, groups)), width), pad_node, dtype=torch.long)
        for t, (tree, group) in enumerate(zip(trees, groups)):
            for row, path in zip(group, tree.paths):
                if path:
                    index[row, width - len(path) :] = torch.tensor(path) + t * nodes
        index = index.to(device)
        cache = DynamicCache(config=self.model.config)
        for n, layer in enumerate(packed.layers):
            gathered = []
            for kv in (layer.keys, layer.values):  # (trees, heads, nodes, dim) -> (rows, heads, width, dim)
                flat = kv.transpose(0, 1).reshape(kv.shape[1], -1, kv.shape[3])
                flat = torch.cat([flat, flat.new_zeros(flat.shape[0], 1, flat.shape[2])], 1)
                gathered.append(flat[:, index].transpose(0, 1).contiguous())
            cache.update(gathered[0], gathered[1], n)
        return cache
