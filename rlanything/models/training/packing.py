"""Training forward passes that run each shared prompt once (prefix-tree packing).

The samples of one update share prompts: the G rollouts of a problem start from the same
prompt, and the m judgments of a step are m reasonings after the same judge prompt (~200
tokens, ~37 of reasoning with SmolLM2 arithmetic). Left-padded rows run every copy of a prompt
through the model again, forward and backward; with m = 3 two thirds of the RM update's tokens
are repeats. Here sequences that share a prefix become one row: a prefix tree of their tokens
(each distinct prefix once) with a 4D attention mask that lets a token see exactly its
ancestors, and position ids equal to its depth. Every token then computes what it would in a
row of its own (same context, same positions), so log-probs and gradients equal those of
`engine.response_logprobs` up to float rounding (a shared token's gradient is the sum of its
sequences' contributions, as with separate rows). A row grows only while its attention area
(nodes²) stays within that of its sequences' own rows, so sequences that share little keep
rows of their own. Measured on a real SmolLM2 RM update (75 judgments, 17k tokens, 2 cores):
75 s instead of 118 s; tests/models/test_packing.py checks the equality. Rows of
`tree_attention.TREE_MIN_NODES` nodes or more skip the mask: `tree_attention` computes each
branch's attention over its own ancestors only (the exact work, not N²), where the model's
attention can be switched; a replayed text-game policy update (prompts ~1,000 tokens, bf16,
one thread, a quiet 2-core machine) took 63-66 s instead of 72-74 s, its attention 23 s
instead of 49 (profiled).

Worked example: sequences [5, 6, 7] and [5, 6, 8] (prompt [5, 6], responses of one token) pack
into one row of tokens [5, 6, 7, 8] at positions [0, 1, 2, 2]; token 8 attends to 5, 6 and
itself, not to 7; both responses are predicted from the logits at node 1 (token 6).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlanything.algo.losses import token_entropy, token_logprobs
from rlanything.models.training.tree_attention import core_model, tree_attention

# a row's attention costs (nodes)² per head, negligible next to its linear layers at this size
SHORT_ROW = 1024


@dataclass
class PrefixTree:
    """One packed row. tokens, parents (-1 for a root token), depths: (N,) per node; paths:
    for each sequence of the row, its node index per token; square: Σ len(sequence)², the
    attention area the sequences would take in rows of their own."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    paths: list[list[int]] = field(default_factory=list)
    square: int = 0
    children: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, seqs: list[list[int]]) -> PrefixTree:
        """>>> t = PrefixTree.build([[5, 6, 7], [5, 6, 8]])
        >>> t.tokens, t.parents, t.depths, t.paths
        ([5, 6, 7, 8], [-1, 0, 1, 1], [0, 1, 2, 2], [[0, 1, 2], [0, 1, 3]])
        """
        tree = cls()
        for seq in seqs:
            tree.add(seq)
        return tree

    def new_nodes(self, seq: list[int]) -> int:
        """How many nodes `add(seq)` would create."""
        node = -1
        for k, token in enumerate(seq):
            node = self.children.get((node, token), -2)
            if node == -2:
                return len(seq) - k
        return 0

    def add(self, seq: list[int]) -> None:
        node, path = -1, []
        for token in seq:
            child = self.children.get((node, token))
            if child is None:
                child = self.children[(node, token)] = len(self.tokens)
                self.tokens.append(token)
                self.parents.append(node)
                self.depths.append(self.depths[node] + 1 if node >= 0 else 0)
            node = child
            path.append(node)
        self.paths.append(path)
        self.square += len(seq) ** 2

    def fits(self, seq: list[int]) -> bool:
        """Whether `seq` may join this row: up to SHORT_ROW nodes always, past that only while
        the row's attention area (nodes²) stays within what its sequences would take in rows
        of their own, so long sequences that share little keep rows of their own."""
        nodes = len(self.tokens) + self.new_nodes(seq)
        return not self.paths or nodes <= SHORT_ROW or nodes**2 <= self.square + len(seq) ** 2

    def ancestors(self, width: int) -> torch.Tensor:
        """-> (width, width) bool: [i, j] when node j is node i or one of its ancestors (the
        tokens node i attends to). Columns past the tree are pads: each sees only itself.

        >>> PrefixTree.build([[5, 6, 7], [5, 6, 8]]).ancestors(4).int().tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]
        """
        mask = torch.eye(width, dtype=torch.bool)
        for node, parent in enumerate(self.parents):  # parents come before their children
            if parent >= 0:
                mask[node] |= mask[parent]
        return mask


def pack(seqs: list[list[int]]) -> tuple[list[PrefixTree], list[list[int]]]:
    """Sequences into rows -> (trees, sequence indices per tree). Sequences are taken in token
    order (so those with a common prefix are neighbours) and each joins the last row while it
    `fits`.

    >>> trees, groups = pack([[1, 2, 3], [9, 3], [1, 2, 4]])
    >>> groups, trees[0].tokens, trees[0].parents
    ([[0, 2, 1]], [1, 2, 3, 4, 9, 3], [-1, 0, 1, 1, -1, 4])
    """
    trees: list[PrefixTree] = [PrefixTree()]
    groups: list[list[int]] = [[]]
    for i in sorted(range(len(seqs)), key=seqs.__getitem__):
        if not trees[-1].fits(seqs[i]):
            trees.append(PrefixTree())
            groups.append([])
        trees[-1].add(seqs[i])
        groups[-1].append(i)
    return trees, groups


def tree_inputs(
    trees: list[PrefixTree], pad_id: int, with_mask: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> input_ids (T, N), position_ids (T, N), attention mask (T, 1, N, N) bool (None without
    `with_mask`) for a forward pass over T trees, padded to the largest's N nodes."""
    width = max(len(t.tokens) for t in trees)
    ids = torch.full((len(trees), width), pad_id, dtype=torch.long)
    pos = torch.zeros_like(ids)
    mask = torch.zeros((len(trees), 1, width, width), dtype=torch.bool) if with_mask else None
    for r, tree in enumerate(trees):
        ids[r, : len(tree.tokens)] = torch.tensor(tree.tokens)
        pos[r, : len(tree.tokens)] = torch.tensor(tree.depths)
        if with_mask:
            mask[r, 0] = tree.ancestors(width)
    return ids, pos, mask


def packed_logits(model, trees: list[PrefixTree], pad_id: int, keep: torch.Tensor, device) -> torch.Tensor:
    """The model's logits (K, V) at the K `keep` (T, N) nodes of the trees' forward: through
    `tree_attention` where it applies (no (N, N) mask), else SDPA with the ancestor mask."""
    width = keep.shape[1]
    with tree_attention(model, [t.parents for t in trees], width, device) as plan:
        ids, pos, mask = tree_inputs(trees, pad_id, with_mask=plan is None)
        extra = {"attention_mask": _mask_for(model, mask.to(device))} if plan is None else {"tree_plan": plan}
        # use_cache=False: no KV cache of every layer that nothing reads (3x a scoring forward's memory)
        inputs = dict(input_ids=ids.to(device), position_ids=pos.to(device), logits_to_keep=keep.to(device))
        return model(**inputs, use_cache=False, **extra).logits


def _mask_for(model, mask: torch.Tensor) -> torch.Tensor:
    """The ancestor mask as the model's attention takes it: bool for SDPA; an additive float
    mask (0 seen, dtype min hidden) otherwise. transformers passes a 4D mask through as it is,
    and eager attention adds it to the scores, so a bool mask there added 1 to the seen scores
    and hid nothing: packed log-probs off by up to 0.28 on a tiny Llama, with no error."""
    core = core_model(model)
    if core is None or getattr(core.config, "_attn_implementation", None) == "sdpa":
        return mask
    dtype = next(core.parameters()).dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def packed_response_logprobs(
    model, seqs: list[list[int]], response_lens: list[int], pad_id: int, temperature: float, entropy: bool = False
):
    """`engine.response_logprobs` with shared prompts run once: the same contract.

    seqs: B token lists (prompt + response, prompt non-empty) -> logprobs (B, R), response_mask
    (B, R) with R = max(response_lens); row i's response occupies its last response_lens[i]
    columns; masked columns hold 0. With `entropy`, a third (B, R) tensor, without gradient: the
    entropy of the model's next-token distribution at each response position (same layout).
    """
    if any(n >= len(s) for s, n in zip(seqs, response_lens)):
        raise ValueError("every sequence needs at least one prompt token before its response")
    trees, groups = pack(seqs)
    device = next(model.parameters()).device  # also for wrapped models (DDP, DeepSpeed, peft)
    # which node predicts each response token: its parent in the sequence's path
    row_of, node_of, target = [], [], []
    seq_of, col_of = [], []
    R = max(response_lens)
    for r, (tree, group) in enumerate(zip(trees, groups)):
        for i, path in zip(group, tree.paths):
            start = len(path) - response_lens[i]
            row_of += [r] * response_lens[i]
            node_of += path[start - 1 : len(path) - 1]
            target += seqs[i][start:]
            seq_of += [i] * response_lens[i]
            col_of += range(R - response_lens[i], R)
    keep = torch.zeros((len(trees), max(len(t.tokens) for t in trees)), dtype=torch.bool)
    keep[row_of, node_of] = True
    # the kept positions come back flattened in row-major order: a node's index among them
    index = torch.full(keep.shape, -1, dtype=torch.long)
    index[keep] = torch.arange(int(keep.sum()))
    logits = packed_logits(model, trees, pad_id, keep, device)  # (K, V)
    picked = index[row_of, node_of].to(device)  # a branching node's logits serve each of its children
    # index_select, not logits[picked]: with repeated indices the latter's backward is
    # index_put_(accumulate=True), whose multi-threaded CPU kernel adds with float atomics in
    # scheduling order, so the weights depended on the load (index_add_ sums in index order)
    rows = logits.index_select(0, picked)
    chosen = token_logprobs(rows, torch.tensor(target, device=device), temperature=temperature)
    out = torch.zeros((len(seqs), R), dtype=chosen.dtype, device=device)
    out[seq_of, col_of] = chosen
    lens = torch.tensor(response_lens, device=device)
    response_mask = torch.arange(R, device=device)[None, :] >= (R - lens)[:, None]
    if not entropy:
        return out, response_mask
    with torch.no_grad():  # a measure only: a collapsing policy shows it first
        node_entropy = token_entropy(logits.detach(), temperature=temperature)  # (K,), one per kept node
        per_token = torch.zeros_like(out)
        per_token[seq_of, col_of] = node_entropy.index_select(0, picked)
    return out, response_mask, per_token
