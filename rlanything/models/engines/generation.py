"""What every generation engine shares: the `GenerationEngine` protocol (the seam), what it returns
(`Generation`), the KV a multi-turn caller keeps between calls (`PrefixCache`), and the end-of-turn
helpers (`eos_ids`, `finish`) both engines use.

The engines: `TransformersEngine` (models/engines/transformers_engine.py) and `VllmEngine` (models/engines/vllm_engine.py);
`make_engine` (models/engines/make.py) builds the one a config section names. Neither engine
imports the other: a new engine needs only this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import GenerationConfig


@dataclass
class Generation:
    """One prompt's continuation: its token ids (up to and including the first EOS id), the
    log-prob of each as sampled, the decoded text and why it ended (`finish`)."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (hit EOS) | "length" (hit max_new_tokens) | an engine's own reason ("abort")
    choice: int | None = None  # the option a `Choice` picked (engines that decode choices)


@dataclass(frozen=True)
class Choice:
    """Fixed tokens to append to every generation, with one decision in them: `opener`, then one
    of `options` (value -> tokens) drawn from the model's own probabilities of the options' first
    tokens right after the opener (renormalised over the options; the first tokens must differ),
    then `closer`. An EOS that ends the generation is replaced by the opener. The appended tokens
    carry the model's log-probs like sampled ones. The constrained verdict (models/judge.py):
    opener "\n\\boxed{", options {1: "1", -1: "-1"}, closer "}". Engines that can, decode it
    in the same pass (`decodes_choices`); the judge scores both options afterwards otherwise."""

    opener: list[int]
    options: dict[int, list[int]]
    closer: list[int]

    def probabilities(self, first_logprobs: torch.Tensor) -> torch.Tensor:
        """(K,) each option's probability, its first token's renormalised over the options, in
        `options`' order: the distribution `pick` draws from. Example: log [0.2, 0.6] -> [0.25, 0.75]."""
        return torch.softmax(first_logprobs, 0)

    def pick(self, first_logprobs: torch.Tensor, u: float | torch.Tensor) -> int:
        """The option drawn with the uniform `u`: the first option (in `options`' order) whose
        cumulative probability, renormalised over the options, exceeds u; for {1, -1}: 1 iff
        u < p(1) / (p(1) + p(-1)). The one verdict rule: the engine that decodes a Choice draws u
        from the row's noise stream (models/engines/decode.py), the judge's fallback from its own
        `random.Random(seed)` (models/judge.py).
        first_logprobs (K,): each option's first token's log-prob under temperature T, in
        `options`' order; computed in their dtype. Example: log [0.2, 0.6] -> [0.25, 0.75]
        renormalised; u 0.1 -> the first option, u 0.3 -> the second."""
        cdf = self.probabilities(first_logprobs).cumsum(0)
        u = torch.as_tensor(u).reshape(1).to(cdf)
        return list(self.options)[int(torch.searchsorted(cdf, u, right=True).clamp(max=len(cdf) - 1))]


@dataclass
class PrefixCache:
    """The KV cache of the rows a multi-turn caller generated in its last call, kept for the next.

    Turn t's prompt is turn t-1's prompt + the reply + the new observation, so its longest
    common prefix with a kept row (prompt + generated tokens) needs no prefill: prefill per
    turn grows with the new tokens, not with the whole history. Within one call, a batch also
    reuses the rows of the call's earlier batches (batches run shortest prompts first: the RM's
    judgment of step k+1 repeats the history it judged at step k). The KV is only valid for the
    weights that computed it: a caller owns one for one rollout (`rollout.play`) or one set of
    judgments (`judge.judge_steps`: the constrained verdict scores prompt + reasoning again)
    and never keeps it across an update. The engine keeps rows up to its byte budget (memory on
    the model's device); rows past it are prefilled again. Engines without such a cache ignore
    it (vLLM caches prefixes itself).
    rows: (tokens, keys (layers, kv_heads, n, head_dim), values) per kept row;
    prompt_tokens, reused_tokens: of the prompts generated with this cache so far, all their
    tokens and those whose KV came from a kept row (the rollout and rm_score metrics)."""

    rows: list[tuple[list[int], torch.Tensor, torch.Tensor]] = field(default_factory=list)
    prompt_tokens: int = 0
    reused_tokens: int = 0

    def match(self, prompts: list[list[int]]) -> list[tuple[int, int]]:
        """-> (kept row, reusable tokens) per prompt: the kept row with the longest common
        prefix, capped at len(prompt) - 1 so generate still has a token to feed."""
        if not self.rows:
            return [(0, 0)] * len(prompts)
        kept, _ = left_pad([t[::-1] for t, _, _ in self.rows], -1)  # right-padded with -1
        new, _ = left_pad([p[::-1] for p in prompts], -2)
        kept, new = kept.flip(-1), new.flip(-1)
        width = min(kept.shape[1], new.shape[1])
        chunk = max(1, 2**24 // (len(self.rows) * (width + 1)))  # bounds the (chunk, rows, width) comparison
        found = []
        for start in range(0, len(prompts), chunk):
            equal = new[start : start + chunk, None, :width] == kept[None, :, :width]
            mismatch = torch.cat([~equal, equal.new_ones(equal.shape[:2] + (1,))], -1)
            found.append(mismatch.to(torch.uint8).argmax(-1))  # first mismatch = common prefix length
        common = torch.cat(found)  # (N, rows)
        length, row = common.max(dim=1)
        return [(int(r), min(int(k), len(p) - 1)) for r, k, p in zip(row, length, prompts)]


class GenerationEngine(Protocol):
    """Batched sampling and teacher-forced scoring with per-token log-probs: what the rollout,
    the judge and the rewriters use of an engine (`make_engine` builds one)."""

    @property
    def eos_ids(self) -> list[int]:
        """The token ids that end a generation (sorted): a generation stops after the first, and
        `Generation.token_ids` keeps it (`finish`). Callers strip them from a reply they feed back."""
        ...

    @property
    def weights(self) -> str:
        """The checkpoint folder whose weights produced (and will produce) the samples: the steps
        that sample record it with every sample (`weights_label`)."""
        ...

    @property
    def decodes_choices(self) -> bool:
        """Whether `generate` decodes a `Choice` in its own pass. False: `generate` refuses a
        choice, and the judge scores the options after the generation instead (`score`)."""
        ...

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
        prefix_cache: PrefixCache | None = None,
        choice: Choice | None = None,
        row_ids: list[int] | None = None,
    ) -> list[Generation]:
        """One `Generation` per prompt (token ids in; token ids and the log-prob of each under
        log_softmax(logits / T), without top-p truncation, out); the same `seed` repeats the
        samples. `prefix_cache`: the caller's KV of its last call (engines that cache prefixes
        themselves ignore it). `choice`: a `Choice` appended to every generation, its option in
        `Generation.choice` (engines with `decodes_choices` only; the others raise ValueError).
        `row_ids`: each prompt's index in the whole call a shard was cut from (models/engines/shards.py),
        which picks its noise stream; None: its place in this call."""
        ...

    def score(
        self,
        prompts: list[list[int]],
        continuations: list[list[int]],
        *,
        temperature: float,
        prefix_cache: PrefixCache | None = None,
    ) -> list[list[float]]:
        """Teacher-forced log-probs of each continuation after its prompt."""
        ...


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> input_ids (B, L), attention_mask (B, L); left padding keeps sequence ends aligned."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids, mask


def eos_ids(generation_eos: int | list[int] | None, tokenizer) -> list[int]:
    """The ids that end a generation: a generation config's `eos_token_id` (one id, a list or
    None) plus the tokenizer's, sorted."""
    eos = generation_eos if isinstance(generation_eos, list) else [] if generation_eos is None else [generation_eos]
    return sorted(set(eos) | {tokenizer.eos_token_id})


def eos_ids_of(model_dir, tokenizer) -> list[int]:
    """`eos_ids` of a model folder (its generation_config.json, if any), without loading the model."""
    try:
        eos = GenerationConfig.from_pretrained(model_dir, local_files_only=True).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    return eos_ids(eos, tokenizer)


def finish(
    tokens: list[int], logprobs: list[float], eos: list[int], tokenizer, reason: str | None = None
) -> Generation:
    """A `Generation` from sampled tokens, cut after the first EOS id (kept, it ends the turn).

    finish_reason is "stop" when an EOS id ended it; otherwise the engine's own `reason` if it
    gave one (vLLM's "stop", "length" or "abort"), else "length" (max_new_tokens reached)."""
    end = next((k for k, t in enumerate(tokens) if t in eos), None)
    keep = len(tokens) if end is None else end + 1
    text = tokenizer.decode(tokens[:keep], skip_special_tokens=True)
    return Generation(tokens[:keep], logprobs[:keep], text, "stop" if end is not None else reason or "length")
