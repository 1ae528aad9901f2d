"""bootens_core.exact.linear: exact Bayesian linear regression, the law of gradient-ascent particles, and the KL
estimators, against direct numpy formulas, scipy and Monte Carlo (tolerances from the Monte-Carlo error)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy import stats

from bootens_core.exact import linear
from bootens_core import metrics

NOISE_VAR, PRIOR_VAR = 0.3, 0.7  # not 1, so that a swapped or dropped variance shows


class Problem:
    def __init__(self, n, D, seed):
        rng = np.random.default_rng(seed)
        self.n, self.D = n, D
        self.Phi = rng.normal(size=(n, D))
        self.y = self.Phi @ rng.normal(size=D) + np.sqrt(NOISE_VAR) * rng.normal(size=n)
        # Direct formulas (Section 4.1), no SVD.
        self.A = self.Phi.T @ self.Phi / NOISE_VAR + np.eye(D) / PRIOR_VAR
        self.cov = np.linalg.inv(self.A)
        self.mean = self.cov @ self.Phi.T @ self.y / NOISE_VAR
        self.post = linear.posterior(self.Phi, self.y, NOISE_VAR, PRIOR_VAR)
        self.r = min(n, D)
        # An orthonormal basis of the data subspace (row space of Phi) found independently of the SVD.
        self.Q = np.linalg.qr(self.Phi.T)[0][:, : self.r]
        self.Q_perp = np.linalg.svd(np.eye(D) - self.Q @ self.Q.T)[0][:, : D - self.r]
        self.rng = rng

    def exact_samples(self, size):
        L = np.linalg.cholesky(self.cov)
        return self.mean + self.rng.standard_normal((*size, self.D)) @ L.T


@pytest.fixture(scope="module", params=[(3, 6), (20, 4)], ids=["n<D", "n>D"])
def prob(request):
    return Problem(*request.param, seed=sum(request.param))


@pytest.fixture(scope="module")
def wide():
    return Problem(3, 6, seed=1)


@pytest.fixture(scope="module")
def tall():
    return Problem(20, 4, seed=2)


def _hand_kl(m0, S0, m1, S1):
    """KL(N(m0, S0) || N(m1, S1)) from the textbook formula with slogdet and solve."""
    d = m0.size
    diff = m1 - m0
    return 0.5 * (
        np.trace(np.linalg.solve(S1, S0))
        + diff @ np.linalg.solve(S1, diff)
        - d
        + np.linalg.slogdet(S1)[1]
        - np.linalg.slogdet(S0)[1]
    )


# --- the exact posterior ------------------------------------------------------------------------------


def test_posterior_mean_and_covariance(prob):
    np.testing.assert_allclose(prob.post.mean, prob.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(prob.post.cov, prob.cov, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(prob.post.precision, prob.A, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(prob.post.precision @ prob.post.cov, np.eye(prob.D), atol=1e-10)
    assert prob.post.D == prob.D and prob.post.noise_var == NOISE_VAR and prob.post.prior_var == PRIOR_VAR


def test_posterior_spectrum_and_subspace(prob):
    post = prob.post
    assert post.V.shape == (prob.D, prob.r) and post.lam.shape == (prob.r,)
    np.testing.assert_allclose(post.V.T @ post.V, np.eye(prob.r), atol=1e-12)
    # V spans the row space of Phi; A = lam on V and 1/alpha^2 off it.
    np.testing.assert_allclose(post.V @ post.V.T, prob.Q @ prob.Q.T, atol=1e-10)
    np.testing.assert_allclose(post.s2, np.linalg.svd(prob.Phi, compute_uv=False) ** 2, rtol=1e-10)
    eig = np.sort(np.concatenate([post.lam, np.full(prob.D - prob.r, 1 / PRIOR_VAR)]))
    np.testing.assert_allclose(eig, np.linalg.eigvalsh(prob.A), rtol=1e-10)
    np.testing.assert_allclose(prob.A @ post.V, post.V * post.lam, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(post.mean_coords, post.V.T @ prob.mean, rtol=1e-10, atol=1e-12)


def test_posterior_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="Phi must be"):
        linear.posterior(np.ones((4, 2)), np.ones(5), 0.1, 1.0)


def test_perturbed_map_solves_the_normal_equations(prob):
    k = 5
    y_t = prob.y[None] + prob.rng.normal(size=(k, prob.n))
    anchors = prob.rng.normal(size=(k, prob.D))
    want = np.linalg.solve(prob.A, (y_t @ prob.Phi / NOISE_VAR + anchors / PRIOR_VAR).T).T
    np.testing.assert_allclose(
        linear.perturbed_map(prob.post, prob.Phi, y_t, anchors), want, rtol=1e-10, atol=1e-12
    )


def test_sample_posterior_moments(wide):
    """n exact samples: n (m - w_bar)^T A (m - w_bar) ~ chi2_D (rejected at p < 1e-4); each covariance entry
    S_ij has sd sqrt((C_ij^2 + C_ii C_jj) / (n - 1)), and we allow 5 of them."""
    n = 20_000
    w = linear.sample_posterior(jax.random.key(0), wide.post, n)
    assert w.shape == (n, wide.D)
    d = w.mean(0) - wide.mean
    assert stats.chi2.sf(n * d @ wide.A @ d, wide.D) > 1e-4
    S, C = np.cov(w, rowvar=False), wide.cov
    se = np.sqrt((C**2 + np.outer(np.diag(C), np.diag(C))) / (n - 1))
    assert np.all(np.abs(S - C) < 5 * se), (S - C) / se


# --- gradient-ascent particles: the exact population law ------------------------------------------------


def _gd_population_numpy(p, h, steps, N, seed):
    """Algorithm 1 with plain gradient ascent, in numpy: N particles w_0 = w~, w <- w + h (b - A w)."""
    rng = np.random.default_rng(seed)
    y_t = p.y[None] + np.sqrt(NOISE_VAR) * rng.standard_normal((N, p.n))
    w = np.sqrt(PRIOR_VAR) * rng.standard_normal((N, p.D))
    b = y_t @ p.Phi / NOISE_VAR + w / PRIOR_VAR
    out = {}
    for t in range(max(steps) + 1):
        if t in steps:
            out[t] = w.copy()
        w = w + h * (b - w @ p.A)
    return out


def test_gd_population_against_simulated_particles(wide):
    """Mean and variance of the data-subspace coordinates, at each step, against N simulated particles.

    Means have SE sqrt(var / N); sample variances SE var sqrt(2 / (N - 1)); covariances between two
    coordinates that the law says are uncorrelated SE sqrt(var_i var_j / (N - 1)). 5 SE each. Off the data
    subspace the particles keep the prior: mean 0, variance alpha^2.
    """
    post, N = wide.post, 20_000
    h = 0.9 / post.lam.max()
    steps = [0, 1, 2, 5, 20]
    law = linear.gd_population(post, h, np.array(steps))
    sims = _gd_population_numpy(wide, h, steps, N, seed=3)
    for i, t in enumerate(steps):
        z = sims[t] @ post.V
        mean, var = law.mean[i], law.var[i]
        assert np.all(np.abs(z.mean(0) - mean) < 5 * np.sqrt(var / N)), (t, z.mean(0), mean)
        assert np.all(np.abs(z.var(0, ddof=1) - var) < 5 * var * np.sqrt(2 / (N - 1))), (
            t,
            z.var(0, ddof=1),
            var,
        )
        S = np.cov(z, rowvar=False)
        off = ~np.eye(wide.r, dtype=bool)
        assert np.all(np.abs(S[off]) < 5 * np.sqrt(np.outer(var, var)[off] / (N - 1))), t
        u = sims[t] @ wide.Q_perp
        assert np.all(np.abs(u.mean(0)) < 5 * np.sqrt(PRIOR_VAR / N))
        assert np.all(np.abs(u.var(0, ddof=1) - PRIOR_VAR) < 5 * PRIOR_VAR * np.sqrt(2 / (N - 1)))


def test_gd_population_limits(prob):
    post = prob.post
    law = linear.gd_population(post, 1.0 / post.lam.max(), np.array([0, 10**8]))
    # t = 0: the prior (the particles are the anchors).
    np.testing.assert_allclose(law.var[0], PRIOR_VAR, rtol=1e-14)
    np.testing.assert_allclose(law.mean[0], 0.0, atol=1e-14)
    # t -> infinity at a stable step: the posterior, variance 1/lambda and mean V^T w_bar (Section 4.1).
    np.testing.assert_allclose(law.var[1], 1 / post.lam, rtol=1e-10)
    np.testing.assert_allclose(law.mean[1], post.mean_coords, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(law.steps, [0, 10**8])


def _full_law(p, law, i):
    """The full D-dimensional Gaussian of the population at steps[i]:
    covariance V diag(var) V^T + alpha^2 (I - V V^T)."""
    V = p.post.V
    cov = V @ np.diag(law.var[i]) @ V.T + PRIOR_VAR * (np.eye(p.D) - V @ V.T)
    return V @ law.mean[i], cov


def test_gd_population_kl_is_the_full_gaussian_kl(prob):
    steps = np.array([0, 1, 3, 10, 50, 400])
    law = linear.gd_population(prob.post, 0.8 / prob.post.lam.max(), steps)
    kl = linear.gd_population_kl(prob.post, law)
    for i in range(len(steps)):
        m, S = _full_law(prob, law, i)
        want = metrics.gaussian_kl(m, S, prob.mean, prob.cov)
        assert kl[i] == pytest.approx(want, rel=1e-8, abs=1e-10), steps[i]
        assert kl[i] == pytest.approx(_hand_kl(m, S, prob.mean, prob.cov), rel=1e-8, abs=1e-10)
    assert kl[0] == pytest.approx(
        metrics.gaussian_kl(np.zeros(prob.D), PRIOR_VAR * np.eye(prob.D), prob.mean, prob.cov)
    )
    assert np.all(np.diff(kl) < 0)  # h < 1/lambda_max: every coordinate moves monotonically to the posterior


def test_gd_population_kl_diverges_beyond_two_over_lambda_max(prob):
    lam_max = prob.post.lam.max()
    steps = np.arange(0, 200)
    unstable = linear.gd_population_kl(prob.post, linear.gd_population(prob.post, 2.2 / lam_max, steps))
    assert np.all(np.diff(unstable[20:]) > 0) and unstable[-1] > 1e3 * unstable[0]
    far = linear.gd_population_kl(
        prob.post, linear.gd_population(prob.post, 2.2 / lam_max, np.array([10**6]))
    )
    assert far[0] == np.inf
    stable = linear.gd_population_kl(
        prob.post, linear.gd_population(prob.post, 1.95 / lam_max, np.array([0, 10**6]))
    )
    assert stable[1] < 1e-8 < stable[0]


# --- the ensemble's KL estimator -------------------------------------------------------------------------


def test_projected_kl_by_hand(prob):
    """Project samples and the posterior onto an independently built basis of the data subspace (QR of
    Phi^T; the KL does not depend on the basis) and apply the textbook Gaussian KL."""
    w = prob.exact_samples((40,)) + 0.3  # a population that is not the posterior
    z = w @ prob.Q
    want = _hand_kl(z.mean(0), np.cov(z, rowvar=False), prob.Q.T @ prob.mean, prob.Q.T @ prob.cov @ prob.Q)
    assert linear.projected_kl(prob.post, w) == pytest.approx(want, rel=1e-9)


def test_projected_kl_lower_bounds_the_full_kl(prob):
    """Data processing: the KL of the projections never exceeds the KL of the full moment-matched laws."""
    for shift in (0.0, 0.5):
        w = prob.exact_samples((60,)) * 1.3 + shift
        full = metrics.gaussian_kl(w.mean(0), np.cov(w, rowvar=False), prob.mean, prob.cov)
        assert linear.projected_kl(prob.post, w) <= full + 1e-12


def test_projected_kl_fn_equals_projected_kl(prob):
    w = prob.exact_samples((40,)) * 1.1 - 0.2
    got = float(jax.jit(linear.projected_kl_fn(prob.post))(w))
    assert got == pytest.approx(linear.projected_kl(prob.post, w), rel=1e-8)


def test_projected_kl_needs_more_particles_than_dimensions(prob):
    with pytest.raises(ValueError, match="more particles"):
        linear.projected_kl(prob.post, prob.exact_samples((prob.r,)))


def test_projected_kl_path(prob):
    w = prob.exact_samples((3, 30))
    coords = w @ prob.post.V
    path = linear.projected_kl_path(prob.post, coords)
    np.testing.assert_allclose(path, [linear.projected_kl(prob.post, wt) for wt in w], rtol=1e-12)
    coords[1, 0, 0] = np.nan
    assert linear.projected_kl_path(prob.post, coords)[1] == np.inf


@pytest.mark.parametrize("k", [8, 30])
def test_expected_self_distance_against_monte_carlo(prob, k):
    """The closed-form mean of the estimator on k exact samples, against M Monte-Carlo populations:
    |mean - expected| < 5 SE with SE = sd / sqrt(M)."""
    M = 3000
    values = np.array([linear.projected_kl(prob.post, w) for w in prob.exact_samples((M, k))])
    se = values.std(ddof=1) / np.sqrt(M)
    expected = linear.expected_self_distance(prob.r, k)
    assert abs(values.mean() - expected) < 5 * se, (values.mean(), expected, se)


def test_self_distance(wide):
    """self_distance draws its own exact populations: its values follow the same law (5 SE on the mean)."""
    k, n_pop = 10, 200
    values = linear.self_distance(jax.random.key(4), wide.post, k, n_pop)
    assert values.shape == (n_pop,) and np.all(values > 0)
    se = values.std(ddof=1) / np.sqrt(n_pop)
    assert abs(values.mean() - linear.expected_self_distance(wide.r, k)) < 5 * se


def test_cov_rel_error_definition(tall):
    w = tall.exact_samples((25,))
    S = np.cov(w.T)
    want = np.sqrt(np.sum((S - tall.cov) ** 2) / np.sum(tall.cov**2))
    assert linear.cov_rel_error(w, tall.cov) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("k", [5, 20])
def test_expected_cov_rel_error_against_monte_carlo(tall, k):
    """RMS of cov_rel_error over M exact-sample repetitions: mean(e^2) vs expected^2, 5 SE of mean(e^2)."""
    M = 4000
    e2 = np.array([linear.cov_rel_error(w, tall.cov) ** 2 for w in tall.exact_samples((M, k))])
    se = e2.std(ddof=1) / np.sqrt(M)
    assert abs(e2.mean() - linear.expected_cov_rel_error(tall.cov, k) ** 2) < 5 * se


def test_kl_estimator_sentence():
    text = linear.KL_ESTIMATOR.format(r=64, k=200, D=1024)
    assert "r = min(n, D) = 64" in text and "k = 200" in text and "1024" in text
