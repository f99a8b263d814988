r"""Evaluation metrics: success rates with a 95% Wilson score interval, per group.

The Wilson interval of k successes in n trials (z = 1.959964 for 95%):

    centre = (p + z²/2n) / (1 + z²/n),  half = z / (1 + z²/n) · sqrt(p(1-p)/n + z²/4n²),  p = k/n

Unlike the normal approximation p ± z·sqrt(p(1-p)/n) it stays inside [0, 1] and is not
degenerate at 0/n or n/n (0/64 gives [0, 0.0566], not [0, 0]), which matters for held-out
accuracies of small models that start at 0. n = 0 has no estimate: NaN everywhere, never a
made-up 0.

Pure Python; nothing of ours is imported. The per-group table of an evaluation's episodes
(a pandas frame) is built from it in agent/eval_play.py: `success_summary`.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion -> (low, high); (nan, nan) for n = 0.

    successes, n: ints with 0 <= successes <= n.

    >>> [round(x, 4) for x in wilson_interval(32, 64)]
    [0.381, 0.619]
    >>> [round(x, 4) for x in wilson_interval(0, 64)]
    [0.0, 0.0566]
    """
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return math.nan, math.nan
    p, z2 = successes / n, z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # at k = 0 (k = n) the bound is exactly 0 (1): centre and half agree analytically, not in floats
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high
