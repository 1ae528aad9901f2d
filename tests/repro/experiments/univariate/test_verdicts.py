"""experiments.univariate.verdicts: Figure 1's rule, its thresholds in Monte-Carlo scales, and its margin."""

from __future__ import annotations

import numpy as np
import pytest

from bootens_core.repro.experiments.univariate import verdicts

K = 200
UNI_OK = {
    "mean_error_sd": 0.05,
    "mean_error_sd_mc_scale": 1 / np.sqrt(K),
    "sd_ratio": 1.02,
    "sd_ratio_mc_scale": 1 / np.sqrt(2 * (K - 1)),
    "ks_pvalue": 0.4,
}


def test_univariate_reproduced():
    assert str(verdicts.evaluate(UNI_OK)) == "reproduced"


@pytest.mark.parametrize(
    "change",
    [
        {"mean_error_sd": 4.01 / np.sqrt(K)},
        {"sd_ratio": 1 + 4.01 / np.sqrt(2 * (K - 1))},
        {"sd_ratio": 1 - 4.01 / np.sqrt(2 * (K - 1))},
        {"ks_pvalue": 9e-4},
    ],
)
def test_univariate_not_reproduced(change):
    assert str(verdicts.evaluate({**UNI_OK, **change})) == "NOT reproduced"


def test_univariate_margin_is_the_closest_condition_in_mc_units():
    sc = UNI_OK["mean_error_sd_mc_scale"]
    # mean error 1 MC scale below its limit of 4; the sd ratio and the KS test are farther from theirs.
    v = verdicts.evaluate({**UNI_OK, "mean_error_sd": 3 * sc})
    assert str(v) == "reproduced" and v.margin == pytest.approx(1.0)
    # A KS p-value at the normal tail 3.09 - 0.5 sd: the margin is in the p-value's z units.
    from scipy import stats

    p = stats.norm.sf(stats.norm.isf(1e-3) - 0.5)
    v = verdicts.evaluate({**UNI_OK, "ks_pvalue": p})
    assert str(v) == "reproduced" and v.margin == pytest.approx(0.5)
    # Failing: the margin is how far the failing condition is beyond its limit.
    v = verdicts.evaluate({**UNI_OK, "mean_error_sd": 6.5 * sc})
    assert str(v) == "NOT reproduced" and v.margin == pytest.approx(2.5)
