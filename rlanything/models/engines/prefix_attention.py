"""Attention over a prompt prefix every row shares, its keys and values held once.

The prompts of one generation call share a long beginning: the chat template and system prompt
of every rollout, the instructions and worked examples of every judgment (shipped arithmetic
run: 69 of a rollout prompt's ~80 tokens, 92 of a judge prompt's ~174). A decoding step reads
every row's keys and values at every layer; on the CPU that read is memory-bound and the one
cost of a step that grows with the context (64 rows, ~200 columns: ~1.5 ms per layer, a third of
the step). With the shared prefix held once, (kv_heads, P, head_dim) per layer, a step reads it
once for all rows: the queries of all rows meet the prefix in one matrix product per KV head,
the rows' own columns (their cache) as before, and a single softmax runs over both parts'
scores, so the result is the attention over the concatenated keys up to float rounding.

Use: `shared_prefix_attention(model)` switches a model to this attention for a block (it
falls back to PyTorch's SDPA when a forward passes no prefix); a forward passes
`shared_prefix=SharedPrefix(...)` and position ids that count the prefix. Models whose
attention does not go through transformers' `AttentionInterface` keep SDPA:
`shared_prefix_attention` yields False, and a `SharedPrefix` counts the layers that used it
(`SharedPrefix.check`) so a model that drops the keyword fails loudly instead of attending to a
prompt without its beginning.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "rlanything_shared_prefix"


@dataclass
class SharedPrefix:
    """Keys and values of a prefix all rows of a forward share: per layer (kv_heads, P, head_dim)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    used: set[int] = field(default_factory=set)  # layers whose attention read the prefix

    @property
    def length(self) -> int:
        return self.keys[0].shape[1]

    @cached_property
    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """keys, values as (layers, kv_heads, P, head_dim): a kept row's first columns."""
        return torch.stack(self.keys), torch.stack(self.values)

    def check(self) -> None:
        """Raise unless every layer of the last forward attended to the prefix."""
        if len(self.used) != len(self.keys):
            raise RuntimeError(
                f"the model's attention ignored the shared prefix in {len(self.keys) - len(self.used)} of "
                f"{len(self.keys)} layers: it does not pass its keyword arguments to AttentionInterface"
            )
        self.used.clear()


# bytes of one layer's scores (query rows x keys, per head) that a forward may hold at once: an
# admission forward feeds whole prompts (q ~ S ~ 2,000 tokens on text games), and its full
# (B, H, q, P + S) scores, with the masked copy, the concatenation and the softmax, held 13 GB
# of a 128-game evaluation under an 8 GB run.memory_gb; queries go in chunks past this
SCORE_BYTES = 64 * 2**20


def attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, shared_prefix=None, **kwargs
) -> tuple[torch.Tensor, None]:
    """transformers attention function: SDPA without a prefix; with one, softmax(q·[Kp, K]ᵀ·s)·[Vp, V].

    query (B, H, q, d), key/value (B, h, S, d) (the rows' own columns; H = g·h query heads per
    KV head), attention_mask (B or 1, 1, q, S) bool or additive, or None (no padding; causal when
    q > 1) -> (B, q, H, d). The prefix (h, P, d) is visible to every query. Queries go in chunks
    whose scores take at most SCORE_BYTES (each query's softmax is its own: the same result).
    """
    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    shared_prefix.used.add(module.layer_idx)
    pk, pv = shared_prefix.keys[module.layer_idx], shared_prefix.values[module.layer_idx]
    b, heads, q, d = query.shape
    s = key.shape[2]
    if attention_mask is None and q > 1:  # SDPA's causal case: square, no cache
        attention_mask = torch.ones(q, s, dtype=torch.bool, device=query.device).tril(s - q)[None, None]
    scale = scaling if scaling is not None else d**-0.5
    per_query = b * heads * (pk.shape[1] + s) * 4  # fp32 scores of one query row
    chunk = max(1, SCORE_BYTES // per_query)
    outs = [
        _prefix_attention(
            query[:, :, i : i + chunk],
            key,
            value,
            None if attention_mask is None else attention_mask[:, :, i : i + chunk],
            pk,
            pv,
            scale,
        )
        for i in range(0, q, chunk)
    ]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, 2)  # (B, H, q, d)
    return out.transpose(1, 2).contiguous(), None


def _prefix_attention(query, key, value, attention_mask, pk, pv, scale) -> torch.Tensor:
    """`attention` for one chunk of queries: query (B, H, q, d), mask (B or 1, 1, q, S) or None
    -> (B, H, q, d)."""
    b, heads, q, d = query.shape
    h, s, p = key.shape[1], key.shape[2], pk.shape[1]
    rows = heads // h * q  # query rows per KV head of one sequence: (g, q) flattened
    query = query.reshape(b, h, rows, d) * scale
    # the prefix: one (B·rows, d) @ (d, P) product per KV head, the prefix read once
    scores_p = torch.matmul(query.transpose(0, 1).reshape(h, b * rows, d), pk.transpose(1, 2))
    if query.dtype == torch.float32:
        scores_s = torch.matmul(query, key.transpose(2, 3))  # (B, h, rows, S)
    else:
        # the same product as (K·qᵀ)ᵀ: CPU bf16 batched matmul copies a transposed (strided) key
        # cache first (64 rows x 110 columns: 0.75 ms a layer against 0.25); fp32 keeps the form
        # it always had, so its results stay bit-identical
        scores_s = torch.matmul(key, query.transpose(2, 3)).transpose(2, 3)
    if attention_mask is not None:
        scores_s = scores_s.view(b, h, heads // h, q, s)
        mask = attention_mask[:, :, None]  # (B, 1, 1, q, S): the same for every head
        if mask.dtype == torch.bool:
            scores_s = scores_s.masked_fill(~mask, float("-inf"))
        else:
            scores_s = scores_s + mask
        scores_s = scores_s.view(b, h, rows, s)
    scores = torch.cat([scores_p.view(h, b, rows, p).transpose(0, 1), scores_s], -1)
    probs = torch.softmax(scores, -1)
    out = torch.matmul(probs[..., p:], value)  # (B, h, rows, d)
    out_p = torch.matmul(probs[..., :p].transpose(0, 1).reshape(h, b * rows, p), pv)
    out = out + out_p.view(h, b, rows, d).transpose(0, 1)
    return out.view(b, heads, q, d)


def forward(model, prefix: SharedPrefix | None, position_ids: torch.Tensor, **inputs):
    """model(**inputs) past `prefix` (None: a plain forward): position ids count the prefix,
    every layer attends to it (checked)."""
    if prefix is None:
        return model(position_ids=position_ids, **inputs)
    out = model(position_ids=position_ids + prefix.length, shared_prefix=prefix, **inputs)
    prefix.check()
    return out


AttentionInterface.register(NAME, attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the rows' own columns are masked as for SDPA


@contextmanager
def shared_prefix_attention(model):
    """Within the block the model attends through `attention` (SDPA where no prefix is passed);
    yields whether it does (False: the model keeps its attention, pass no prefix)."""
    before = getattr(model.config, "_attn_implementation", None)
    can_switch = getattr(model, "_can_set_attn_implementation", None)  # transformers' PreTrainedModel
    if before != "sdpa" or can_switch is None or not can_switch():
        yield False
        return
    model.set_attn_implementation(NAME)
    try:
        yield True
    finally:
        model.set_attn_implementation(before)
