"""Grid posteriors, KDEs and the grid KL against closed forms (a two-weight linear-Gaussian model)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bootens_core.exact import density, linear
from bootens_core import metrics, models


def _linear2d():
    """A 2-feature Bayesian linear regression, whose posterior is an exact Gaussian."""
    rng = np.random.default_rng(0)
    Phi = rng.normal(size=(8, 2))
    y = Phi @ np.array([0.7, -0.4]) + 0.5 * rng.normal(size=8)
    model = models.linear_in_features(lambda x: jnp.reshape(x, (-1, 2)), 2, prior_var=1.0)
    post = linear.posterior(Phi, y, 0.25, 1.0)
    return model, Phi, y, post


def test_grid_posterior_matches_closed_form():
    model, Phi, y, post = _linear2d()
    g = density.grid(3.0, 201)
    logp = density.grid_log_posterior(model, Phi, y, 0.25, g)
    exact = stats.multivariate_normal(post.mean, post.cov).logpdf(g.points).reshape(g.shape)
    # Mass outside [-3, 3]^2 is negligible here (posterior sds < 0.3), so renormalising changes nothing.
    mass = np.exp(logp)
    near = mass > 1e-6 * mass.max()
    np.testing.assert_allclose(logp[near], exact[near], atol=1e-6)


def test_kl_of_two_gaussians_matches_closed_form():
    g = density.grid(6.0, 301)
    m0, S0 = np.array([0.3, -0.2]), np.array([[0.5, 0.2], [0.2, 0.4]])
    m1, S1 = np.array([-0.1, 0.4]), np.array([[0.8, -0.1], [-0.1, 0.6]])
    lq = density.normalise(stats.multivariate_normal(m0, S0).logpdf(g.points).reshape(g.shape), g)
    lp = density.normalise(stats.multivariate_normal(m1, S1).logpdf(g.points).reshape(g.shape), g)
    assert density.kl(lq, lp, g) == pytest.approx(metrics.gaussian_kl(m0, S0, m1, S1), rel=1e-6)
    assert density.kl(lq, lq, g) == pytest.approx(0.0, abs=1e-10)


def test_normalise_integrates_to_one():
    g = density.grid(2.0, 51)
    ld = density.normalise(-np.sum(g.points**2, axis=1).reshape(g.shape) + 7.0, g)
    from scipy import integrate

    total = integrate.simpson(integrate.simpson(np.exp(ld), x=g.b, axis=1), x=g.a)
    assert total == pytest.approx(1.0, rel=1e-12)


def test_kde_of_many_gaussian_samples_is_close_to_the_gaussian():
    g = density.grid(5.0, 121)
    S = np.array([[1.0, 0.3], [0.3, 0.5]])
    samples = np.asarray(jax.random.multivariate_normal(jax.random.key(1), jnp.zeros(2), S, (4000,)))
    lq = density.kde_log_density(samples, g)
    lp = density.normalise(stats.multivariate_normal(np.zeros(2), S).logpdf(g.points).reshape(g.shape), g)
    # Scott's bandwidth at n = 4000 widens each variance by a factor 1 + n^(-1/3) ~ 1.063; the KL of that
    # inflation alone is 2 * 0.5 * (0.063 - log 1.063) ~ 0.002. Sampling noise adds about as much.
    assert density.kl(lq, lp, g) < 0.01


@pytest.mark.parametrize(
    ("samples", "match"),
    [
        (np.zeros((5, 3)), "shape"),
        (np.array([[0.0, np.nan], [1.0, 1.0], [2.0, 0.0]]), "NaN"),
        (np.ones((2, 2)), "at least 3"),
        (np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]), "degenerate"),
    ],
)
def test_kde_bad_input(samples, match):
    with pytest.raises(ValueError, match=match):
        density.kde_log_density(samples, density.grid(1.0, 11))


def test_grid_checks():
    with pytest.raises(ValueError, match="odd"):
        density.grid(1.0, 10)
    with pytest.raises(ValueError, match="2 parameters"):
        density.grid_log_posterior(models.scalar_linear(), np.ones(3), np.ones(3), 0.1, density.grid(1.0, 11))
    g = density.grid(1.0, 11)
    with pytest.raises(ValueError, match="match the grid"):
        density.kl(np.zeros((3, 3)), np.zeros(g.shape), g)
