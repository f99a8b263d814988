"""The sampler–trainer mismatch: truncated importance sampling and its measures.

When the engine samples in one precision (say bf16 on a CPU with bf16 units) and the trainer
computes log-probs in another (fp32 master weights, or bf16 autocast over a different code
path), the sampler's log-probs of a token differ from the trainer's for the *same* weights.
PPO's ratio is then taken against the trainer's own log-probs of the pre-update model
(`algo.old_logprobs`); what remains is that the samples came from the sampler's distribution,
not the trainer's. Truncated importance sampling (TIS, as verl and slime offer it) weighs each
token's policy-gradient term by that ratio, capped:

    w_t = min(exp(trainer_t - sampler_t), C)        (detached; 1 outside the response: padding)

Departures: the paper samples and trains in one precision and has neither. The log-ratio is
clamped before `exp` as in `losses.ppo_clip_loss`. The weight multiplies the PPO-clip term
only, not the k3 KL (which is taken against the trainer's own old log-probs, exact).
"""

from __future__ import annotations

import numpy as np
import torch

from rlanything.algo.losses import LOG_RATIO_CLAMP

REPORT_CAP = 2.0  # C of the "outside [1/C, C]" measure when TIS is off (verl's default cap)


def tis_weights(
    trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, response_mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance weights of the sampled tokens, detached.

    trainer_logprobs, sampler_logprobs (B, T), response_mask (B, T) -> (B, T) float32 with
    min(exp(trainer - sampler), cap) on masked tokens and 1 elsewhere.

    >>> t = torch.log(torch.tensor([[0.5, 0.9, 0.2]]))
    >>> s = torch.log(torch.tensor([[0.5, 0.3, 0.4]]))
    >>> tis_weights(t, s, torch.tensor([[1, 1, 0]]), cap=2.0)  # ratios 1, 3 (capped), masked
    tensor([[1., 2., 1.]])
    """
    mask = response_mask.bool()
    with torch.no_grad():
        log_ratio = torch.where(mask, trainer_logprobs.float() - sampler_logprobs.float(), 0.0)
        weights = torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).clamp(max=cap)
        return torch.where(mask, weights, torch.ones_like(weights))


def mismatch_measures(trainer_logprobs, sampler_logprobs, cap: float = REPORT_CAP) -> dict[str, float]:
    """Per-token gap between the trainer's and the sampler's log-probs of the same sampled
    tokens under the same weights.

    Flat arrays of the response tokens (any shape, equal) -> {"abs_mean", "abs_max",
    "outside_cap": fraction of tokens with exp(trainer - sampler) outside [1/cap, cap],
    "tokens"}. No tokens -> zeros.

    >>> m = mismatch_measures([-1.0, -2.0, -0.5, -3.0], [-1.0, -1.5, -0.5, -4.0], cap=2.0)
    >>> m["abs_mean"], m["abs_max"], m["outside_cap"], m["tokens"]  # |d| 0, .5, 0, 1; e^1 > 2
    (0.375, 1.0, 0.25, 4)
    """
    trainer = np.asarray(trainer_logprobs, dtype=np.float64).reshape(-1)
    sampler = np.asarray(sampler_logprobs, dtype=np.float64).reshape(-1)
    if trainer.shape != sampler.shape:
        raise ValueError(f"trainer and sampler log-probs differ in size: {trainer.shape} vs {sampler.shape}")
    if not len(trainer):
        return {"abs_mean": 0.0, "abs_max": 0.0, "outside_cap": 0.0, "tokens": 0}
    gap = trainer - sampler
    outside = np.abs(gap) > np.log(cap)
    return {
        "abs_mean": float(np.abs(gap).mean()),
        "abs_max": float(np.abs(gap).max()),
        "outside_cap": float(outside.mean()),
        "tokens": int(len(gap)),
    }


def combine_steps(abs_mean, abs_max, outside_cap, tokens) -> dict[str, float]:
    """An iteration's gap from its optimizer steps' (one pass: every sample once): the
    token-weighted mean gap and share outside the cap, the largest gap. Each argument is one
    value per step; `tokens` the step's response tokens.

    >>> combine_steps([0.02, 0.04], [0.3, 0.5], [0.0, 0.1], [300, 100])  # (6 + 4) / 400, 10 / 400
    {'abs_mean': 0.025, 'abs_max': 0.5, 'outside_cap': 0.025}
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    share = tokens / tokens.sum()
    return {
        "abs_mean": float(np.dot(np.asarray(abs_mean, dtype=np.float64), share)),
        "abs_max": float(np.max(abs_max)),
        "outside_cap": float(np.dot(np.asarray(outside_cap, dtype=np.float64), share)),
    }
