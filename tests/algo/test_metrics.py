"""Wilson intervals and the held-out summary table, against values computed by hand."""

import math

import pandas as pd
import pytest

from rlanything.agent.eval_play import success_summary
from rlanything.algo.metrics import wilson_interval

# By hand, z = 1.959964, z² = 3.841459:
#  32/64: p = 0.5, z²/n = 0.0600228, centre = (0.5 + 0.0300114) / 1.0600228 = 0.5,
#         half = 1.959964 / 1.0600228 · sqrt(0.25/64 + 3.841459/16384) = 1.848983 · 0.0643484 = 0.118979
#   0/64: centre = 0.0300114 / 1.0600228 = 0.0283120, half = 1.848983 · sqrt(3.841459/16384) = 0.0283120
#  64/64: the mirror image of 0/64
#   1/10: p = 0.1, z²/n = 0.3841459, centre = (0.1 + 0.1920729) / 1.3841459 = 0.2110144,
#         half = 1.959964 / 1.3841459 · sqrt(0.009 + 0.0096036) = 1.416010 · 0.136393 = 0.193134
CASES = [
    (32, 64, 0.381021, 0.618979),
    (0, 64, 0.0, 0.056624),
    (64, 64, 0.943376, 1.0),
    (1, 10, 0.017880, 0.404148),
]


@pytest.mark.parametrize("k,n,low,high", CASES)
def test_wilson_by_hand(k, n, low, high):
    got = wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=2e-5)
    assert 0.0 <= got[0] <= k / n <= got[1] <= 1.0


def test_wilson_edges_are_exact_and_n0_has_no_estimate():
    assert wilson_interval(0, 64)[0] == 0.0 and wilson_interval(64, 64)[1] == 1.0
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(ValueError):
        wilson_interval(5, 4)
    with pytest.raises(ValueError):
        wilson_interval(-1, 4)


def test_summary_per_split_and_env_kind_strict_beside_fallback():
    rows = (
        # in_domain: 4 valid (2 solved, 1 of them only through the fallback), 1 env error
        [
            ("reasoning_gym", "in_domain", True, True, True, True),
            ("reasoning_gym", "in_domain", True, True, False, False),
            ("reasoning_gym", "in_domain", True, False, False, True),
            ("reasoning_gym", "in_domain", True, False, False, False),
            ("reasoning_gym", "in_domain", False, False, False, False),
        ]
        # ood: nothing valid at all
        + [("reasoning_gym", "ood", False, False, False, False)]
        + [("coding", "ood", True, True, True, True)]
    )
    frame = pd.DataFrame(rows, columns=["env_kind", "split", "valid", "success", "strict_success", "boxed"])
    out = success_summary(frame, ["env_kind", "split"]).set_index(["env_kind", "split"])
    row = out.loc[("reasoning_gym", "in_domain")]
    assert (row.n, row.successes, row.env_errors) == (4, 2, 1)
    assert (row.accuracy, row.fallback_accuracy, row.strict_accuracy, row.format_rate) == (0.5, 0.5, 0.25, 0.5)
    assert (row.ci_low, row.ci_high) == pytest.approx(wilson_interval(2, 4))
    assert (row.strict_ci_low, row.strict_ci_high) == pytest.approx(wilson_interval(1, 4))
    empty = out.loc[("reasoning_gym", "ood")]
    assert empty.n == 0 and empty.env_errors == 1 and math.isnan(empty.accuracy) and math.isnan(empty.format_rate)
    coding = out.loc[("coding", "ood")]
    assert (coding.n, coding.accuracy, coding.ci_high) == (1, 1.0, 1.0)
