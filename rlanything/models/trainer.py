"""One PPO-clip pass over a batch of samples (policy and RM alike, docs/method.md, "Loss").

The samples are shuffled (seeded) and split into `updates` mini-batches, one optimizer step
each; every mini-batch is processed in micro-batches whose losses are weighted by their share
of the mini-batch, so the gradient equals the mini-batch's mean over sequences whatever the
micro-batch size. Within a mini-batch, samples are ordered by prompt so those sharing one land
in the same micro-batch, whose forward runs each shared prefix once (`models.packing`). The ratio and the k3 KL are both taken against the log-probs recorded by the
engine that generated the samples (the pre-update model).

Where the arithmetic runs is a small seam, `TrainBackend`: `TorchBackend` (one process, plain
autograd, the default) or `rlanything.models.distributed.AccelerateBackend` (DDP or DeepSpeed
ZeRO under `accelerate launch`). The loss code below is the same for both; with N processes
each takes every N-th sample of a mini-batch and weighs its losses by N / mini-batch size, so
the all-reduced (averaged) gradient is still the mini-batch's mean over sequences.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from rlanything.algo.losses import ppo_clip_loss
from rlanything.models.packing import packed_response_logprobs


@dataclass
class Sample:
    input_ids: list[int]  # prompt + response
    response_len: int
    old_logprobs: list[float]  # (response_len,)
    advantage: float


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


def make_optimizer(model, lr: float, weight_decay: float, state_path: Path | None = None) -> torch.optim.AdamW:
    """AdamW over the trainable weights (all, or LoRA adapters only), resuming its moments
    from `state_path` when that file exists."""
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


OPTIMIZER_STATE = "optimizer.pt"  # AdamW's moments in a checkpoint folder, read back by make_optimizer


def save_checkpoint(model, tokenizer, optimizer, out_dir: Path, lora_save: str | None = None, state_dict=None) -> None:
    """One checkpoint folder, replacing `out_dir` whole or not at all (a full disk raises
    `storage.checkpoints.CheckpointWriteError` and leaves nothing behind): the HF weights and
    tokenizer (`state_dict` replaces the model's own, as DeepSpeed ZeRO-3 gathers them), or with
    `lora_save` ("merged" / "adapter") the LoRA folder of `models.lora`, plus `optimizer.pt`
    for resuming AdamW's moments (skipped when `optimizer` is None: DeepSpeed keeps its own)."""
    from rlanything.models.loading import tensor_bytes, write_model_files
    from rlanything.models.lora import lora_bytes, write_lora_files
    from rlanything.storage.checkpoints import write_folder

    def write(folder: Path) -> None:
        if optimizer is not None:  # first: merging LoRA adapters changes the model in place
            torch.save(optimizer.state_dict(), folder / OPTIMIZER_STATE)
        if lora_save is not None:
            write_lora_files(model, tokenizer, folder, lora_save)
        else:
            write_model_files(model, tokenizer, folder, state_dict)

    if lora_save is not None:
        weights = lora_bytes(model, lora_save)
    else:
        weights = tensor_bytes(state_dict if state_dict is not None else model.state_dict())
    write_folder(Path(out_dir), write, weights + (tensor_bytes(optimizer.state_dict()) if optimizer is not None else 0))


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
    on_micro_batch: Callable[[int], None] = lambda n: None,
    backend: TrainBackend | None = None,
) -> list[dict]:
    """-> one stats dict per optimizer step (num_samples, num_tokens, loss, pg_loss, kl,
    clip_frac, grad_norm, lr), identical on every process. No samples -> no step, empty list."""
    if not samples:
        return []
    backend = backend or TorchBackend()
    world = backend.world_size
    order = random.Random(seed).sample(range(len(samples)), len(samples))
    n_mini = min(updates, len(samples))
    minibatches = [order[k::n_mini] for k in range(n_mini)]
    keys = ("loss", "pg_loss", "kl", "clip_frac")
    model.train()
    history = []
    for update_idx, mini in enumerate(minibatches):
        optimizer.zero_grad(set_to_none=True)
        # samples that share a prompt go into the same micro-batch, where their prompt runs once
        # (models.packing); the mini-batch's gradient is the same sum in any order
        mine = sorted(mini[backend.rank :: world], key=lambda i: prompt_of(samples[i]))
        share = 1.0 / len(mini)  # each sample's weight in the mini-batch mean
        if not mine:  # fewer samples than processes: still join the all-reduce, with weight 0
            mine, share = mini[:1], 0.0
        totals = dict.fromkeys(keys, 0.0)
        num_tokens = 0
        for start in range(0, len(mine), micro_batch_size):
            micro = [samples[i] for i in mine[start : start + micro_batch_size]]
            weight = len(micro) * share
            lens = [s.response_len for s in micro]
            with backend.accumulate(model, sync=start + micro_batch_size >= len(mine)):
                seqs = [s.input_ids for s in micro]
                logprobs, mask = packed_response_logprobs(model, seqs, lens, pad_id, temperature)
                old = torch.zeros_like(logprobs)
                for row, s in enumerate(micro):  # right-align each response, as response_logprobs does
                    old[row, old.shape[1] - s.response_len :] = torch.tensor(s.old_logprobs)
                advantages = torch.tensor([s.advantage for s in micro], device=logprobs.device)
                loss, stats = ppo_clip_loss(logprobs, old, advantages, mask, clip_eps=clip_eps, kl_beta=kl_beta)
                backend.backward(loss * (weight * world))  # all-reduce averages over processes
            for key in keys:
                totals[key] += stats[key] * weight
            num_tokens += sum(lens) if share else 0
            on_micro_batch(len(micro))
        grad_norm = backend.clip_and_step(model, optimizer, grad_clip)
        summed = backend.reduce_sum([totals[k] for k in keys] + [num_tokens])
        history.append(
            {
                "update_idx": update_idx,
                "num_samples": len(mini),
                "num_tokens": int(summed[-1]),
                **dict(zip(keys, summed[:-1])),
                "grad_norm": float(grad_norm),
                "lr": optimizer.param_groups[0]["lr"],
            }
        )
    model.eval()
    return history
