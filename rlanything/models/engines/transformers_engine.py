"""The transformers engine: batched `model.generate` that returns token ids and per-token log-probs.

`TransformersEngine` implements `GenerationEngine` (models/engines/generation.py), as `VllmEngine`
(models/engines/vllm_engine.py) does over a vLLM server; `make_engine` (models/engines/make.py) picks
one from a config section. Log-probs are those of the temperature-scaled distribution
(log_softmax(logits / T)), without top-p truncation, computed from the same forward pass that
sampled the token; the trainer computes new log-probs the same way (`response_logprobs`), so PPO
ratios compare like with like (measured here: same precision, same code path). Where a batch's KV
comes from (rows kept from an earlier call, one prefix-tree forward, or a plain prefill) is
models/engines/kv_planner.py's; the decode loop is models/engines/decode.py's. Generation checks
for a stop request (`rlanything.stopping`) before each batch and at every decoding step, scoring
before each batch: Ctrl-C ends a step within one forward.
"""

from __future__ import annotations

from collections.abc import Callable

import psutil
import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList

from rlanything import memory, stopping
from rlanything.algo.losses import token_logprobs
from rlanything.models.engines.decode import Decoder, full_attention, positions
from rlanything.models.engines.generation import Generation, eos_ids, finish, left_pad
from rlanything.models.engines.kv_planner import KvPlanner, kv_size
from rlanything.models.engines.prefix_attention import SharedPrefix, shared_prefix_attention
from rlanything.models.footprint import forward_bytes, kv_bytes_per_token
from rlanything.models.training.packing import packed_response_logprobs

MIN_SHARED = 8  # a call's prompts sharing fewer leading tokens decode without a SharedPrefix
KV_COPIES = 2  # copies of a decoding row's KV alive at once (`TransformersEngine.row_bytes`)


def last_logprobs(model, ids, attn, width: int, temperature: float, cache: DynamicCache | None = None) -> torch.Tensor:
    """Log-probs (B, width) of the last `width` tokens of each row of ids (B, L), teacher-forced.
    With `cache` holding the KV of the first K columns, only columns K: are fed. Only the last
    width+1 positions go through the LM head (`logits_to_keep`)."""
    start = cache.get_seq_length() if cache is not None else 0
    # no cache given: none is built either (an unread KV of every layer, as in packing.packed_logits)
    past = {"use_cache": False} if cache is None else {"cache": cache}
    logits = model(
        input_ids=ids[:, start:],
        attention_mask=attn,
        position_ids=positions(attn)[:, start:],
        logits_to_keep=width + 1,
        **past,
    ).logits
    return token_logprobs(logits[:, :-1].float(), ids[:, -width:], temperature=temperature)


def response_logprobs(
    model, seqs: list[list[int]], response_lens: list[int], pad_id: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the last `response_lens[i]` tokens of each sequence.

    seqs: B token lists (prompt + response) -> logprobs (B, R), response_mask (B, R) with
    R = max(response_lens); row i's response occupies its last response_lens[i] columns.
    The trainer and `score` use `packing.packed_response_logprobs` (shared prefixes once); this
    left-padded form is the reference it is tested against.
    """
    ids, attn = left_pad(seqs, pad_id)
    device = next(model.parameters()).device  # also for wrapped models (DDP, DeepSpeed, peft)
    ids, attn = ids.to(device), attn.to(device)
    width = max(response_lens)
    logprobs = last_logprobs(model, ids, attn, width, temperature)
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
        stopping.check()  # once per decoding step: a stop never waits for a whole batch
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

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 32,
        on_batch: Callable[[int], None] | None = None,
        weights: str = "",
        keep_bytes: float = float("inf"),
    ):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.kv = KvPlanner(model, tokenizer.pad_token_id, keep_bytes)  # keep_bytes: config kv_reuse_gb
        self.weights = weights  # the folder the model was loaded from (recorded with every sample)
        self.on_batch = on_batch or (lambda n: None)
        self.eos_ids = eos_ids(model.generation_config.eos_token_id, tokenizer)
        self.pad_id = tokenizer.pad_token_id
        self.continuous = full_attention(model.config)  # sliding windows: model.generate

    @staticmethod
    def _by_length(prompts: list[list[int]]) -> list[int]:
        """Prompt indices, shortest prompt first (less padding; later prompts reuse earlier KV)."""
        return sorted(range(len(prompts)), key=lambda i: len(prompts[i]))

    def _batches(self, prompts: list[list[int]]) -> list[list[int]]:
        order = self._by_length(prompts)
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def row_kv_bytes(self, longest: int) -> int:
        """Bytes of one row's KV at `longest` columns."""
        size = next(self.model.parameters()).element_size()
        return kv_bytes_per_token(self.model.config, size) * longest

    def row_bytes(self, longest: int) -> int:
        """What one decoding row of `longest` tokens takes at once (models/footprint.py): its KV
        twice (a rebuild of the batch, as rows join or leave, copies it whole while the old
        buffer lives), its admission forward and its sampling logits."""
        forward = forward_bytes(self.model.config, 1, longest, 1, False)
        return KV_COPIES * self.row_kv_bytes(longest) + forward

    def rows_at_once(self, longest: int) -> int:
        """How many rows decode together: `batch_size`, fewer if their memory (`row_bytes`) would
        take more than a quarter of the free memory of the model's device
        (`torch.cuda.mem_get_info`; on the CPU, psutil's available memory) or, on the CPU, more
        than the process's memory budget leaves (`memory.headroom_bytes`). Each admission asks
        the budget again (`_room`). MemoryBudgetError where it leaves room for no row at all."""
        per_row = self.row_bytes(longest)
        if self.model.device.type == "cuda":
            return max(1, min(self.batch_size, int(torch.cuda.mem_get_info(self.model.device)[0] / 4 // per_row)))
        headroom = memory.headroom_bytes()
        if headroom < per_row:
            raise memory.over_budget(f"decoding one row of {longest} tokens", per_row)
        free = min(psutil.virtual_memory().available / 4, headroom)
        return max(1, min(self.batch_size, int(free // per_row)))

    def _room(self, longest: int, free: int, decoder: Decoder, keeping: float) -> int:
        """How many of `free` rows may join the decode now (the CPU's budget; `free` elsewhere).
        Admitting n rows beside L live ones holds at once: the live buffer (in the resident
        memory already), a new buffer of L + n rows at up to `longest` columns, and per new row
        one more copy of its KV (the reused rows' gather, DynamicCache's concatenation) and its
        admission forward: need(n) = L·kv + n·(row_bytes + kv). Asked at every admission, of
        what the budget leaves now less `keeping` (KV this call may still keep for the next):
        kept rows, ended rows' buffers and the allocator's freed memory come and go between
        them. 0: wait for live rows to end."""
        if self.model.device.type == "cuda" or memory.budget_bytes() == float("inf"):
            return free
        kv = self.row_kv_bytes(longest)
        left = memory.headroom_bytes() - keeping - decoder.live * kv
        fits = int(max(left, 0) // (self.row_bytes(longest) + kv))
        if fits == 0 and not decoder.live and not keeping:
            raise memory.over_budget(f"decoding one row of {longest} tokens", self.row_bytes(longest) + kv)
        return min(free, fits)

    def _scoring_batches(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[list[int]]:
        """`score`'s batches: `batch_size` prompts in order of length, each cut further (on the
        CPU) where its forward would take more than the memory budget leaves, counted as a
        left-padded batch (an upper bound of its packed forward). MemoryBudgetError where one
        sequence alone does not fit."""
        if self.model.device.type == "cuda":
            return self._batches(prompts)

        def need(rows: list[int]) -> int:
            width = max(len(prompts[i]) + len(continuations[i]) for i in rows)
            kept = sum(len(continuations[i]) + 1 for i in rows)
            return forward_bytes(self.model.config, len(rows), width, kept, False)

        def what(i: int) -> str:
            return f"scoring a sequence of {len(prompts[i]) + len(continuations[i])} tokens"

        return [
            batch
            for idx in self._batches(prompts)
            for batch in memory.cut_to_fit(idx, need, memory.headroom_bytes(), what)
        ]

    @property
    def decodes_choices(self) -> bool:
        """Whether `generate` decodes a `Choice` in its pass: the continuous decoder does,
        `model.generate`'s fixed batches (sliding-window models) do not."""
        return self.continuous

    @torch.no_grad()
    def generate(
        self, prompts, *, max_new_tokens, temperature, top_p, seed, prefix_cache=None, choice=None, row_ids=None
    ):
        """Continuous batching (`models.engines.decode`): prompts join in order of length as rows end;
        samples follow the decode module's seed rule (row i of the call, or row `row_ids[i]` of
        the call a shard was cut from: its own noise stream). `choice`: a `Choice` appended to
        every row in the same pass. Models with sliding-window layers decode in fixed batches
        with `model.generate`, whose noise depends on the batch: they cannot be sharded."""
        if not self.continuous:
            if choice is not None:
                raise ValueError("sliding-window models decode no Choice (decodes_choices is False)")
            if row_ids is not None:
                raise ValueError("sliding-window models sample per batch: their generation cannot be sharded")
            return self._generate_fixed(prompts, max_new_tokens, temperature, top_p, seed)
        if max_new_tokens == 0 and choice is None:
            return [Generation([], [], "", "length") for _ in prompts]
        with shared_prefix_attention(self.model) as shares:
            prefix = self._shared_prefix(prompts) if shares else None
            decoder = Decoder(
                self.model, self.eos_ids, max_new_tokens, temperature, top_p, seed, choice, prefix, row_ids
            )
            return self._decode(decoder, prompts, prefix_cache, choice)

    def _decode(self, decoder: Decoder, prompts, prefix_cache, choice):
        """`generate`'s loop: admit prompts as rows free up and the budget allows, step, collect
        the ended rows. The last call's kept rows are let go once every prompt has joined: only
        this call's rows can serve the next call."""
        pending = self._by_length(prompts)
        longest = max(map(len, prompts)) - decoder.offset + decoder.reserve
        rows = self.rows_at_once(longest)
        results: list[Generation | None] = [None] * len(prompts)
        kept = []  # this call's rows for the next call's prefix_cache (and its own later prompts)
        # KV this call may keep: kv_reuse_gb, at most a quarter of the budget (run.memory_gb's doc;
        # the one place of the rule: an unbounded keep_bytes would reserve the whole budget)
        limit = min(self.kv.keep_bytes, memory.budget_bytes() / 4) if prefix_cache is not None else 0.0
        waiting = len(prompts) + 1  # live rows when the budget last said no: ask again once one ends
        while pending or decoder.live:
            stopping.check()
            free, take = rows - decoder.live, 0
            if pending and (free >= max(1, rows // 4) or not decoder.live) and decoder.live < waiting:
                keeping = max(0.0, limit - kv_size(kept))
                take = self._room(longest, free, decoder, keeping)
                if not take and not decoder.live:  # the budget keeps no more rows this call
                    limit = kv_size(kept)
                    take = self._room(longest, free, decoder, 0.0)
                waiting = len(prompts) + 1 if take else decoder.live
            if take:
                now, pending = pending[:take], pending[take:]
                batch = [prompts[i] for i in now]
                ended = decoder.admit(now, *self.kv.prefill(batch, prefix_cache, kept, decoder.prefix))
                if not pending and prefix_cache is not None:
                    prefix_cache.rows = []
            else:
                ended = decoder.step()
            for slot in ended:
                row = decoder.rows[slot]
                results[row.index] = self._result(row, choice)
                if prefix_cache is not None:
                    kept += self.kv.keep_row(decoder, slot, prompts[row.index] + row.tokens, kept, limit)
            self.on_batch(len(ended))
        if prefix_cache is not None:
            prefix_cache.rows = kept
        return results

    def _result(self, row, choice) -> Generation:
        """An ended row's Generation: its text and why it stopped, or its Choice's option."""
        if choice is None:
            return finish(row.tokens, row.logprobs, self.eos_ids, self.tokenizer)
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        return Generation(row.tokens, row.logprobs, text, "stop" if row.stopped else "length", row.choice)

    def _shared_prefix(self, prompts: list[list[int]]) -> SharedPrefix | None:
        """The KV of the leading tokens all prompts share (all but one token of the shortest),
        from one forward over them; None if fewer than MIN_SHARED."""
        shortest = min(prompts, key=len)
        n = 0
        while n < len(shortest) - 1 and all(p[n] == shortest[n] for p in prompts):
            n += 1
        if n < MIN_SHARED:
            return None
        need = kv_bytes_per_token(self.model.config, 4) * n + forward_bytes(self.model.config, 1, n, 1, False)
        if self.model.device.type == "cpu" and need > memory.headroom_bytes():
            raise memory.over_budget(f"the {n} tokens every prompt shares", need)
        cache = DynamicCache(config=self.model.config)
        ids = torch.tensor([shortest[:n]], device=self.model.device)
        self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        return SharedPrefix([layer.keys[0] for layer in cache.layers], [layer.values[0] for layer in cache.layers])

    def _generate_fixed(self, prompts, max_new_tokens, temperature, top_p, seed):
        """Fixed batches through `model.generate` (sliding-window caches): `batch_size` prompts
        at a time, `torch.manual_seed(seed + batch)`, no KV kept between calls."""
        # temperature 0 is greedy decoding (evaluation): argmax tokens, log-probs at temperature 1
        sampling = (
            dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
            if temperature > 0
            else dict(do_sample=False)
        )
        config = GenerationConfig(
            **sampling, max_new_tokens=max_new_tokens, pad_token_id=self.pad_id, eos_token_id=self.eos_ids
        )
        results: list[Generation | None] = [None] * len(prompts)
        for b, idx in enumerate(self._batches(prompts)):
            stopping.check()
            ids, attn = left_pad([prompts[i] for i in idx], self.pad_id)
            torch.manual_seed(seed + b)
            recorder = StepLogprobs(temperature if temperature > 0 else 1.0)
            sequences = self.model.generate(
                input_ids=ids.to(self.model.device),
                attention_mask=attn.to(self.model.device),
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]),
            )
            new = sequences[:, ids.shape[1] :]  # (B, S)
            logprobs = recorder.finish(new)  # (B, S), from the logits that sampled each token
            for row, i in enumerate(idx):
                results[i] = finish(new[row].tolist(), logprobs[row].tolist(), self.eos_ids, self.tokenizer)
            self.on_batch(len(idx))
        return results

    @torch.no_grad()
    def score(self, prompts, continuations, *, temperature, prefix_cache=None):
        out: list[list[float] | None] = [None] * len(prompts)
        for idx in self._scoring_batches(prompts, continuations):
            stopping.check()
            seqs = [prompts[i] + continuations[i] for i in idx]
            lens = [len(continuations[i]) for i in idx]
            reused = self.kv.scoring(seqs, [prompts[i] for i in idx], prefix_cache)
            if reused is None:  # shared prefixes (the m judgments of a step, both verdicts) run once
                logprobs, _ = packed_response_logprobs(self.model, seqs, lens, self.pad_id, temperature)
            else:  # only the prompts' unseen tokens and the continuations go through the model
                cache, ids, attn = reused
                logprobs = last_logprobs(self.model, ids, attn, max(lens), temperature, cache)
            for row, i in enumerate(idx):
                out[i] = logprobs[row, logprobs.shape[1] - lens[row] :].tolist()
        return out
