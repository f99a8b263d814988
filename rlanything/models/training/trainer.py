"""PPO-clip passes over a batch of samples (policy and RM alike, docs/method.md, "Loss").

Each pass (epoch) shuffles the samples (seeded) and splits them into `updates` mini-batches, one
optimizer step each; every mini-batch is processed in micro-batches whose losses are weighted
by their share of the mini-batch, so the gradient equals the mini-batch's mean over sequences
whatever the micro-batch size. Within a mini-batch, samples are ordered by prompt so those
sharing one land in the same micro-batch, whose forward runs each shared prefix once
(`models.training.packing`). The ratio and the k3 KL are both taken against the pre-update model's
log-probs: the ones the engine recorded while generating (the paper), or, with
`recompute_old`, the trainer's own, teacher-forced over every sample before the first step in
the update's precision (`algo.old_logprobs`: a sampler in bf16 gives each token a log-prob a
little off the trainer's). Then the sampler's stay beside them: each step measures the gap
(`algo.mismatch.mismatch_measures`) and, with `tis_cap`, weighs each token's PPO term by the
truncated ratio (`algo.mismatch.tis_weights`). `precision` bf16 runs forward and backward under
bf16 autocast; the weights and AdamW stay fp32. With `anchor_beta` each sample also carries the
run's starting weights' log-probs (`with_anchor_logprobs`) and the loss adds a k3 KL towards
them (our departure, `optim.anchor_beta`). The paper takes one pass; more
(`optim.epochs`) reuse each generated token, the clip keeping later passes near the sampler.
A micro-batch holds up to `micro_batch_size` samples, fewer where their forward would take more
than the process's memory budget leaves (`micro_batches`): the same gradient, summed in more parts.

Where the arithmetic runs is a small seam, `TrainBackend`: `TorchBackend` (one process, plain
autograd, the default) or `rlanything.models.training.distributed.AccelerateBackend` (DDP or DeepSpeed
ZeRO under `accelerate launch`). The loss code below is the same for both; with N processes
each takes every N-th sample of a mini-batch and weighs its losses by N / mini-batch size, so
the all-reduced (averaged) gradient is still the mini-batch's mean over sequences.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch

from rlanything import memory
from rlanything.algo.losses import masked_sequence_mean, ppo_clip_loss
from rlanything.algo.mismatch import REPORT_CAP, mismatch_measures, tis_weights
from rlanything.models.footprint import forward_bytes
from rlanything.models.training import tree_attention
from rlanything.models.training.packing import pack, packed_response_logprobs


@dataclass
class Sample:
    input_ids: list[int]  # prompt + response
    response_len: int
    old_logprobs: list[float]  # (response_len,): the pre-update model's (the sampler's, or recomputed)
    advantage: float
    sampler_logprobs: list[float] | None = None  # the sampler's, where old_logprobs were recomputed
    # (response_len,): which response tokens the loss reads; None: all. False marks a token the
    # model did not choose (the constrained verdict's forced ones, `judge.chosen_tokens`).
    trained: list[bool] | None = None
    # (response_len,): the run's starting weights' log-probs, read by the anchor KL (optim.anchor_beta)
    anchor_logprobs: list[float] | None = None
    # a judgment an earlier iteration drew (rm.replay_iterations): its sampler log-probs are an
    # older model's, so they are not kept beside the recomputed ones and do not measure the gap
    replayed: bool = False
    # samples of one unit share every mini-batch (`epoch_mini_batches`): a judged step's two verdicts
    # under algo.rm_verdicts expected, whose full-softmax normaliser cancels only together. None: alone
    unit: int | None = None
    # samples of one stratum are spread evenly over the mini-batches (`epoch_mini_batches`): the
    # steps paid to say +1 and those paid to say -1 under algo.rm_stratify. None everywhere: not dealt so
    stratum: int | None = None

    def __post_init__(self):
        if self.trained is not None and (len(self.trained) != self.response_len or not any(self.trained)):
            raise ValueError(f"trained marks the {self.response_len} response tokens, at least one True")


def prompt_of(sample: Sample) -> list[int]:
    return sample.input_ids[: len(sample.input_ids) - sample.response_len]


class TrainBackend(Protocol):
    rank: int  # this process's index among world_size processes sharing each mini-batch
    world_size: int

    def accumulate(self, model, sync: bool) -> AbstractContextManager:
        """Context of one micro-batch's forward + backward; `sync` marks the mini-batch's last."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def clip_and_step(self, model, optimizer, max_norm: float) -> float:
        """Clip the global grad norm, take the optimizer step -> the norm before clipping."""
        ...

    def reduce_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over processes."""
        ...


class TorchBackend:
    """One process, plain autograd."""

    rank, world_size = 0, 1

    def accumulate(self, model, sync: bool) -> AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_and_step(self, model, optimizer, max_norm: float) -> float:
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        return float(grad_norm)

    def reduce_sum(self, values: list[float]) -> list[float]:
        return list(values)


def checkpoint_layers(model) -> None:
    """Recompute each decoder layer in the backward instead of keeping its activations
    (`optim.gradient_checkpointing`; transformers' activation checkpointing, non-reentrant, so
    autocast and a frozen LoRA base need nothing more)."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


def layers_checkpointed(model) -> bool:
    """Whether `checkpoint_layers` applies to `model` (also wrapped: DDP, DeepSpeed, peft)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def make_optimizer(model, lr: float, weight_decay: float, state_path: Path | None = None) -> torch.optim.AdamW:
    """AdamW over the trainable weights (all, or LoRA adapters only), resuming its moments
    from `state_path` when that file exists (a checkpoint's `storage.checkpoints.OPTIMIZER_STATE`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # The fused kernel updates each tensor in one pass over its memory; the default multi-tensor
    # path makes ~10 passes. On 2 CPU cores a SmolLM2 step took 2.4 s vs 0.4 s fused, a third
    # of a whole PPO pass (benchmarks/policy_update.py). Same update up to float rounding.
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)
    if state_path is not None and state_path.exists():
        optimizer.load_state_dict(torch.load(state_path, weights_only=True))
        for group in optimizer.param_groups:  # the config may have changed the schedule
            group["lr"], group["weight_decay"] = lr, weight_decay
            group["fused"], group["foreach"] = fused or None, None  # a saved state brings its own flags
    return optimizer


def ppo_update(
    model,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample],
    *,
    pad_id: int,
    temperature: float,
    clip_eps: float,
    kl_beta: float,
    grad_clip: float,
    updates: int,
    micro_batch_size: int,
    seed: int,
    epochs: int = 1,
    lr_at: Callable[[int], float] | None = None,
    on_micro_batch: Callable[[int], None] = lambda n: None,
    backend: TrainBackend | None = None,
    precision: str = "fp32",
    recompute_old: bool = False,
    tis_cap: float | None = None,
    anchor_beta: float = 0.0,
) -> list[dict]:
    """`epochs` passes over `samples`, each reshuffled (seeded) into min(updates, len(samples))
    mini-batches of one optimizer step each (whole units where samples share a `Sample.unit`:
    `epoch_mini_batches`). `lr_at(k)` sets the lr of this call's k-th step (0-based; None keeps
    the optimizer's). `precision` fp32 or bf16 (autocast); `recompute_old`:
    the trainer's own old log-probs (module docstring); `tis_cap`: truncated importance sampling
    against the sampler (needs `recompute_old`); `anchor_beta`: the weight of the KL against the
    samples' anchor_logprobs (`with_anchor_logprobs`). -> one stats dict per optimizer step
    (update_idx, epoch, num_samples, num_tokens, loss, pg_loss, kl, anchor_kl (None without an
    anchor), clip_frac, entropy, grad_norm, lr, and the
    sampler/trainer gap over the step's samples, None without `recompute_old`: mismatch_abs_mean,
    mismatch_abs_max, mismatch_outside_cap), identical on every process. No samples -> no
    step, empty list.

    Worked example: 10 samples, updates 2, epochs 3 -> 6 steps of 5 samples, every sample once
    per epoch. In the first step the weights are the generating model's, so every ratio is 1
    and nothing is clipped; later steps see moved weights, which the clip and the KL restrain.
    """
    if not samples:
        return []
    backend = backend or TorchBackend()
    autocast = autocast_for(model, precision)
    if recompute_old:
        samples = with_trainer_logprobs(model, samples, pad_id, temperature, micro_batch_size, autocast)
    loss_args = dict(
        pad_id=pad_id,
        temperature=temperature,
        clip_eps=clip_eps,
        kl_beta=kl_beta,
        tis_cap=tis_cap,
        anchor_beta=anchor_beta,
    )
    rng = random.Random(seed)  # one stream: the first epoch's order is the same whatever `epochs`
    model.train()
    history = []
    strata = [s.stratum for s in samples] if any(s.stratum is not None for s in samples) else None
    for epoch in range(epochs):
        for mini in epoch_mini_batches(rng, len(samples), updates, [s.unit for s in samples], strata):
            if lr_at is not None:
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(len(history))
            with autocast:
                stats = _minibatch_step(
                    model, optimizer, samples, mini, backend, micro_batch_size, on_micro_batch, grad_clip, **loss_args
                )
            gap = _gap([samples[i] for i in mini], tis_cap or REPORT_CAP)
            history.append({"update_idx": len(history), "epoch": epoch, **stats, **gap})
    model.eval()
    return history


def epoch_mini_batches(
    rng: random.Random, n: int, updates: int, units: list | None = None, strata: list | None = None
) -> list[list[int]]:
    """One pass's mini-batches (sample indices) as `ppo_update` draws them from `rng`: the n
    samples shuffled, then every min(updates, n)-th from k = 0, 1, ...
    Example: n 5, updates 2, order [3, 0, 4, 1, 2] -> [[3, 4, 2], [0, 1]].
    `units` (n,): samples with the same unit (not None) stay in one mini-batch. Then the units are
    shuffled (a sample of unit None is one alone) and dealt the same way, min(updates, units)
    mini-batches. Example: units [0, 0, None, 1, 1], updates 2, unit order [{3, 4}, {2}, {0, 1}]
    -> [[3, 4, 0, 1], [2]]. Without units, or with one mini-batch (nothing to keep together), the
    draws are those of earlier versions: a run resumed across versions reproduces.
    `strata` (n,) (a unit's samples share one): each stratum's units are shuffled on their own and
    dealt on from where the stratum before it stopped (strata in sorted order), so every mini-batch
    holds each stratum's share to within one unit; then the mini-batches' order is shuffled (else
    those holding a small stratum's units would come last in every pass). Example: strata
    [1, 1, -1, -1, -1, -1], updates 2, stratum -1 drawn [5, 3, 2, 4], stratum 1 [1, 0] -> deal
    [5, 3, 2, 4, 1, 0] -> [[5, 2, 1], [3, 4, 0]], their order drawn -> [[3, 4, 0], [5, 2, 1]]."""
    groups: dict = {}
    for i, unit in enumerate(units or [None] * n):
        groups.setdefault(("alone", i) if unit is None else ("unit", unit), []).append(i)
    members = list(groups.values())
    n_mini = min(updates, len(members))
    if strata is not None and n_mini > 1:
        return _stratified_deal(rng, members, strata, n_mini)
    if len(members) == n or n_mini == 1:
        order = rng.sample(range(n), n)
        return [order[k::n_mini] for k in range(n_mini)]
    return _dealt(rng.sample(members, len(members)), n_mini)


def _dealt(order: list[list[int]], n_mini: int) -> list[list[int]]:
    """Groups of sample indices in dealing order -> every n_mini-th group's samples, from k = 0, 1, ..."""
    return [[i for group in order[k::n_mini] for i in group] for k in range(n_mini)]


def _stratified_deal(rng: random.Random, members: list[list[int]], strata: list, n_mini: int) -> list[list[int]]:
    by_stratum: dict = {}
    for group in members:
        (stratum, *others) = {strata[i] for i in group}
        if others:
            raise ValueError(f"samples {group} share a unit but not a stratum")
        by_stratum.setdefault(stratum, []).append(group)
    order = [g for key in sorted(by_stratum, key=str) for g in rng.sample(by_stratum[key], len(by_stratum[key]))]
    return rng.sample(_dealt(order, n_mini), n_mini)


MEASURES = ("loss", "pg_loss", "kl", "clip_frac", "entropy")  # per optimizer step, means over its samples
MISMATCH = ("mismatch_abs_mean", "mismatch_abs_max", "mismatch_outside_cap")  # per step, over its samples' tokens


def autocast_for(model, precision: str) -> AbstractContextManager:
    """bf16 autocast on the model's device, or nothing (fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision != "bf16":
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    return torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16)


def teacher_forced_logprobs(
    model, samples: list[Sample], pad_id: int, temperature: float, micro_batch_size: int, autocast
) -> list[list[float]]:
    """Each sample's response log-probs under `model` (teacher-forced, no gradient, under
    `autocast`). Samples sharing a prompt go through together (their prompt runs once); every
    process computes all of them, the same number of forwards on each (a collective forward
    under ZeRO-3 needs that)."""
    order = sorted(range(len(samples)), key=lambda i: prompt_of(samples[i]))
    out: list[list[float]] = [[] for _ in samples]
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast:
        for idx in micro_batches(model, samples, order, micro_batch_size, training=False):
            micro = [samples[i] for i in idx]
            lens = [s.response_len for s in micro]
            logprobs, _ = packed_response_logprobs(model, [s.input_ids for s in micro], lens, pad_id, temperature)
            for row, (i, s) in enumerate(zip(idx, micro)):
                out[i] = logprobs[row, logprobs.shape[1] - s.response_len :].float().tolist()
    model.train(was_training)
    return out


def with_trainer_logprobs(
    model, samples: list[Sample], pad_id: int, temperature: float, micro_batch_size: int, autocast
) -> list[Sample]:
    """`samples` with old_logprobs recomputed by `model` (the pre-update weights) and the
    sampler's kept as sampler_logprobs (`teacher_forced_logprobs`)."""
    mine = teacher_forced_logprobs(model, samples, pad_id, temperature, micro_batch_size, autocast)
    return [
        replace(s, old_logprobs=lp, sampler_logprobs=None if s.replayed else list(s.old_logprobs))
        for s, lp in zip(samples, mine)
    ]


def with_anchor_logprobs(
    anchor, samples: list[Sample], pad_id: int, temperature: float, micro_batch_size: int, autocast
) -> list[Sample]:
    """`samples` with anchor_logprobs from `anchor`, the run's starting weights
    (`teacher_forced_logprobs`), for the anchor KL (`optim.anchor_beta`)."""
    theirs = teacher_forced_logprobs(anchor, samples, pad_id, temperature, micro_batch_size, autocast)
    return [replace(s, anchor_logprobs=lp) for s, lp in zip(samples, theirs)]


def pending_bytes(model, optimizer) -> int:
    """What an optimizer step still allocates besides activations: the gradients (set to None
    between steps) and, where AdamW holds no state yet (a fresh optimizer's first step), its two
    fp32 moments. SmolLM2-135M before its first step: 0.54 + 1.08 GB."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = sum(p.numel() * p.element_size() for p in params if p.grad is None)
    return grads + sum(2 * p.numel() * 4 for p in params if not optimizer.state.get(p))


def micro_batches(
    model, samples: list[Sample], order: list[int], size: int, training: bool, reserve: int = 0
) -> list[list[int]]:
    """`order` (sample indices) in runs of `size`, each cut further where its packed forward
    (prefix trees, `packing.pack`) would take more than the memory budget leaves now, less
    `reserve` bytes the step will allocate besides (`pending_bytes`; `memory.headroom_bytes`,
    `footprint.forward_bytes`). MemoryBudgetError where one sample alone does not fit.
    [0..5], size 4, no budget -> [[0, 1, 2, 3], [4, 5]]."""
    runs = [order[start : start + size] for start in range(0, len(order), size)]
    headroom = memory.headroom_bytes() - reserve
    if headroom == float("inf"):
        return runs
    need = _forward_need(model, samples, training)

    def what(i: int) -> str:
        return f"{'training on' if training else 'scoring'} a sample of {len(samples[i].input_ids)} tokens"

    return [part for run in runs for part in memory.cut_to_fit(run, need, headroom, what)]


def fitted_micro_batches(
    model,
    samples: list[Sample],
    order: list[int],
    size: int,
    training: bool,
    reserve: Callable[[], int] = lambda: 0,
    recut: bool = True,
) -> Iterator[tuple[list[int], bool]]:
    """`micro_batches`, checked again before each one -> (part, whether it is the last).
    The plan is cut from what the process holds when it is made, but what a micro-batch's
    backward frees stays resident in the allocator's arenas, and the next micro-batch does not
    always reuse it: measured on a text-game +RM update under 8 GiB, 7.70 GiB held against 5.85
    planned. So where what is held now plus the next part's estimate passes the budget, the
    freed memory is given back and the rest is cut again from there (`micro_batches`); where it
    fits, nothing is given back (giving back after every backward cost 9% of the update).
    `recut` False keeps the first plan (the processes of a launch: ZeRO-3's forwards are collective)."""
    parts = micro_batches(model, samples, order, size, training, reserve())
    budget = memory.budget_bytes()
    need = _forward_need(model, samples, training) if recut and budget != float("inf") else None
    while parts:
        part = parts.pop(0)
        if need is not None and memory.rss_bytes() + need(part) + reserve() > budget:
            rest = [i for p in [part, *parts] for i in p]
            parts = micro_batches(model, samples, rest, size, training, reserve())
            part = parts.pop(0)
        yield part, not parts


def _forward_need(model, samples: list[Sample], training: bool) -> Callable[[list[int]], int]:
    """The estimate (bytes) of one packed forward over some of `samples` (indices), backward
    included when `training` (`footprint.forward_bytes`)."""
    config = getattr(model, "module", model).config  # DDP and DeepSpeed wrap the model
    device = next(model.parameters()).device.type
    # under bf16 autocast a forward holds bf16 copies of the weights (footprint)
    params = sum(p.numel() for p in model.parameters()) if torch.is_autocast_enabled(device) else 0
    checkpointed = training and layers_checkpointed(model)

    def need(part: list[int]) -> int:
        trees, _ = pack([samples[i].input_ids for i in part])
        width = max(len(tree.tokens) for tree in trees)
        kept = sum(samples[i].response_len for i in part)
        tree = None
        if tree_attention.attends_by_tree(model, width):  # the keys its calls keep (footprint)
            read, copied = (sum(n) for n in zip(*(tree_attention.gathered_keys(t.parents) for t in trees)))
            tree = (sum(len(t.tokens) for t in trees), read if params else copied)  # autocast: every key a copy
        return forward_bytes(config, len(trees), width, kept, training, params, checkpointed, tree)

    return need


def _gap(samples: list[Sample], cap: float) -> dict:
    """The sampler/trainer gap over `samples`' response tokens (`MISMATCH`), None where the old
    log-probs are the sampler's own; replayed samples (no sampler log-probs kept) are left out."""
    samples = [s for s in samples if s.sampler_logprobs is not None]
    if not samples:
        return dict.fromkeys(MISMATCH)
    trainer = [lp for s in samples for lp in s.old_logprobs]
    sampler = [lp for s in samples for lp in s.sampler_logprobs]
    m = mismatch_measures(trainer, sampler, cap)
    return {
        "mismatch_abs_mean": m["abs_mean"],
        "mismatch_abs_max": m["abs_max"],
        "mismatch_outside_cap": m["outside_cap"],
    }


def _minibatch_step(
    model,
    optimizer,
    samples: list[Sample],
    mini: list[int],
    backend: TrainBackend,
    micro_batch_size: int,
    on_micro_batch: Callable[[int], None],
    grad_clip: float,
    **loss_args,
) -> dict:
    """One optimizer step on the samples `mini` (indices), in micro-batches -> its stats."""
    world = backend.world_size
    optimizer.zero_grad(set_to_none=True)
    # samples that share a prompt go into the same micro-batch, where their prompt runs once
    # (models.training.packing); the mini-batch's gradient is the same sum in any order
    mine = sorted(mini[backend.rank :: world], key=lambda i: prompt_of(samples[i]))
    share = 1.0 / len(mini)  # each sample's weight in the mini-batch mean
    if not mine:  # fewer samples than processes: still join the all-reduce, with weight 0
        mine, share = mini[:1], 0.0
    anchored = samples[mini[0]].anchor_logprobs is not None
    measures = (*MEASURES, "anchor_kl") if anchored else MEASURES
    totals = dict.fromkeys(measures, 0.0)
    num_tokens = 0
    reserve = functools.partial(pending_bytes, model, optimizer)
    parts = fitted_micro_batches(model, samples, mine, micro_batch_size, True, reserve, recut=world == 1)
    for part, last in parts:
        micro = [samples[i] for i in part]
        weight = len(micro) * share
        with backend.accumulate(model, sync=last):
            loss, stats = _micro_batch_loss(model, micro, **loss_args)
            backend.backward(loss * (weight * world))  # all-reduce averages over processes
        for key in measures:
            totals[key] += stats[key] * weight
        num_tokens += sum(sum(s.trained) if s.trained else s.response_len for s in micro) if share else 0
        on_micro_batch(len(micro))
    grad_norm = backend.clip_and_step(model, optimizer, grad_clip)
    summed = backend.reduce_sum([totals[k] for k in measures] + [num_tokens])
    return {
        "num_samples": len(mini),
        "num_tokens": int(summed[-1]),
        "anchor_kl": None,
        **dict(zip(measures, summed[:-1])),
        "grad_norm": float(grad_norm),  # before clipping
        "lr": optimizer.param_groups[0]["lr"],
    }


def _micro_batch_loss(
    model,
    micro: list[Sample],
    *,
    pad_id: int,
    temperature: float,
    clip_eps: float,
    kl_beta: float,
    tis_cap=None,
    anchor_beta: float = 0.0,
):
    """PPO-clip loss of a few samples -> (loss, stats with the mean token entropy added)."""
    lens = [s.response_len for s in micro]
    seqs = [s.input_ids for s in micro]
    logprobs, mask, entropy = packed_response_logprobs(model, seqs, lens, pad_id, temperature, entropy=True)
    mask = mask & _trained_mask(micro, mask.shape[1], mask.device)
    old = _right_aligned(logprobs, [s.old_logprobs for s in micro])
    anchor = None
    if micro[0].anchor_logprobs is not None:
        anchor = _right_aligned(logprobs, [s.anchor_logprobs for s in micro])
    advantages = torch.tensor([s.advantage for s in micro], device=logprobs.device)
    weights = None
    if tis_cap is not None and micro[0].sampler_logprobs is not None:
        sampler = _right_aligned(logprobs, [s.sampler_logprobs for s in micro])
        weights = tis_weights(old, sampler, mask, tis_cap)
    loss, stats = ppo_clip_loss(
        logprobs,
        old,
        advantages,
        mask,
        clip_eps=clip_eps,
        kl_beta=kl_beta,
        is_weights=weights,
        anchor_logprobs=anchor,
        anchor_beta=anchor_beta,
    )
    stats["entropy"] = float(masked_sequence_mean(entropy, mask))
    return loss, stats


def _right_aligned(like: torch.Tensor, rows: list[list[float]]) -> torch.Tensor:
    """(B, T) zeros shaped like `like` with each row's values at its right end, where
    `packed_response_logprobs` puts a response's log-probs."""
    out = torch.zeros_like(like)
    for row, values in enumerate(rows):
        out[row, out.shape[1] - len(values) :] = torch.tensor(values)
    return out


def _trained_mask(micro: list[Sample], width: int, device) -> torch.Tensor:
    """(B, width) bool, right-aligned like the log-probs: the tokens each sample trains."""
    out = torch.ones((len(micro), width), dtype=torch.bool, device=device)
    for row, s in enumerate(micro):
        if s.trained is not None:
            out[row, width - s.response_len :] = torch.tensor(s.trained, dtype=torch.bool)
    return out
