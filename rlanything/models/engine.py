"""Generation engines: batched sampling that returns token ids and per-token log-probs.

`GenerationEngine` is the seam: `TransformersEngine` here, `VllmEngine` (models/vllm_engine.py)
over a vLLM server; `make_engine` picks one from a config section. Log-probs are those of the
temperature-scaled distribution (log_softmax(logits / T)), without top-p truncation, computed
from the same forward pass that sampled the token; the trainer computes new log-probs the same
way (`response_logprobs`), so PPO ratios compare like with like (stack.md: same precision,
same code path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList

from rlanything.algo.losses import token_logprobs


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (hit EOS) | "length" (hit max_new_tokens)


class GenerationEngine(Protocol):
    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float, seed: int
    ) -> list[Generation]: ...

    def score(self, prompts: list[list[int]], continuations: list[list[int]], *, temperature: float) -> list[list[float]]:
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


def response_logprobs(
    model, seqs: list[list[int]], response_lens: list[int], pad_id: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the last `response_lens[i]` tokens of each sequence.

    seqs: B token lists (prompt + response) -> logprobs (B, R), response_mask (B, R) with
    R = max(response_lens); row i's response occupies its last response_lens[i] columns.
    Only the last R+1 positions go through the LM head (`logits_to_keep`).
    """
    ids, attn = left_pad(seqs, pad_id)
    device = next(model.parameters()).device  # also for wrapped models (DDP, DeepSpeed, peft)
    ids, attn = ids.to(device), attn.to(device)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)  # as generate() does for left padding
    width = max(response_lens)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids, logits_to_keep=width + 1).logits
    logprobs = token_logprobs(logits[:, :-1].float(), ids[:, -width:], temperature)
    lens = torch.tensor(response_lens, device=ids.device)
    mask = torch.arange(width, device=ids.device)[None, :] >= (width - lens)[:, None]
    return logprobs, mask


class StepLogprobs(LogitsProcessor):
    """Records log_softmax(logits / T)[sampled token] one decoding step at a time.

    Placed as a custom logits processor it runs before generate's temperature and top-p
    warpers, so it sees the logits `output_logits=True` would return — without keeping all
    S steps' (B, V) float32 logits until the end (B=64, S=256, V=152k: 10 GB). It holds one
    step's scaled logits and turns them into the sampled token's log-prob at the next call,
    when that token is known (the last one in `finish`).
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []  # (B,) per generated token
        self.pending: torch.Tensor | None = None  # (B, V) scaled logits of the token being sampled

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self._record(input_ids[:, -1])
        self.pending = scores.float() / self.temperature  # a copy: later warpers cannot alter it
        return scores

    def _record(self, tokens: torch.Tensor) -> None:
        z = self.pending
        self.steps.append(z.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1))

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """new_tokens (B, S) -> log-probs (B, S)."""
        self._record(new_tokens[:, len(self.steps)])
        return torch.stack(self.steps, dim=1)


class TransformersEngine:
    """Batched `model.generate` on CPU or GPU, sorted by prompt length to limit padding."""

    def __init__(self, model, tokenizer, batch_size: int = 32, on_batch: Callable[[int], None] | None = None,
                 weights: str = ""):  # fmt: skip
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.weights = weights  # the folder the model was loaded from (recorded with every sample)
        self.on_batch = on_batch or (lambda n: None)
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.eos_ids = sorted(eos | {tokenizer.eos_token_id})
        self.pad_id = tokenizer.pad_token_id

    def _batches(self, prompts: list[list[int]]) -> list[list[int]]:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seed):
        config = GenerationConfig(
            do_sample=True, temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens,
            pad_token_id=self.pad_id, eos_token_id=self.eos_ids,
        )  # fmt: skip
        results: list[Generation | None] = [None] * len(prompts)
        for b, idx in enumerate(self._batches(prompts)):
            ids, attn = left_pad([prompts[i] for i in idx], self.pad_id)
            ids, attn = ids.to(self.model.device), attn.to(self.model.device)
            cache = self._shared_prefill(ids, attn)
            torch.manual_seed(seed + b)
            recorder = StepLogprobs(temperature)
            sequences = self.model.generate(
                input_ids=ids, attention_mask=attn, past_key_values=cache,
                generation_config=config, logits_processor=LogitsProcessorList([recorder]),
            )  # fmt: skip
            new = sequences[:, ids.shape[1] :]  # (B, S)
            logprobs = recorder.finish(new)  # (B, S), from the logits that sampled each token
            for row, i in enumerate(idx):
                results[i] = self._finish(new[row].tolist(), logprobs[row].tolist())
            self.on_batch(len(idx))
        return results

    def _shared_prefill(self, ids: torch.Tensor, attn: torch.Tensor) -> DynamicCache | None:
        """KV cache of every row's prompt but its last token, computed once per distinct prompt
        and copied to the rows that repeat it -> None when no prompt repeats.

        The G rollouts of a task share their first prompt and the m judgments of a step share
        theirs, so a batch is mostly repeats: without this, generate would run the same prefill
        G (or m) times. generate then feeds only the last prompt token on top of the cache.
        ids, attn: (B, L) left-padded."""
        slot: dict[tuple, int] = {}  # distinct prompt -> its index among the distinct ones
        source = [slot.setdefault(tuple(r), len(slot)) for r in ids.tolist()]  # row -> its prompt's index
        if len(slot) == len(source) or ids.shape[1] < 2:
            return None
        unique = torch.tensor([source.index(k) for k in range(len(slot))], device=ids.device)  # first rows
        prefix_ids, prefix_attn = ids[unique, :-1], attn[unique, :-1]
        cache = DynamicCache(config=self.model.config)
        self.model(input_ids=prefix_ids, attention_mask=prefix_attn, past_key_values=cache, use_cache=True,
                   position_ids=(prefix_attn.cumsum(-1) - 1).clamp(min=0), logits_to_keep=1)  # fmt: skip
        cache.reorder_cache(torch.tensor(source, device=ids.device))  # index_select: row r gets its prompt's cache
        return cache

    def _finish(self, tokens: list[int], logprobs: list[float]) -> Generation:
        end = next((k for k, t in enumerate(tokens) if t in self.eos_ids), None)
        reason = "length" if end is None else "stop"
        keep = len(tokens) if end is None else end + 1
        text = self.tokenizer.decode(tokens[:keep], skip_special_tokens=True)
        return Generation(tokens[:keep], logprobs[:keep], text, reason)

    @torch.no_grad()
    def score(self, prompts, continuations, *, temperature):
        out: list[list[float] | None] = [None] * len(prompts)
        for idx in self._batches(prompts):
            seqs = [prompts[i] + continuations[i] for i in idx]
            lens = [len(continuations[i]) for i in idx]
            logprobs, _ = response_logprobs(self.model, seqs, lens, self.pad_id, temperature)
            for row, i in enumerate(idx):
                out[i] = logprobs[row, logprobs.shape[1] - lens[row] :].tolist()
        return out


def eos_ids_of(model_dir, tokenizer) -> list[int]:
    """EOS ids of a model folder: its generation config's plus the tokenizer's."""
    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(eos | {tokenizer.eos_token_id})


def make_engine(section, role: str, model_dir, on_batch: Callable[[int], None] | None = None, log_path=None):
    """The engine a config section (policy or rm) names, serving the weights in `model_dir`
    -> (engine, tokenizer). `role` keys the process-wide vLLM server ("policy", "rm")."""
    from rlanything.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    if section.engine == "transformers":
        model = load_model(model_dir, section.dtype)
        if torch.cuda.is_available():
            model.cuda()
        return TransformersEngine(model, tokenizer, section.batch_size, on_batch, weights=str(model_dir)), tokenizer
    from rlanything.models.vllm_engine import VllmEngine, shared_server

    server = shared_server(role, section.vllm, model_dir, section.dtype, log_path)
    engine = VllmEngine(server, tokenizer, eos_ids_of(model_dir, tokenizer), section.vllm.concurrency, on_batch)
    return engine, tokenizer
