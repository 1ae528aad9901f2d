"""Section 4.1 of the paper at its own scale: closed-form perturbed MAPs are exact posterior samples.

For Bayesian linear regression the MAP of a replicate, ``w* = A^-1 (Phi^T y~ / sigma^2 + w~ / alpha^2)``, is a
linear function of the Gaussian perturbations, so over replicates it is Gaussian with mean ``w_bar`` and
covariance ``A^-1`` -- but only when both the labels are perturbed and the prior is anchored. The setting is
the paper's: D = 1024 trigonometric features (l = 1.6), 64 points, sigma^2 = 0.1, alpha^2 = 1, k = 2000.

Every test here is paired with a negative control that the same test must reject, so a pass is evidence.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bootens_core.exact import linear
from bootens_core import models
from bootens_core.data import synthetic

pytestmark = pytest.mark.slow

D, LENGTHSCALE, N_DATA, NOISE_VAR, PRIOR_VAR, K = 1024, 1.6, 64, 0.1, 1.0, 2000
N_REF = 30  # repetitions of exact sampling that give the null distribution of each statistic
Z_MAX = 5.0  # reject beyond 5 Monte-Carlo sd of the exact-sampling distribution
P_MIN = 1e-3  # chi-square test of the mean: reject at p < 1e-3


@pytest.fixture(scope="module")
def setting():
    k_omega, k_data, k_pert, k_ref = jax.random.split(jax.random.key(2024), 4)
    omega = synthetic.trig_frequencies(k_omega, D, LENGTHSCALE)
    data = synthetic.trig_regression(k_data, N_DATA, NOISE_VAR)
    model = models.trig_features(jnp.asarray(omega), PRIOR_VAR)
    Phi = np.asarray(model.features(jnp.asarray(data.x)))
    post = linear.posterior(Phi, data.y, NOISE_VAR, PRIOR_VAR)
    rng = np.random.default_rng(np.asarray(jax.random.key_data(k_pert)).ravel().tolist())
    eps = np.sqrt(NOISE_VAR) * rng.standard_normal((K, N_DATA))
    anchors = np.sqrt(PRIOR_VAR) * rng.standard_normal((K, D))
    cov = post.cov
    # The null distributions, from exact posterior samples (numpy, by a Cholesky factor of A^-1).
    L = np.linalg.cholesky(cov)
    ref_cov_err, ref_kl = [], []
    for _ in range(N_REF):
        w = post.mean + rng.standard_normal((K, D)) @ L.T
        ref_cov_err.append(linear.cov_rel_error(w, cov))
        ref_kl.append(linear.projected_kl(post, w))
    return dict(
        Phi=Phi,
        y=data.y,
        post=post,
        cov=cov,
        eps=eps,
        anchors=anchors,
        ref_cov_err=np.array(ref_cov_err),
        ref_kl=np.array(ref_kl),
    )


def _maps(s, labels=True, anchor=True):
    y_t = s["y"][None] + (s["eps"] if labels else 0.0)
    w_t = s["anchors"] if anchor else np.zeros_like(s["anchors"])
    return linear.perturbed_map(s["post"], s["Phi"], np.broadcast_to(y_t, (K, N_DATA)), w_t)


def _mean_pvalue(s, w):
    """k (m - w_bar)^T A (m - w_bar) ~ chi2_D if the k samples are iid N(w_bar, A^-1)."""
    post = s["post"]
    d = w.mean(0) - post.mean
    c = d @ post.V
    perp = d - c @ post.V.T
    chi2 = K * (np.sum(post.lam * c**2) + np.sum(perp**2) / post.prior_var)
    return float(stats.chi2.sf(chi2, D))


def _z(value, ref):
    return (value - ref.mean()) / ref.std(ddof=1)


def test_the_setting_is_the_papers(setting):
    post = setting["post"]
    assert post.D == D and post.V.shape == (D, N_DATA)
    # Exact-sampling references agree with their closed forms (this also validates the null distributions).
    se = setting["ref_kl"].std(ddof=1) / np.sqrt(N_REF)
    assert abs(setting["ref_kl"].mean() - linear.expected_self_distance(N_DATA, K)) < Z_MAX * se
    e2 = setting["ref_cov_err"] ** 2
    assert abs(e2.mean() - linear.expected_cov_rel_error(setting["cov"], K) ** 2) < Z_MAX * e2.std(
        ddof=1
    ) / np.sqrt(N_REF)


def test_perturbed_maps_have_the_posterior_mean(setting):
    assert _mean_pvalue(setting, _maps(setting)) > P_MIN


def test_perturbed_maps_have_the_posterior_covariance(setting):
    err = linear.cov_rel_error(_maps(setting), setting["cov"])
    assert abs(_z(err, setting["ref_cov_err"])) < Z_MAX


def test_perturbed_maps_match_the_posterior_on_the_data_subspace(setting):
    """The whitened data-subspace law (where the data act): projected KL within the exact-sampling spread."""
    kl = linear.projected_kl(setting["post"], _maps(setting))
    assert abs(_z(kl, setting["ref_kl"])) < Z_MAX


def test_negative_control_without_prior_anchor(setting):
    """Anchors at 0: the MAPs lose the prior's variance off the data subspace; the covariance test must reject
    decisively (and the data-subspace test too), although the mean is still right."""
    w = _maps(setting, anchor=False)
    assert _z(linear.cov_rel_error(w, setting["cov"]), setting["ref_cov_err"]) > 20 * Z_MAX
    assert _z(linear.projected_kl(setting["post"], w), setting["ref_kl"]) > Z_MAX


def test_negative_control_without_label_perturbation(setting):
    """Observed labels only: the MAP covariance is A^-1 / alpha^2 A^-1, too narrow where the data are
    informative. The data-subspace test must reject it."""
    w = _maps(setting, labels=False)
    assert _z(linear.projected_kl(setting["post"], w), setting["ref_kl"]) > Z_MAX
