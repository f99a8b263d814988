"""Every random choice derives from (seed, iteration, step), so a resumed run repeats exactly."""

import hashlib


def derive_seed(seed: int, iteration: int, step: str, *extra: object) -> int:
    """A stable 31-bit seed for one step of one iteration (independent of process and order)."""
    key = "|".join(str(x) for x in (seed, iteration, step, *extra)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little") & 0x7FFFFFFF


SLOT_STRIDE = 100_003
"""The prime stride of `slot_seed`; envs/heldout.py reserves its top residues for evaluation."""
STEP_STRIDE = 7919
"""The prime stride of `step_seed`."""


def slot_seed(seed: int, slot: int) -> int:
    """The seed of item `slot` (a buffer slot, a request) of a family seeded `seed`: while
    0 <= slot < SLOT_STRIDE, two families' items never share one, and every run's item `slot`
    has the residue `slot` modulo SLOT_STRIDE (what keeps evaluation seeds apart).

    >>> slot_seed(0, 5), slot_seed(3, 7)
    (5, 300016)
    """
    return seed * SLOT_STRIDE + slot


def step_seed(seed: int, step_idx: int) -> int:
    """The sampling seed of turn `step_idx` of a rollout whose first turn samples with `seed`.

    >>> step_seed(11, 0), step_seed(11, 2)
    (11, 15849)
    """
    return seed + STEP_STRIDE * step_idx
