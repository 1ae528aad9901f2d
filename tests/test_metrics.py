"""bootens_core.metrics against scipy, quadrature and Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import logsumexp

from bootens_core import metrics


def test_rmse():
    y = np.array([1.0, 2.0, 3.0, 4.0])
    pred = np.array([1.5, 2.0, 2.0, 4.0])
    assert metrics.rmse(y, pred) == pytest.approx(np.sqrt((0.25 + 0 + 1 + 0) / 4), rel=1e-15)
    assert metrics.rmse(y, y) == 0.0


def test_rmse_shape_mismatch():
    with pytest.raises(ValueError, match="shapes differ"):
        metrics.rmse(np.ones(3), np.ones((3, 1)))


def _mnll_scipy(y, f, noise_var):
    logp = stats.norm.logpdf(y[None], f, np.sqrt(np.broadcast_to(noise_var, y.shape))[None])
    return -np.mean(logsumexp(logp, axis=0, b=1.0 / f.shape[0]))


@pytest.mark.parametrize("per_point", [False, True])
def test_mixture_mnll_against_scipy(per_point):
    rng = np.random.default_rng(0)
    k, n = 7, 11
    y, f = rng.normal(size=n), rng.normal(size=(k, n))
    var = rng.uniform(0.05, 2.0, n) if per_point else 0.3
    assert metrics.mixture_mnll(y, f, var) == pytest.approx(_mnll_scipy(y, f, var), rel=1e-12)


def test_mixture_mnll_single_particle_is_the_gaussian_nll():
    rng = np.random.default_rng(1)
    y, f = rng.normal(size=9), rng.normal(size=(1, 9))
    want = -np.mean(stats.norm.logpdf(y, f[0], np.sqrt(0.2)))
    assert metrics.mixture_mnll(y, f, 0.2) == pytest.approx(want, rel=1e-13)


def test_mixture_mnll_is_not_the_average_particle_nll():
    """Particles at 0 and 6, y = 0, unit variance: the mixture NLL is -log((phi(0) + phi(6)) / 2) ~ 1.61,
    while averaging the particles' NLLs gives (0.92 + 18.92) / 2 ~ 9.92 (Jensen: never smaller)."""
    y, f = np.zeros(1), np.array([[0.0], [6.0]])
    mixture = metrics.mixture_mnll(y, f, 1.0)
    assert mixture == pytest.approx(-np.log(0.5 * (stats.norm.pdf(0.0) + stats.norm.pdf(6.0))), rel=1e-13)
    average = -np.mean(stats.norm.logpdf(0.0, f[:, 0], 1.0))
    assert average - mixture > 8


def test_mixture_mnll_is_stable_far_in_the_tails():
    """Densities that underflow to 0 in float64 (log density ~ -5000) still give the exact log-mean-exp."""
    y = np.array([0.0])
    f = np.array([[100.0], [101.0]])
    var = 1.0
    logs = stats.norm.logpdf(0.0, f[:, 0], 1.0)
    assert np.all(np.exp(logs) == 0.0)
    want = -(np.logaddexp(logs[0], logs[1]) - np.log(2))
    got = metrics.mixture_mnll(y, f, var)
    assert np.isfinite(got) and got == pytest.approx(want, rel=1e-13)


def test_mixture_mnll_shape_check():
    with pytest.raises(ValueError, match=r"f must have shape \(k, n\)"):
        metrics.mixture_mnll(np.zeros(3), np.zeros((2, 4)), 1.0)


@pytest.mark.parametrize(
    "m0, s0, m1, s1", [(0.0, 1.0, 0.0, 1.0), (0.3, 0.5, -1.0, 2.0), (2.0, 3.0, 0.0, 0.7)]
)
def test_gaussian_kl_1d_against_quadrature(m0, s0, m1, s1):
    def integrand(x):
        return stats.norm.pdf(x, m0, s0) * (stats.norm.logpdf(x, m0, s0) - stats.norm.logpdf(x, m1, s1))

    want, abserr = integrate.quad(
        integrand, m0 - 15 * s0, m0 + 15 * s0, epsabs=1e-13, epsrel=1e-12, limit=200
    )
    got = metrics.gaussian_kl(np.array([m0]), np.array([[s0**2]]), np.array([m1]), np.array([[s1**2]]))
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    # Scalars are accepted too.
    assert metrics.gaussian_kl(m0, s0**2, m1, s1**2) == pytest.approx(got, rel=1e-14)


def test_gaussian_kl_2d_against_monte_carlo():
    """KL = E_0[log p0 - log p1]: N draws give SE = sd / sqrt(N); 5 SE."""
    m0, S0 = np.array([0.5, -1.0]), np.array([[1.0, 0.6], [0.6, 2.0]])
    m1, S1 = np.array([0.0, 0.0]), np.array([[2.0, -0.3], [-0.3, 0.5]])
    rng = np.random.default_rng(2)
    N = 200_000
    x = rng.multivariate_normal(m0, S0, size=N)
    log_ratio = stats.multivariate_normal(m0, S0).logpdf(x) - stats.multivariate_normal(m1, S1).logpdf(x)
    got = metrics.gaussian_kl(m0, S0, m1, S1)
    assert abs(got - log_ratio.mean()) < 5 * log_ratio.std(ddof=1) / np.sqrt(N)
    assert got > 0


def test_gaussian_kl_of_identical_gaussians_is_zero():
    m, S = np.array([1.0, 2.0, 3.0]), np.array([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 0.7]])
    assert abs(metrics.gaussian_kl(m, S, m, S)) < 1e-13


@pytest.mark.parametrize("which", [0, 1])
def test_gaussian_kl_rejects_singular_covariances(which):
    v = np.array([[1.0], [2.0]])
    singular = v @ v.T  # rank 1
    good = np.eye(2)
    covs = [good, good]
    covs[which] = singular
    with pytest.raises(ValueError, match="not positive definite"):
        metrics.gaussian_kl(np.zeros(2), covs[0], np.zeros(2), covs[1])


def test_coverage():
    y = np.array([0.0, 1.0, 2.0, 3.0])
    assert metrics.coverage(y, y - 0.5, y + 0.5) == 1.0
    assert metrics.coverage(y, np.full(4, 0.5), np.full(4, 2.0)) == 0.5  # 1 and 2 inside; bounds inclusive
    assert metrics.coverage(y, np.full(4, 1.0), np.full(4, 1.0)) == 0.25


# ------------------------------------------------------------------------------------------ classifiers


def test_ece_hand_computed_four_rows():
    """Confidences 0.9 (right), 0.8 (wrong), 0.7 (right), 0.55 (wrong), one per bin of width 0.1:
    ECE = (|1 - 0.9| + |0 - 0.8| + |1 - 0.7| + |0 - 0.55|) / 4 = 1.75 / 4."""
    p = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.45, 0.55]])
    y = np.array([0, 1, 1, 0])
    assert metrics.ece(p, y, 10) == pytest.approx(1.75 / 4, rel=1e-14)
    r = metrics.reliability(p, y, 10)
    np.testing.assert_array_equal(r.count, [0, 0, 0, 0, 0, 1, 1, 1, 1, 0])
    np.testing.assert_allclose(r.confidence[5:9], [0.55, 0.7, 0.8, 0.9])
    np.testing.assert_array_equal(r.accuracy[5:9], [0, 1, 0, 1])


def test_ece_uses_the_mean_confidence_inside_a_bin():
    """Two rows in one bin, confidences 0.62 and 0.68, one right: gap |0.5 - 0.65| = 0.15 (the bin centre
    0.65 coincides here); with 0.61 and 0.69 still 0.15; with 0.61 and 0.61, |0.5 - 0.61| = 0.11."""
    y = np.array([0, 1])
    for c, want in [((0.62, 0.68), 0.15), ((0.61, 0.69), 0.15), ((0.61, 0.61), 0.11)]:
        p = np.array([[c[0], 1 - c[0]], [c[1], 1 - c[1]]])
        assert metrics.ece(p, y, 10) == pytest.approx(want, abs=1e-12)


def test_ece_of_a_calibrated_predictor_is_zero_and_one_bin_is_the_global_gap():
    # 10 rows at confidence 0.7, 7 right: calibrated
    p = np.tile([0.7, 0.3], (10, 1))
    y = np.array([0] * 7 + [1] * 3)
    assert metrics.ece(p, y) == pytest.approx(0.0, abs=1e-12)
    # one bin: |accuracy - mean confidence| over all rows
    rng = np.random.default_rng(0)
    q = rng.dirichlet([1, 1, 1], size=50)
    lab = rng.integers(0, 3, 50)
    want = abs(np.mean(q.argmax(1) == lab) - q.max(1).mean())
    assert metrics.ece(q, lab, n_bins=1) == pytest.approx(want, rel=1e-12)


def test_confidence_one_falls_in_the_last_bin():
    p = np.array([[1.0, 0.0], [0.0, 1.0]])
    r = metrics.reliability(p, np.array([0, 0]), 4)
    np.testing.assert_array_equal(r.count, [0, 0, 0, 2])
    assert metrics.ece(p, np.array([0, 0]), 4) == pytest.approx(0.5)


def test_accuracy_and_class_mnll_by_hand():
    p = np.array([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.5, 0.5, 0.0]])
    y = np.array([1, 2, 0])
    assert metrics.accuracy(p, y) == pytest.approx(2 / 3)  # ties go to the first class
    assert metrics.class_mnll(p, y) == pytest.approx(-(np.log(0.3) + np.log(0.6) + np.log(0.5)) / 3, rel=1e-14)
    assert np.isfinite(metrics.class_mnll(p, np.array([2, 2, 2])))  # a probability 0 gives a huge, finite NLL


@pytest.mark.parametrize(
    "p, y, match",
    [
        (np.array([0.5, 0.5]), np.array([0]), "shape"),
        (np.array([[0.5, 0.6]]), np.array([0]), "summing to 1"),
        (np.array([[0.5, 0.5]]), np.array([2]), "labels must be integers"),
        (np.array([[np.nan, 0.5]]), np.array([0]), "finite"),
        (np.array([[0.5, 0.5]]), np.array([0, 1]), "labels must have shape"),
    ],
)
def test_classifier_metrics_reject_bad_input(p, y, match):
    with pytest.raises(ValueError, match=match):
        metrics.ece(p, y)


# ------------------------------------------------------------------------------- regression calibration


def _crps_by_quadrature(y: float, f: np.ndarray, var: float | np.ndarray) -> float:
    """CRPS(F, y) = int (F(t) - 1{t >= y})^2 dt for the equal-weight mixture of N(f_j, var_j)."""
    sd = np.sqrt(var)

    def cdf(t):
        return np.mean(stats.norm.cdf((t - f) / sd))

    lo, hi = min(y, f.min()) - 12 * np.max(sd), max(y, f.max()) + 12 * np.max(sd)
    left = integrate.quad(lambda t: cdf(t) ** 2, lo, y, limit=200, epsabs=1e-12)[0]
    right = integrate.quad(lambda t: (1 - cdf(t)) ** 2, y, hi, limit=200, epsabs=1e-12)[0]
    return left + right


def test_crps_of_one_gaussian_is_the_closed_form():
    # Gneiting & Raftery (2007), Eq. 21: CRPS(N(mu, s^2), y) = s [z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi)].
    rng = np.random.default_rng(0)
    y, mu, s = rng.normal(size=50), rng.normal(size=50), rng.uniform(0.2, 2.0, size=50)
    z = (y - mu) / s
    closed = s * (z * (2 * stats.norm.cdf(z) - 1) + 2 * stats.norm.pdf(z) - 1 / np.sqrt(np.pi))
    assert metrics.mixture_crps(y, mu[None], s**2) == pytest.approx(np.mean(closed), rel=1e-12)


def test_crps_of_a_mixture_is_the_integral_of_the_squared_cdf_difference():
    rng = np.random.default_rng(1)
    k, n = 7, 6
    f = rng.normal(scale=1.5, size=(k, n))
    y = rng.normal(size=n)
    var = rng.uniform(0.05, 1.0, size=n)
    by_quadrature = np.mean([_crps_by_quadrature(y[i], f[:, i], var[i]) for i in range(n)])
    assert metrics.mixture_crps(y, f, var) == pytest.approx(by_quadrature, rel=1e-8)


def test_per_component_variances_match_scipy_and_quadrature():
    # A deep ensemble's networks each predict a variance: var of shape (k, n).
    rng = np.random.default_rng(5)
    k, n = 5, 6
    f = rng.normal(scale=1.5, size=(k, n))
    var = rng.uniform(0.05, 2.0, size=(k, n))
    y = rng.normal(size=n)
    dens = np.mean(stats.norm.pdf(y[None], f, np.sqrt(var)), axis=0)
    assert metrics.mixture_mnll(y, f, var) == pytest.approx(-np.mean(np.log(dens)), rel=1e-12)
    cdf = np.mean(stats.norm.cdf(y[None], f, np.sqrt(var)), axis=0)
    np.testing.assert_allclose(metrics.mixture_cdf(y, f, var), cdf, rtol=1e-12)
    by_quadrature = np.mean([_crps_by_quadrature(y[i], f[:, i], var[:, i]) for i in range(n)])
    assert metrics.mixture_crps(y, f, var) == pytest.approx(by_quadrature, rel=1e-8)
    # One variance per point, repeated for every component, is the (n,) form.
    assert metrics.mixture_crps(y, f, np.tile(var[0], (k, 1))) == pytest.approx(metrics.mixture_crps(y, f, var[0]))
    with pytest.raises(ValueError, match="one per component and point"):
        metrics.mixture_mnll(y, f, var[:, :3])
    with pytest.raises(ValueError, match="one per component and point"):
        metrics.mixture_cdf(y, f, var[:3])


def test_crps_pair_term_on_the_first_draws_is_unbiased_for_iid_components():
    rng = np.random.default_rng(6)
    k, n = 400, 300
    y = rng.normal(size=n)
    f = rng.normal(scale=0.8, size=(k, n))  # i.i.d. draws: the predictive is N(0, 0.64 + 0.25) at every point
    exact = metrics.mixture_crps(y, f, 0.25)
    assert metrics.mixture_crps(y, f, 0.25, pair_components=k) == exact
    assert metrics.mixture_crps(y, f, 0.25, pair_components=10 * k) == exact
    s = np.sqrt(0.89)
    z = y / s
    truth = np.mean(s * (z * (2 * stats.norm.cdf(z) - 1) + 2 * stats.norm.pdf(z) - 1 / np.sqrt(np.pi)))
    # Monte-Carlo error of the half pair term of 100 draws: a V-statistic with projection SD about 0.4
    # (|X - X'| has SD about 0.8), so 2 x 0.4 / sqrt(100) per point, over 300 points, halved: about 0.0023;
    # 0.01 is over 4 of them. The exact score against the predictive's closed form: about half that.
    sub = metrics.mixture_crps(y, f, 0.25, pair_components=100)
    assert abs(sub - exact) < 0.01 and abs(exact - truth) < 0.01
    with pytest.raises(ValueError, match="pair_components"):
        metrics.mixture_crps(y, f, 0.25, pair_components=0)


def test_crps_blocks_of_points_give_the_same_score():
    # 70 particles: 2**22 // 70**2 = 855 points per block, so 2000 points take three blocks.
    rng = np.random.default_rng(2)
    f = rng.normal(size=(70, 2000))
    y = rng.normal(size=2000)
    whole = np.mean([metrics.mixture_crps(y[a:a + 500], f[:, a:a + 500], 0.3) for a in range(0, 2000, 500)])
    assert metrics.mixture_crps(y, f, 0.3) == pytest.approx(whole, rel=1e-12)


def test_crps_of_nearly_point_masses_is_the_energy_form():
    # var -> 0: CRPS -> mean_j |f_j - y| - mean_jl |f_j - f_l| / 2 (the empirical energy score).
    rng = np.random.default_rng(3)
    f = rng.normal(size=(5, 8))
    y = rng.normal(size=8)
    energy = np.mean(np.abs(f - y).mean(0) - 0.5 * np.abs(f[:, None] - f[None]).mean((0, 1)))
    assert metrics.mixture_crps(y, f, 1e-14) == pytest.approx(energy, abs=1e-6)


def test_coverage_levels_are_mixture_coverage_level_by_level():
    rng = np.random.default_rng(4)
    f = rng.normal(size=(20, 300))
    y = rng.normal(size=300)
    got = metrics.coverage_levels(y, f, 0.5)
    assert list(got) == [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    for level, share in got.items():
        assert share == metrics.mixture_coverage(y, f, 0.5, level)
    with pytest.raises(ValueError, match=r"level must lie in \(0, 1\), got 1.0"):
        metrics.coverage_levels(y, f, 0.5, (0.5, 1.0))
    with pytest.raises(ValueError, match="at least one"):
        metrics.coverage_levels(y, f, 0.5, ())


def test_calibrated_predictive_covers_each_level_and_has_a_flat_pit():
    """Labels drawn from their own predictive mixture: every coverage within 4 binomial sd of its level and a
    flat PIT histogram; the same labels under the mixtures shrunk to half their width are U-shaped and
    undercover."""
    rng = np.random.default_rng(5)
    k, n, var = 10, 4000, 0.25
    f = rng.normal(size=(k, n))
    y = f[rng.integers(k, size=n), np.arange(n)] + rng.normal(scale=np.sqrt(var), size=n)
    for level, share in metrics.coverage_levels(y, f, var).items():
        assert abs(share - level) < 4 * np.sqrt(level * (1 - level) / n), (level, share)
    good = metrics.pit_histogram(y, f, var)
    assert good.counts.sum() == n and good.edges[0] == 0 and good.edges[-1] == 1 and good.p_value > 1e-4
    np.testing.assert_array_equal(good.pit, metrics.mixture_cdf(y, f, var))
    centre = f.mean(axis=0)
    f_narrow = centre + (f - centre) / 2  # each point's mixture shrunk to half its width about its mean
    narrow = metrics.pit_histogram(y, f_narrow, var / 4)
    assert narrow.p_value < 1e-10 and narrow.counts[0] + narrow.counts[-1] > 2 * n / 10
    assert metrics.coverage_levels(y, f_narrow, var / 4)[0.9] < 0.9 - 4 * np.sqrt(0.09 / n)


def test_calibration_metrics_refuse_bad_input():
    f, y = np.zeros((3, 4)), np.zeros(4)
    with pytest.raises(ValueError, match="shape"):
        metrics.mixture_crps(y, np.zeros((3, 5)), 1.0)
    with pytest.raises(ValueError, match="positive"):
        metrics.mixture_crps(y, f, 0.0)
    for bad in (1, 0, 2.5, True):
        with pytest.raises(ValueError, match="n_bins"):
            metrics.pit_histogram(y, f, 1.0, n_bins=bad)
