"""Exact attention over a packed prefix tree, each shared prefix computed once per branch.

A packed row (`packing.PrefixTree`) holds each distinct prefix of its sequences once, and the
mask path runs SDPA over the whole row with an (N, N) ancestor mask: N² scores per head and
layer, though a node needs only its depth + 1 of them. On a real text-game policy update
(prompts of ~1,000 tokens) that masked attention was over half the update. Here the row is
cut into segments, the maximal chains of nodes between branch points: a segment's queries see
every node of its ancestor segments and its own nodes causally, so SDPA over (ancestors + own
nodes) with a lower-right causal mask is exact, and its area is the exact work (plus half a
chunk per chunk). Sibling segments shorter than a chunk go into one call with their shared
ancestors (one key read for all of them); a call's mask is derived from the tree itself (key
j is query i's ancestor or itself), so the grouping cannot change what a token sees.

The function is registered in transformers' `AttentionInterface` under NAME and reached by
switching the model's attention implementation for one forward (`tree_attention`), with the
plan passed as the forward's `tree_plan` keyword. No (N, N) mask is built: NAME has no mask
function, so transformers passes None. A model whose attention does not go through the
interface keeps the mask path; one that drops the keyword fails loudly (`TreePlan.check`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "rlanything_tree"
# queries per SDPA call: a long segment goes in chunks (each wastes chunk²/2 masked scores,
# as a causal kernel's diagonal blocks do); short siblings share a call up to this many
CHUNK = 256
# forwards whose rows are narrower keep the mask path: measured on SmolLM2-135M bf16 rows of a
# text-game update (fwd + bwd, 1 thread), the tree path took 2.7 s against 2.9 s at 423 nodes
# (about even), 5-16% less at 800-1,060 and 18-25% less at 1,474; small rows of many short
# branches (one SDPA call each) were not measured
TREE_MIN_NODES = 512


@dataclass
class Call:
    """One SDPA call of a row: queries (q,) and keys (k,) node indices, a slice where they are
    consecutive (no copy); mask (q, k) bool, None where every query sees every key."""

    row: int
    queries: slice | torch.Tensor
    keys: slice | torch.Tensor
    mask: torch.Tensor | None


def segments(parents: list[int]) -> tuple[list[list[int]], list[int]]:
    """-> (segments, each one's parent segment or -1), parents before children: a segment is a
    maximal chain, each node but its last with exactly one child.

    >>> segments([-1, 0, 1, 1, -1])  # tokens [5, 6, 7, 8, 9]: 7 and 8 branch after 6
    ([[0, 1], [2], [3], [4]], [-1, 0, 0, -1])
    """
    children: list[list[int]] = [[] for _ in parents]
    roots = []
    for node, parent in enumerate(parents):
        (children[parent] if parent >= 0 else roots).append(node)
    segs: list[list[int]] = []
    up: list[int] = []
    stack = [(root, -1) for root in reversed(roots)]
    while stack:
        node, above = stack.pop()
        chain = [node]
        while len(children[chain[-1]]) == 1:
            chain.append(children[chain[-1]][0])
        segs.append(chain)
        up.append(above)
        stack += [(child, len(segs) - 1) for child in reversed(children[chain[-1]])]
    return segs, up


def intervals(parents: list[int], segs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """-> enter, leave (N,): node j is node i or its ancestor iff enter[j] <= enter[i] < leave[j]
    (preorder numbers; `segments` lists segments in preorder)."""
    enter = torch.empty(len(parents), dtype=torch.long)
    enter[[node for seg in segs for node in seg]] = torch.arange(len(parents))
    size = [1] * len(parents)
    for node in range(len(parents) - 1, -1, -1):  # a parent's index is below its children's
        if parents[node] >= 0:
            size[parents[node]] += size[node]
    return enter, enter + torch.tensor(size, dtype=torch.long)


def _nodes(nodes: list[int]) -> slice | torch.Tensor:
    if nodes == list(range(nodes[0], nodes[0] + len(nodes))):
        return slice(nodes[0], nodes[0] + len(nodes))  # consecutive: a view instead of a gather
    return torch.tensor(nodes, dtype=torch.long)


def _pieces(segs: list[list[int]], up: list[int]) -> dict[int, list[tuple[list[int], list[int]]]]:
    """Per parent segment, its children's (queries, own keys): a segment in chunks of CHUNK
    queries, each chunk's keys the segment's nodes up to the chunk's end."""
    by_parent: dict[int, list[tuple[list[int], list[int]]]] = {}
    for seg, above in zip(segs, up):
        for start in range(0, len(seg), CHUNK):
            by_parent.setdefault(above, []).append((seg[start : start + CHUNK], seg[: start + CHUNK]))
    return by_parent


def _call_nodes(segs: list[list[int]], up: list[int]) -> Iterator[tuple[list[int], list[int]]]:
    """Each call's (queries, keys) node lists, from a tree's `segments`: a group of sibling
    pieces, their shared ancestors' nodes first, then each piece's own."""
    ancestors: list[list[int]] = []
    for above in up:  # a parent segment comes before its children
        ancestors.append(ancestors[above] + segs[above] if above >= 0 else [])
    for above, pieces in _pieces(segs, up).items():
        shared = ancestors[above] + segs[above] if above >= 0 else []  # seen by every query here
        for group in _groups(pieces):
            yield [n for q, _ in group for n in q], shared + [n for _, own in group for n in own]


def row_calls(row: int, parents: list[int]) -> list[Call]:
    """The calls that compute attention for every node of one tree exactly once.

    >>> [(c.queries, c.keys, c.mask) for c in row_calls(0, [-1, 0, 1, 1])]  # [5, 6, 7], [5, 6, 8]
    [(slice(0, 2, None), slice(0, 2, None), tensor([[ True, False],
            [ True,  True]])), (slice(2, 4, None), slice(0, 4, None), tensor([[ True,  True,  True, False],
            [ True,  True, False,  True]]))]
    """
    segs, up = segments(parents)
    enter, leave = intervals(parents, segs)
    calls = []
    for queries, keys in _call_nodes(segs, up):
        q, k = torch.tensor(queries)[:, None], torch.tensor(keys)
        mask = (enter[k] <= enter[q]) & (enter[q] < leave[k])
        calls.append(Call(row, _nodes(queries), _nodes(keys), None if mask.all() else mask))
    return calls


def gathered_keys(parents: list[int]) -> tuple[int, int]:
    """Keys that `row_calls`'s calls read over one tree, all calls together -> (read, copied):
    copied counts those of calls whose keys are not one consecutive run (an index_select; the
    others read a view). A training forward keeps what its calls read for the backward
    (`footprint.tree_attention_bytes`).

    >>> gathered_keys([-1, 0, 1, 1])  # the calls read nodes [0, 1] and [0, 1, 2, 3]: views
    (6, 0)
    >>> gathered_keys([-1, 0, 0, 2, 2])  # [0], [0, 1, 2] (queries 1, 2), then [0, 2, 3, 4]: a gather
    (8, 4)
    """
    read = copied = 0
    for _, keys in _call_nodes(*segments(parents)):
        read += len(keys)
        copied += 0 if isinstance(_nodes(keys), slice) else len(keys)
    return read, copied


def _groups(pieces: list[tuple[list[int], list[int]]]) -> list[list[tuple[list[int], list[int]]]]:
    """Consecutive pieces in groups of at most CHUNK queries (a longer piece alone)."""
    groups: list[list[tuple[list[int], list[int]]]] = []
    size = CHUNK
    for piece in pieces:
        if size + len(piece[0]) > CHUNK:
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += len(piece[0])
    return groups


def _take(x: torch.Tensor, nodes: slice | torch.Tensor) -> torch.Tensor:
    """x (heads, N, d) at `nodes` along N; autograd sums a node's gradient over its calls."""
    if isinstance(nodes, slice):
        return x[:, nodes]
    return x.index_select(1, nodes)


def _moved(x: slice | torch.Tensor | None, device) -> slice | torch.Tensor | None:
    return x if x is None or isinstance(x, slice) else x.to(device)


@dataclass
class TreePlan:
    """A forward's calls, all rows; order (T·N,): where (row, node) row·N + node finds its
    output among the calls' concatenated outputs (pads: the one zero column after them)."""

    calls: list[Call]
    order: torch.Tensor
    used: int = field(default=0)  # attention layers that read the plan in the last forward

    @classmethod
    def build(cls, parents: list[list[int]], width: int) -> TreePlan:
        """parents: per row, each node's parent (-1: a root), rows padded to `width` nodes.

        >>> TreePlan.build([[-1, 0, 1, 1], [-1]], 4).order.tolist()  # row 1: one node, 3 pads
        [0, 1, 2, 3, 4, 5, 5, 5]
        """
        calls = [call for row, nodes in enumerate(parents) for call in row_calls(row, nodes)]
        order = torch.full((len(parents) * width,), -1, dtype=torch.long)
        start = 0
        for call in calls:
            queries = torch.arange(width)[call.queries] if isinstance(call.queries, slice) else call.queries
            order[call.row * width + queries] = torch.arange(start, start + len(queries))
            start += len(queries)
        order[order < 0] = start
        assert start == sum(map(len, parents)), "every node is a query of exactly one call"
        return cls(calls, order)

    def to(self, device) -> TreePlan:
        calls = [Call(c.row, *(_moved(x, device) for x in (c.queries, c.keys, c.mask))) for c in self.calls]
        return TreePlan(calls, self.order.to(device))

    def check(self, layers: int) -> None:
        """Raise unless all `layers` attention layers of the last forward read the plan."""
        if self.used != layers:
            raise RuntimeError(
                f"{self.used} of {layers} attention layers attended through the tree plan: the model "
                "does not pass its keyword arguments to AttentionInterface"
            )
        self.used = 0


def attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, tree_plan=None, **kwargs
) -> tuple[torch.Tensor, None]:
    """transformers attention function: SDPA without a plan; with one, call by call over the
    plan's trees, each node attending to its ancestors and itself.

    query (T, H, N, d), key/value (T, h, N, d) (H = g·h query heads per KV head), position
    embeddings already applied -> (T, N, H, d), None (attention_mask is None: NAME has no mask).
    """
    if tree_plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise ValueError("tree attention computes full causal attention: no sliding window, no softcap")
    tree_plan.used += 1
    rows, heads, width, d = query.shape
    outs = []
    for call in tree_plan.calls:
        out = torch.nn.functional.scaled_dot_product_attention(
            _take(query[call.row], call.queries)[None],
            _take(key[call.row], call.keys)[None],
            _take(value[call.row], call.keys)[None],
            attn_mask=call.mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=heads != key.shape[1],
        )
        outs.append(out[0])  # (H, q, d)
    outs.append(outs[0].new_zeros(heads, 1, d))  # pads' output: they feed no kept logits
    flat = torch.cat(outs, 1).index_select(1, tree_plan.order)  # (H, T·N, d)
    return flat.view(heads, rows, width, d).permute(1, 2, 0, 3).contiguous(), None


AttentionInterface.register(NAME, attention)


def core_model(model) -> PreTrainedModel | None:
    """The transformers model inside `model` (DDP, DeepSpeed, peft wrap it); None if none."""
    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)


def _switchable(model) -> PreTrainedModel | None:
    """`core_model` where its attention can be switched to NAME: SDPA now (what the mask path
    runs), through AttentionInterface, no gradient checkpointing (its recompute in the backward
    would run outside the switch)."""
    core = core_model(model)
    if core is None or getattr(core.config, "_attn_implementation", None) != "sdpa":
        return None
    if not core._can_set_attn_implementation() or getattr(core, "is_activation_checkpointing", True):
        return None
    return core


def attends_by_tree(model, width: int) -> bool:
    """Whether a packed forward of rows `width` nodes wide goes through `attention` (TREE_MIN_NODES
    or more, a model that can switch) rather than the (N, N) mask."""
    return width >= TREE_MIN_NODES and _switchable(model) is not None


@contextmanager
def tree_attention(model, parents: list[list[int]], width: int, device):
    """Within the block `model` attends through `attention`; yields the plan to pass as the
    forward's `tree_plan` (checked on exit), or None: rows under TREE_MIN_NODES, or a model
    that cannot switch; pass an (N, N) mask then."""
    if not attends_by_tree(model, width):
        yield None
        return
    core = _switchable(model)
    plan = TreePlan.build(parents, width).to(device)
    core.set_attn_implementation(NAME)
    try:
        yield plan
    finally:
        core.set_attn_implementation("sdpa")
    plan.check(core.config.get_text_config().num_hidden_layers)
