"""Losses: token log-probs, the masked sequence mean, and PPO-clip with a k3 KL penalty.

Paper (docs/method.md), for the policy and the RM alike:
    ratio_t = exp(logprobs_t - old_logprobs_t)
    pg_t    = -min(ratio_t * A, clip(ratio_t, 1 - eps, 1 + eps) * A),   eps = 0.2
    kl_t    = exp(ref_t - logprobs_t) - (ref_t - logprobs_t) - 1          (k3), beta = 0.01
    loss    = mean over sequences of (mean over response tokens of pg_t + beta * kl_t)

eps, beta, the anchor's weight and the temperature are keyword-only arguments without a default:
callers pass the config's ``algo.clip_eps`` and ``algo.kl_beta`` (the paper's 0.2 and 0.01 unless
set), ``optim.anchor_beta`` and the section's ``temperature``.

Where we depart from the paper / authors' code, and why:

* The KL reference is ``old_logprobs`` (the model that generated the samples), as the
  method says: k3(pi_theta || pi_old). With one pass over the samples it is ~0 at the
  first step and only restrains drift within an iteration.
* Optional, off by default (our departure): a second k3 term against ``anchor_logprobs``,
  the run's *starting* weights (GRPO's reference-model KL), weighted by ``anchor_beta``
  (``optim.anchor_beta``). It restrains the drift summed over iterations, which the
  paper's term never sees.
* The log-ratio is clamped to [-20, 20] before ``exp`` (as verl does), in the ratio and
  in the k3 term, so one token whose log-prob moved very far cannot make the ratio, the
  loss or the gradient inf/NaN (the paper exponentiates unclamped). The
  clamp only acts where the ratio is below 2e-9 or above 4.8e8, far outside the clip range,
  where the clipped term already carries no gradient for positive advantages.
* "Sequence mean, then batch mean" (not a token mean over the batch): every sample
  weighs the same whatever its length, as the paper writes. Sequences whose mask is
  empty are ignored rather than counted as zero.
* Log-ratios at masked-out positions are set to 0 *before* ``exp``, so padding with
  arbitrary log-probs can neither overflow nor leak NaN into the gradient.
* ``token_logprobs`` computes in float32 as ``logit[label] - logsumexp(logits)``: the
  same value as ``log_softmax(...).gather(...)`` without keeping a (B, T, V) log-prob
  tensor for backward; bf16 logits would lose ~2 digits otherwise.
* ``clip_frac`` counts tokens where the clipped term is active (its gradient is
  zero), as verl does, not every token with the ratio outside [1 - eps, 1 + eps].
"""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0  # |log pi_theta - log pi_old| fed to exp, as verl clamps it


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """Log-probability of each label under softmax(logits / temperature).

    logits (B, T, V), labels (B, T) int64 -> (B, T) float32.
    Labels must be valid ids everywhere (mask padding later with response_mask).

    >>> token_logprobs(torch.zeros(1, 2, 4), torch.tensor([[0, 3]]), temperature=1.0)
    tensor([[-1.3863, -1.3863]])
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """Entropy (nats) of softmax(logits / temperature) over the last axis, in float32.

    logits (..., V) -> (...). H = logsumexp(z) - sum softmax(z) * z, z = logits / temperature.

    >>> token_entropy(torch.zeros(2, 4), temperature=1.0)  # uniform over 4: log 4
    tensor([1.3863, 1.3863])
    >>> token_entropy(torch.tensor([[0.0, -1e4]]), temperature=1.0)  # all mass on one token
    tensor([0.])
    """
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def masked_sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each sequence's masked tokens, then mean over sequences with any token.

    values (B, T), mask (B, T) bool (or 0/1) -> scalar. All masks empty -> 0, still
    connected to ``values`` so ``backward()`` works (with zero gradient).

    >>> masked_sequence_mean(torch.tensor([[1., 2., 3.], [4., 5., 6.]]),
    ...                      torch.tensor([[1, 1, 0], [1, 1, 1]]))
    tensor(3.2500)
    """
    mask = mask.bool()
    tokens = mask.sum(dim=-1)  # (B,)
    per_seq = torch.where(mask, values, torch.zeros_like(values)).sum(dim=-1) / tokens.clamp(min=1)  # (B,)
    has_tokens = tokens > 0
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref): exp(d) - d - 1 with d = ref - logprobs,
    0 outside the mask, d clamped to [-20, 20] first (exp(+big) would be inf).

    logprobs, ref_logprobs (B, T), response_mask (B, T) -> (B, T), >= 0.

    >>> k3_kl(torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2))
    tensor([[0.3679, 0.0000]])
    """
    mask = response_mask.bool()
    diff = torch.where(mask, ref_logprobs - logprobs, torch.zeros_like(logprobs))
    diff = torch.clamp(diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(diff) - diff - 1.0


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_eps: float,
    kl_beta: float,
    anchor_beta: float,
    is_weights: torch.Tensor | None = None,
    anchor_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float | None]]:
    """PPO-clip loss with a k3 KL penalty, reduced by ``masked_sequence_mean``.

    logprobs (B, T) with grad, old_logprobs (B, T), advantages (B,) (one per sample,
    applied to all its response tokens), response_mask (B, T), optional is_weights (B, T)
    (detached per-token weights of the clipped term: truncated importance sampling,
    `algo.mismatch.tis_weights`), optional anchor_logprobs (B, T) (the starting weights')
    -> (loss scalar, stats). stats holds python floats: "loss", "pg_loss", "kl" (same
    reduction as the loss; loss = pg_loss + kl_beta * kl + anchor_beta * anchor_kl),
    "anchor_kl" (None without anchor_logprobs), "clip_frac", "ratio_mean" (means over all
    masked tokens).

    >>> lp, paper = torch.log(torch.tensor([[0.5, 0.5]])), dict(clip_eps=0.2, kl_beta=0.01, anchor_beta=0.0)
    >>> loss, stats = ppo_clip_loss(lp, lp, torch.tensor([2.0]), torch.ones(1, 2), **paper)
    >>> loss, stats["kl"], stats["ratio_mean"]
    (tensor(-2.), 0.0, 1.0)

    With an anchor one nat below on the first token (k3 = e^-1 - (-1) - 1 = 0.3679, sequence
    mean 0.1839) and anchor_beta 1: loss = -2 + 0.1839.

    >>> loss, stats = ppo_clip_loss(lp, lp, torch.tensor([2.0]), torch.ones(1, 2), clip_eps=0.2, kl_beta=0.01,
    ...                             anchor_beta=1.0, anchor_logprobs=lp - torch.tensor([[1.0, 0.0]]))
    >>> loss, round(stats["anchor_kl"], 4)
    (tensor(-1.8161), 0.1839)
    """
    mask = response_mask.bool()
    zero = torch.zeros_like(logprobs)
    log_ratio = torch.where(mask, logprobs - old_logprobs, zero)  # (B, T)
    ratio = torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)  # (B, 1)
    pg_unclipped = -ratio * adv
    pg_clipped = -torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    pg = torch.maximum(pg_unclipped, pg_clipped)  # = -min(ratio * A, clip(ratio) * A)
    if is_weights is not None:
        pg = pg * is_weights.to(pg.dtype)

    kl = k3_kl(logprobs, old_logprobs, mask)  # (B, T): the reference is the pre-update model

    pg_loss = masked_sequence_mean(pg, mask)
    kl_mean = masked_sequence_mean(kl, mask)
    loss = pg_loss + kl_beta * kl_mean
    anchor_kl = None
    if anchor_logprobs is not None:
        anchor_kl = masked_sequence_mean(k3_kl(logprobs, anchor_logprobs, mask), mask)
        loss = loss + anchor_beta * anchor_kl

    with torch.no_grad():
        n_tokens = mask.sum().clamp(min=1)
        clip_frac = ((pg_clipped > pg_unclipped) & mask).sum() / n_tokens
        ratio_mean = torch.where(mask, ratio, zero).sum() / n_tokens
    stats = {
        "loss": float(loss.detach()),
        "pg_loss": float(pg_loss.detach()),
        "kl": float(kl_mean.detach()),
        "anchor_kl": None if anchor_kl is None else float(anchor_kl.detach()),
        "clip_frac": float(clip_frac),
        "ratio_mean": float(ratio_mean),
    }
    return loss, stats
