r"""Evaluation metrics: success rates with a 95% Wilson score interval, per group.

The Wilson interval of k successes in n trials (z = 1.959964 for 95%):

    centre = (p + z²/2n) / (1 + z²/n),  half = z / (1 + z²/n) · sqrt(p(1-p)/n + z²/4n²),  p = k/n

Unlike the normal approximation p ± z·sqrt(p(1-p)/n) it stays inside [0, 1] and is not
degenerate at 0/n or n/n (0/64 gives [0, 0.0566], not [0, 0]), which matters for held-out
accuracies of small models that start at 0. n = 0 has no estimate: NaN everywhere, never a
made-up 0.

Pure numpy/pandas; nothing of ours is imported.
"""

from __future__ import annotations

import math

import pandas as pd

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


def rate(flags: pd.Series) -> float:
    """Mean of a boolean series, NaN when empty."""
    return float(flags.mean()) if len(flags) else math.nan


def success_summary(episodes: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """One row per group of `episodes` with the held-out metrics.

    episodes: one row per evaluated episode with boolean columns `valid` (False: the
    environment failed; not counted in n, counted in env_errors), `success` (outcome +1, with
    the environment's answer fallback), `strict_success` (outcome +1 and every answer came from
    a \boxed{}) and `boxed` (every step's answer was boxed); `by`: grouping columns (e.g.
    ["split"] or ["env_kind", "split"]).
    -> columns by + n, successes, accuracy, ci_low, ci_high, strict_accuracy, strict_ci_low,
    strict_ci_high, fallback_accuracy (= accuracy), format_rate, env_errors.

    >>> frame = pd.DataFrame({"split": ["a"] * 4, "valid": [True] * 4, "success": [True, True, False, False],
    ...                       "strict_success": [True, False, False, False], "boxed": [True, False, True, False]})
    >>> row = success_summary(frame, ["split"]).iloc[0]
    >>> int(row.n), float(row.accuracy), float(row.strict_accuracy), float(row.format_rate)
    (4, 0.5, 0.25, 0.5)
    """
    rows = []
    for key, group in episodes.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        valid = group[group.valid.astype(bool)]
        n, k, strict = len(valid), int(valid.success.sum()), int(valid.strict_success.sum())
        low, high = wilson_interval(k, n)
        s_low, s_high = wilson_interval(strict, n)
        accuracy = k / n if n else math.nan
        rows.append(
            {
                **dict(zip(by, key)),
                "n": n,
                "successes": k,
                "accuracy": accuracy,
                "ci_low": low,
                "ci_high": high,
                "strict_accuracy": strict / n if n else math.nan,
                "strict_ci_low": s_low,
                "strict_ci_high": s_high,
                "fallback_accuracy": accuracy,
                "format_rate": rate(valid.boxed.astype(bool)),
                "env_errors": int((~group.valid.astype(bool)).sum()),
            }
        )
    columns = [
        *by,
        "n",
        "successes",
        "accuracy",
        "ci_low",
        "ci_high",
        "strict_accuracy",
        "strict_ci_low",
        "strict_ci_high",
        "fallback_accuracy",
        "format_rate",
        "env_errors",
    ]
    return pd.DataFrame(rows, columns=columns)
