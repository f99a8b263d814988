"""Held-out problems for evaluation: what every environment's `heldout_specs` shares.

An environment may define (an optional part of the Environment protocol)

    @staticmethod
    def heldout_specs(config: EnvConfig, split: str, n: int, seed: int) -> list[dict]:

the first `n` specs of `split` (fewer only where a finite benchmark runs out) for a run whose
`initial_specs` got `seed` (run.seed): "in_domain", the training generator or game kind on
problems training never draws, or "ood", harder knobs, bigger worlds or other task kinds. The
list for n is a prefix of the list for n + 1, so an evaluation can draw a few spare specs and
drop any that a particular run still met.

Seeded generators number the problems of a new buffer `seeding.slot_seed(seed, slot)`, that is
`seed * STRIDE + slot` (every `initial_specs` here does). Evaluation seeds are the ones whose residue modulo STRIDE is in the
top RESERVED values: a buffer slot is never that large, so for every run seed (and, for the
generators that reduce modulo 2**31, every seed below 21_474) no initial spec has one, and the
`heldout_specs` methods also drop any seed `initial_specs(config, seed)` gave, whatever the run
seed. Rule-based rewrites keep the seed (or, MiniWoB's, stay below 2**31: its held-out seeds lie
above). Rewrites written by a model may choose any seed or problem: `drop_trained` removes what
a run's buffer really held, so disjointness is checked against the run, not assumed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rlanything.seeding import SLOT_STRIDE

if TYPE_CHECKING:
    from rlanything.config import EnvConfig

SPLITS = ("in_domain", "ood")
STRIDE = SLOT_STRIDE  # initial_specs: seeding.slot_seed(seed, slot) = seed * STRIDE + slot
RESERVED = 1_000  # residues STRIDE - RESERVED .. STRIDE - 1 are evaluation seeds
OOD_OFFSET = 1_000_000  # the OOD split's seeds start this many evaluation seeds later
EXAMPLE_SEED = STRIDE - RESERVED - 1
"""The seed of worked examples shown in prompts (reasoning-gym's and the text games'
`worked_example`): below the evaluation residues, and a training slot only in a buffer of more
than 99,002 problems."""


class NoHeldOutSplit(ValueError):
    """The environment defines no held-out problems (no `heldout_specs`)."""


def is_heldout_seed(seed: int) -> bool:
    """True for the seeds reserved for evaluation.

    >>> is_heldout_seed(99_003), is_heldout_seed(5), is_heldout_seed(3 * STRIDE + 7)
    (True, False, False)
    """
    return seed % STRIDE >= STRIDE - RESERVED


def heldout_seed(index: int, base: int = 0) -> int:
    """The `index`-th evaluation seed (index >= 0), plus `base` (a multiple of STRIDE, so the
    residue stays reserved).

    >>> heldout_seed(0), heldout_seed(999), heldout_seed(1000)
    (99003, 100002, 199006)
    """
    if base % STRIDE:
        raise ValueError(f"base {base} must be a multiple of {STRIDE}")
    return base + (index // RESERVED) * STRIDE + STRIDE - RESERVED + index % RESERVED


def heldout_seeds(split: str, n: int, avoid: Iterable[int] = (), base: int = 0) -> list[int]:
    """The first `n` evaluation seeds of `split` that are not in `avoid` (the run's initial seeds)."""
    check_split(split)
    avoid, out, index = set(avoid), [], OOD_OFFSET if split == "ood" else 0
    while len(out) < n:
        seed = heldout_seed(index, base)
        assert is_heldout_seed(seed)
        if seed not in avoid:
            out.append(seed)
        index += 1
    return out


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; one of {list(SPLITS)}")


def heldout_specs(config: EnvConfig, split: str, n: int, seed: int) -> list[dict[str, Any]]:
    """`env_class(config.kind).heldout_specs(...)`, or NoHeldOutSplit naming the environment."""
    from rlanything.envs.base import env_class, optional

    check_split(split)
    cls = env_class(config.kind)
    method = optional(cls, "heldout_specs")
    if method is None:
        raise NoHeldOutSplit(
            f"environment {config.kind!r} ({cls.__name__}) has no held-out split: it defines no "
            "heldout_specs(config, split, n, seed), so it cannot be evaluated on unseen problems"
        )
    return method(config, split, n, seed)


def spec_key(spec: dict[str, Any]) -> str:
    """A spec as a canonical string (specs compare by value)."""
    return json.dumps(spec, sort_keys=True)


def drop_trained(specs: list[dict[str, Any]], trained: Iterable[dict[str, Any]], n: int) -> tuple[list[dict], int]:
    """The first `n` of `specs` that are not among `trained` (every spec a run's buffer held)
    and do not share a seed with one of them -> (specs, how many were dropped); fewer than `n`
    when the pool runs out (a finite benchmark), ValueError when none is left."""
    trained = list(trained)
    keys = {spec_key(s) for s in trained}
    seeds = {s["seed"] for s in trained if isinstance(s.get("seed"), int)}
    kept = [s for s in specs if spec_key(s) not in keys and not (isinstance(s.get("seed"), int) and s["seed"] in seeds)]
    if not kept:
        raise ValueError(f"none of the {len(specs)} held-out problems is unseen by this run")
    return kept[:n], len(specs) - len(kept)
