"""metrics.mixture_cdf / mixture_coverage against scipy's normal CDF, the single-Gaussian interval and draws
from the mixture itself."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from bootens_core import metrics

Z975 = 1.959963984540054  # the standard normal's 0.975 quantile


def _mixture(rng, k, n):
    f = rng.normal(0.0, 1.5, size=(k, n))
    y = rng.normal(0.0, 2.0, size=n)
    var = rng.uniform(0.05, 2.0, size=n)
    return y, f, var


@pytest.mark.parametrize("k", [1, 2, 7])
def test_cdf_is_the_average_of_the_components_normal_cdfs(k):
    y, f, var = _mixture(np.random.default_rng(k), k, 40)
    # one variance per point
    expected = np.mean([stats.norm.cdf(y, loc=f[j], scale=np.sqrt(var)) for j in range(k)], axis=0)
    np.testing.assert_allclose(metrics.mixture_cdf(y, f, var), expected, rtol=1e-12, atol=1e-15)
    # a scalar variance
    expected = np.mean([stats.norm.cdf(y, loc=f[j], scale=np.sqrt(0.3)) for j in range(k)], axis=0)
    np.testing.assert_allclose(metrics.mixture_cdf(y, f, 0.3), expected, rtol=1e-12, atol=1e-15)


def test_cdf_limits_and_monotonicity():
    f = np.array([[-1.0], [2.0]])
    grid = np.linspace(-20, 20, 401)
    u = np.array([metrics.mixture_cdf(np.array([t]), f, 0.5)[0] for t in grid])
    assert np.all(np.diff(u) >= 0)
    assert u[0] < 1e-12 and u[-1] > 1 - 1e-12
    # midway between two equal-weight components of equal variance: exactly 1/2 by symmetry
    np.testing.assert_allclose(metrics.mixture_cdf(np.array([0.5]), f, 0.5), [0.5], rtol=1e-14)


@pytest.mark.parametrize("level", [0.95, 0.5, 0.8])
def test_single_component_coverage_is_the_share_inside_mean_pm_z_sd(level):
    rng = np.random.default_rng(3)
    n = 2000
    f = rng.normal(size=(1, n))
    sd = rng.uniform(0.2, 1.5, size=n)
    y = f[0] + rng.standard_t(3, size=n) * sd  # heavier tails than the predictive: coverage is not `level`
    z = Z975 if level == 0.95 else stats.norm.ppf((1 + level) / 2)
    expected = np.mean(np.abs(y - f[0]) / sd <= z)
    assert metrics.mixture_coverage(y, f, sd**2, level) == pytest.approx(expected, abs=0.5 / n)
    if level == 0.95:
        assert metrics.mixture_coverage(y, f, sd**2) == pytest.approx(expected, abs=0.5 / n)  # the default


def test_coverage_of_draws_from_the_mixture_is_the_level():
    rng = np.random.default_rng(11)
    n, k = 20000, 3
    f = rng.normal(0.0, 2.0, size=(k, n))  # components far apart relative to the noise: a multimodal mixture
    var = rng.uniform(0.05, 0.5, size=n)
    comp = rng.integers(k, size=n)
    y = f[comp, np.arange(n)] + rng.normal(size=n) * np.sqrt(var)
    tol = 4 * np.sqrt(0.95 * 0.05 / n)
    assert abs(metrics.mixture_coverage(y, f, var, 0.95) - 0.95) < tol
    # the mixture's CDF at its own draws is uniform: a Kolmogorov-Smirnov test at level 1e-4
    assert stats.kstest(metrics.mixture_cdf(y, f, var), "uniform").pvalue > 1e-4


def test_bad_shapes_and_levels_are_errors():
    y = np.zeros(5)
    for f in (np.zeros(5), np.zeros((2, 4)), np.zeros((2, 5, 1))):
        with pytest.raises(ValueError, match="shape"):
            metrics.mixture_cdf(y, f, 1.0)
        with pytest.raises(ValueError, match="shape"):
            metrics.mixture_coverage(y, f, 1.0)
    for level in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="level"):
            metrics.mixture_coverage(y, np.zeros((2, 5)), 1.0, level)


def test_coverage_from_pit_values_is_coverage_levels():
    rng = np.random.default_rng(3)
    f = rng.normal(size=(6, 40))
    y = rng.normal(size=40)
    u = metrics.mixture_cdf(y, f, 0.4)
    assert metrics.pit_coverage(u) == metrics.coverage_levels(y, f, 0.4)
    assert metrics.pit_coverage(np.array([0.5, 0.01, 0.99]), (0.9,)) == {0.9: pytest.approx(1 / 3)}
    with pytest.raises(ValueError, match="at least one"):
        metrics.pit_coverage(u, ())
