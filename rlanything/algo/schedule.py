"""The learning rate of each optimizer step: linear warmup, then constant or cosine decay.

Not in the paper, which gives one constant learning rate. A 135M model broke on its first
update at lr 5e-5 without warmup (KL 242 to the generating model, held-out accuracy 77% -> 52%,
measured), while small early steps let the same rate train: AdamW's second-moment estimate is
poor over its first few steps, so the first updates are the largest in effect. Warmup is the
usual cure (verl, TRL and nanochat all have one).

`step` counts the optimizer steps a model has taken over the whole run (every epoch of every
iteration), from 0, so the schedule continues across iterations and a resumed iteration
recomputes the same rates. The schedule's settings are keyword-only arguments without a default:
callers pass the config's `optim.*` (warmup_steps, schedule, total_steps resolved, min_lr_ratio).
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "cosine"]


def learning_rate(
    step: int,
    base_lr: float,
    *,
    warmup_steps: int,
    schedule: Schedule,
    total_steps: int,
    min_lr_ratio: float,
) -> float:
    """lr of optimizer step `step` (0-based, counted over the whole run).

    Warmup (step < warmup_steps): base_lr * (step + 1) / warmup_steps, a straight line whose
    last warmup step reaches base_lr. After it, `constant` keeps base_lr; `cosine` goes from
    base_lr (step warmup_steps) down to base_lr * min_lr_ratio (step total_steps - 1) along half a
    cosine, and stays there.

    >>> constant = dict(schedule="constant", total_steps=6, min_lr_ratio=0.1)
    >>> [learning_rate(s, 1.0, warmup_steps=4, **constant) for s in range(6)]
    [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    >>> cosine = dict(warmup_steps=1, schedule="cosine", total_steps=5, min_lr_ratio=0.1)
    >>> [round(learning_rate(s, 1.0, **cosine), 4) for s in range(7)]
    [1.0, 1.0, 0.775, 0.325, 0.1, 0.1, 0.1]
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return base_lr
    if schedule != "cosine":
        raise ValueError(f"unknown schedule {schedule!r}; schedules are 'constant' and 'cosine'")
    # the first step after warmup is at progress 0 (base_lr), step total_steps - 1 at progress 1
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - 1 - warmup_steps))
    return base_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
