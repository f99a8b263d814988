"""Continuous batching for the transformers engine: a decode loop that refills finished rows.

`model.generate` decodes a fixed batch until its longest row ends: on the shipped rollouts
(64-token budget, most answers end after 10-30 tokens) a batch of 32 ran ~28 forwards for every
row's useful ~12, and its cache concatenates all keys and values anew at every step (38% of a
64-row decoding step on the CPU, measured). `Decoder` instead keeps up to `rows` sequences in
flight: a row leaves the batch when it ends (EOS or `max_new_tokens`), new prompts join it
(`admit`: their prefill forward samples their first token), and each layer's keys and values live
in a preallocated buffer (`GrowingLayer`) that a step writes one column of.

Layout: rows are left-padded to a shared column count C (a joining row's KV is right-aligned,
the columns before it masked out); position ids follow each row's count of real tokens, as
`generate` computes them, so a row sees the positions it would have alone.

Seed rule: row i of a call draws its sampling noise from its own stream, numpy's
`default_rng([seed, i])`: one uniform u per generated token, the token being the first whose
cumulative probability (sorted by token id; top-p: the kept nucleus in descending order)
exceeds u. A row's samples therefore depend only on (seed, i) and its own logits — not on the
batch size, the order of the call's prompts or which rows share its forward (logits agree
across batch compositions up to float rounding: ~1e-6, far below any sampling threshold in
practice). `sample` is the whole rule; tests/models/test_decode.py replays it from a
teacher-forced pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlanything import memory
from rlanything.models.engines.generation import Choice
from rlanything.models.engines.prefix_attention import SharedPrefix, forward


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer over preallocated buffers (B, kv_heads, capacity, head_dim):
    `update` writes the new columns in place and returns views of the first `length` columns
    (DynamicLayer concatenates the whole cache each step). Grows by `reserve` columns when full."""

    def __init__(self, reserve: int = 64):
        super().__init__()
        self.reserve, self.length = reserve, 0

    @classmethod
    def of(cls, keys: torch.Tensor, values: torch.Tensor, length: int, reserve: int) -> GrowingLayer:
        """A layer over existing buffers whose first `length` columns are filled."""
        layer = cls(reserve=reserve)
        layer.lazy_initialization(keys, values)
        layer.kbuf, layer.vbuf, layer.length = keys, values, length
        layer.keys, layer.values = keys[:, :, :length], values[:, :, :length]
        return layer

    def _allocate(self, like: torch.Tensor, capacity: int) -> None:
        if not self.is_initialized:
            self.lazy_initialization(like, like)
        b, h, _, d = like.shape
        kbuf, vbuf = like.new_zeros(b, h, capacity, d), like.new_zeros(b, h, capacity, d)
        if self.length:
            kbuf[:, :, : self.length] = self.kbuf[:, :, : self.length]
            vbuf[:, :, : self.length] = self.vbuf[:, :, : self.length]
        self.kbuf, self.vbuf = kbuf, vbuf

    def update(self, key_states, value_states, *args, **kwargs):
        n, m = self.length, key_states.shape[-2]
        if not self.is_initialized or n + m > self.kbuf.shape[2]:
            self._allocate(key_states, n + m + self.reserve)
        self.kbuf[:, :, n : n + m] = key_states
        self.vbuf[:, :, n : n + m] = value_states
        self.length = n + m
        self.keys, self.values = self.kbuf[:, :, : self.length], self.vbuf[:, :, : self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


def full_attention(config) -> bool:
    """Whether every layer of a model's cache is plain full attention (no sliding windows)."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


def uniforms(seed: int, index: int, n: int) -> torch.Tensor:
    """Row `index`'s sampling noise for a call with `seed`: n uniforms in [0, 1) (the seed rule)."""
    return torch.from_numpy(np.random.default_rng([seed % 2**63, index]).random(n))


def sample(
    logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-prob under log_softmax(logits / T) (no top-p truncation).

    logits (B, V), u (B,) uniforms -> tokens (B,), logprobs (B,). T = 0: argmax, log-probs at
    T = 1. Otherwise inverse-CDF sampling: the first token whose cumulative probability exceeds
    u · total, over token ids in order, or over the nucleus (the fewest most probable tokens
    whose mass reaches top_p) in descending probability. Example: probs [0.5, 0.2, 0.3], u 0.6
    -> cumulative [0.5, 0.7, 1.0] -> token 1; with top_p 0.7 the nucleus is [0 (0.5), 2 (0.3)],
    cumulative [0.5, 0.8] of 0.8, u · 0.8 = 0.48 -> token 0.
    """
    logits = logits.float()
    if temperature <= 0:
        logprobs = torch.log_softmax(logits, -1)
        tokens = logits.argmax(-1)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    logprobs = torch.log_softmax(logits / temperature, -1)
    probs = logprobs.exp()
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(-1, descending=True)
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0.0)
    cdf = probs.cumsum(-1)
    picked = torch.searchsorted(cdf, (u.to(cdf) * cdf[:, -1])[:, None], right=True).clamp(max=cdf.shape[1] - 1)
    tokens = (picked if order is None else order.gather(-1, picked)).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


@dataclass
class Row:
    """One prompt in flight: its place in the call, its noise, what it generated so far."""

    index: int
    noise: torch.Tensor  # (max_new_tokens + 1,) uniforms: one per sampled token, the last for a Choice
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False
    sampled: int = 0  # tokens sampled freely (the rest were appended by a Choice)
    stopped: bool = False  # an EOS ended the sampling
    forced: list[int] | None = None  # a Choice's tokens still to append; None: sampling
    choice: int | None = None


def positions(attn: torch.Tensor) -> torch.Tensor:
    """attention_mask (B, L) -> position ids (B, L) as generate() computes them: each token's
    count of real tokens before it, whatever padding (left, or masked gaps) lies between."""
    return (attn.cumsum(-1) - 1).clamp(min=0)


class Decoder:
    """Up to any number of rows decoding together; `admit` adds rows, `step` decodes one token
    for every row, both return the slots of rows that just ended (their KV is still readable
    with `row_kv` until the next call). Invariant: the cache holds `attn.shape[1]` columns and
    `feed` is each row's token not yet in it (its last sample). With a `SharedPrefix` (a prompt
    beginning every row shares, models/engines/prefix_attention.py) the cache and `attn` hold only the
    columns after it, position ids count it, and every forward attends to it."""

    def __init__(
        self,
        model,
        eos_ids,
        max_new_tokens,
        temperature,
        top_p,
        seed,
        choice: Choice | None = None,
        prefix: SharedPrefix | None = None,
        row_ids: list[int] | None = None,
    ):
        self.model, self.eos, self.choice, self.prefix = model, set(eos_ids), choice, prefix
        self.row_ids = row_ids  # a shard's rows: their indices in the whole call (the seed rule)
        self.max_new, self.temperature, self.top_p, self.seed = max_new_tokens, temperature, top_p, seed
        extra = (
            0 if choice is None else len(choice.opener) + max(map(len, choice.options.values())) + len(choice.closer)
        )
        self.reserve = max_new_tokens + extra  # columns a row may still add
        self.rows: list[Row] = []
        self.cache: DynamicCache | None = None
        self.attn = torch.zeros(0, 0, dtype=torch.long, device=model.device)
        self.feed = torch.zeros(0, dtype=torch.long, device=model.device)

    @property
    def offset(self) -> int:
        """Positions before the cache: the shared prefix's length."""
        return self.prefix.length if self.prefix is not None else 0

    def kv_bytes(self) -> int:
        """Bytes of the cache's buffers (reserved columns included); 0 before the first row."""
        if self.cache is None:
            return 0
        return sum(getattr(x, "kbuf", x.keys).nbytes + getattr(x, "vbuf", x.values).nbytes for x in self.cache.layers)

    @property
    def live(self) -> int:
        return sum(not r.done for r in self.rows)

    def admit(self, indices: list[int], ids: torch.Tensor, attn: torch.Tensor, cache: DynamicCache | None) -> list[int]:
        """Rows for the prompts `indices` of the call: ids, attn (b, L) left-padded, `cache` the KV
        of their first K columns (None: K = 0). One forward over columns K: samples each row's
        first token; the rows join the batch (ended rows leave it)."""
        cache = cache if cache is not None else DynamicCache(config=self.model.config)
        start = cache.get_seq_length()
        logits = self._forward(ids[:, start:], attn, positions(attn)[:, start:], cache)
        first = self.live  # the new rows' first slot once ended rows are dropped
        self._rebuild([(layer.keys, layer.values) for layer in cache.layers], attn)
        self.rows += [self._row(i) for i in indices]
        self.feed = torch.cat([self.feed, self.feed.new_zeros(len(indices))])
        return self._sample(logits, list(range(first, first + len(indices))))

    def step(self) -> list[int]:
        """One token for every live row. Ended rows are dropped first once they are an eighth
        of the batch (a copy of the cache costs about what a few ended rows' forwards do), and
        the freed buffers given back (`memory.release`)."""
        ended = len(self.rows) - self.live
        if ended and (8 * ended >= len(self.rows)):
            self._rebuild(None, None)
            # the old buffers go back to the system, not to the allocator's arenas: measured on a
            # 128-game evaluation under an 8 GiB budget, the rebuilds after the last admission
            # (none asks the budget, which releases) grew the resident memory from 7.3 to 8.7 GiB
            # while the live KV fell from 0.84 to 0.04 GiB
            memory.release()
        attn = torch.cat([self.attn, self.attn.new_ones(len(self.rows), 1)], 1)
        logits = self._forward(self.feed[:, None], attn, self.attn.sum(-1, keepdim=True), self.cache)
        self.attn = attn
        live = [s for s, r in enumerate(self.rows) if not r.done]
        if len(live) < len(self.rows):
            logits = logits[torch.tensor(live, device=logits.device)]
        return self._sample(logits, live)

    def _forward(self, ids, attn, position_ids, cache) -> torch.Tensor:
        """Logits (B, V) of each row's last fed token; the cache grows by ids' columns."""
        inputs = dict(input_ids=ids, attention_mask=attn, cache=cache, use_cache=True, logits_to_keep=1)
        return forward(self.model, self.prefix, position_ids, **inputs).logits[:, -1]

    def _row(self, index: int) -> Row:
        noise_index = index if self.row_ids is None else self.row_ids[index]
        row = Row(index, uniforms(self.seed, noise_index, self.max_new + 1))
        if self.max_new == 0:  # a Choice right after the prompt
            row.forced = list(self.choice.opener)
        return row

    def _sample(self, logits: torch.Tensor, slots: list[int]) -> list[int]:
        """The next token of the rows in `slots` from their logits (len(slots), V): sampled, or
        a `Choice`'s next token. -> the slots of rows that ended."""
        if not slots:
            return []
        rows = [self.rows[s] for s in slots]
        noise = torch.stack([r.noise[min(r.sampled, self.max_new)] for r in rows])
        tokens, logprobs = sample(logits, noise, self.temperature, self.top_p)
        ended = []
        for n, (slot, row, token, logprob) in enumerate(zip(slots, rows, tokens.tolist(), logprobs.tolist())):
            forced = row.forced is not None  # this step appends a Choice's token
            if not forced:
                row.sampled += 1
                if token in self.eos or row.sampled == self.max_new:
                    row.stopped, row.done = token in self.eos, self.choice is None
                    if not row.done:  # the Choice follows; an EOS gives way to its opener at once
                        row.forced, forced = list(self.choice.opener), row.stopped
                        row.sampled -= row.stopped
            if forced:
                token, logprob = self._forced(row, logits[n])
            row.tokens.append(token)
            row.logprobs.append(logprob)
            self.feed[slot] = token
            row.done = row.done or (row.choice is not None and not row.forced)
            if row.done:
                ended.append(slot)
        return ended

    def _forced(self, row: Row, logits: torch.Tensor) -> tuple[int, float]:
        """A Choice's next token for `row` and its log-prob under T, deciding the option right
        after the opener: the first option whose cumulative renormalised probability (of its
        first token) exceeds the row's last uniform (`Choice.pick`); for {1, -1}: 1 iff u < p(1)."""
        scaled = torch.log_softmax(logits.float() / (self.temperature or 1.0), -1)
        if not row.forced and row.choice is None:
            firsts = torch.stack([scaled[option[0]] for option in self.choice.options.values()])
            row.choice = self.choice.pick(firsts, row.noise[-1])
            row.forced = list(self.choice.options[row.choice]) + list(self.choice.closer)
        token = row.forced.pop(0)
        return token, float(scaled[token])

    def row_kv(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The KV of a row's real columns, the shared prefix's first: keys, values (layers,
        kv_heads, n, head_dim)."""
        real = self.attn[slot].nonzero().squeeze(-1)
        first = int(real[0])  # left padding ends here; masked gaps may follow (reused KV)
        cols = slice(first, None) if len(real) == self.attn.shape[1] - first else real
        keys = torch.stack([layer.keys[slot][:, cols] for layer in self.cache.layers])
        values = torch.stack([layer.values[slot][:, cols] for layer in self.cache.layers])
        if self.prefix is None:
            return keys, values
        shared_keys, shared_values = self.prefix.stacked
        return torch.cat([shared_keys, keys], 2), torch.cat([shared_values, values], 2)

    def _rebuild(self, new: list[tuple[torch.Tensor, torch.Tensor]] | None, new_attn: torch.Tensor | None) -> None:
        """Drop ended rows and append `new` rows (their per-layer KV and mask) in fresh buffers,
        each row's real columns packed to the right (`real_columns`): a row reusing little KV
        beside one reusing much joined with a masked gap as wide as the difference, which would
        otherwise stay in the buffers (and in every step's attention) until the row ended. The
        gaps are masked, and positions count real tokens only: packing changes no result.
        One layer is gathered at a time, so a rebuild holds the old buffers and the new ones."""
        keep = [s for s, r in enumerate(self.rows) if not r.done]
        parts = []  # (per-layer (keys, values), source rows, source columns (rows, W), -1: padding)
        if keep:
            index = torch.tensor(keep, device=self.attn.device)
            layers = [(layer.keys, layer.values) for layer in self.cache.layers]
            parts.append((layers, index, real_columns(self.attn[index])))
        if new is not None:
            parts.append((new, torch.arange(new_attn.shape[0], device=new_attn.device), real_columns(new_attn)))
        self.rows = [self.rows[s] for s in keep]
        self.feed = self.feed[torch.tensor(keep, dtype=torch.long, device=self.feed.device)]
        if not parts:
            self.cache, self.attn = None, self.attn.new_zeros(0, 0)
            return
        width = max(cols.shape[1] for *_, cols in parts)
        rows = sum(cols.shape[0] for *_, cols in parts)
        self.attn = self.attn.new_zeros(rows, width)
        start = 0
        for _, _, cols in parts:
            self.attn[start : start + cols.shape[0], width - cols.shape[1] :] = cols >= 0
            start += cols.shape[0]
        self.cache = DynamicCache(config=self.model.config)
        self.cache.layers = [self._layer(parts, n, rows, width) for n in range(len(parts[0][0]))]

    def _layer(self, parts, n: int, rows: int, width: int) -> GrowingLayer:
        """Layer n of the rebuilt cache: every part's rows gathered, right-aligned, pads zeroed
        (never garbage: a masked NaN would still poison the attention's weighted sum); columns
        past `width` are written before they are read."""
        like = parts[0][0][n][0]
        keys = like.new_empty(rows, like.shape[1], width + self.reserve, like.shape[3])
        values = torch.empty_like(keys)
        start = 0
        for layers, index, cols in parts:
            end, w = start + len(index), cols.shape[1]
            for buffer, source in zip((keys, values), layers[n]):
                buffer[start:end, :, : width - w] = 0
                buffer[start:end, :, width - w : width] = gather_columns(source, index, cols)
            start = end
        return GrowingLayer.of(keys, values, width, self.reserve)


def real_columns(attn: torch.Tensor) -> torch.Tensor:
    """attn (B, C) -> (B, W): each row's real (unmasked) column indices in order, right-aligned,
    -1 before them; W is the most real columns of a row.
    [[1, 0, 1], [0, 1, 1]] -> [[0, 2], [1, 2]]; [[0, 0, 1], [1, 1, 1]] -> [[-1, -1, 2], [0, 1, 2]]."""
    if attn.numel() == 0:
        return attn.new_zeros(attn.shape[0], 0)
    columns = torch.arange(attn.shape[1], device=attn.device).expand_as(attn)
    ordered = torch.where(attn.bool(), columns, -1).sort(-1).values
    return ordered[:, ordered.shape[1] - int(attn.sum(-1).max()) :]


def gather_columns(kv: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """kv (B, heads, C, dim), rows (R,), cols (R, W) from `real_columns` -> (R, heads, W, dim):
    row rows[r]'s columns cols[r], zeros where cols is -1. Contiguous right-aligned columns
    (no gap, the common case) are a slice."""
    width = cols.shape[1]
    first = kv.shape[2] - width
    if bool(((cols == torch.arange(first, kv.shape[2], device=cols.device)) | (cols < 0)).all()):
        out = kv[rows, :, first:]
        return out.masked_fill((cols < 0)[:, None, :, None], 0) if bool((cols < 0).any()) else out
    out = kv[rows[:, None], :, cols.clamp(min=0)]  # (R, W, heads, dim): the advanced indices first
    out[cols < 0] = 0
    return out.transpose(1, 2)
