"""bootens_core.classification: the label transform against its closed forms and scipy's Gamma, the
categorical log joint by hand, and NUTS on it against 2-D quadrature of an exactly reducible posterior."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.special import expit, log_softmax, logsumexp, softmax

from bootens_core import classification, ensemble, samplers, models


def test_transform_values_for_the_papers_alpha_eps():
    t = classification.transform([1, 0], n_classes=2, alpha_eps=0.01)
    alpha = np.array([[0.01, 1.01], [1.01, 0.01]])
    var = np.log(1 / alpha + 1)
    np.testing.assert_allclose(t.noise_var, var, rtol=1e-15)
    np.testing.assert_allclose(t.y + t.offset, np.log(alpha) - var / 2, rtol=1e-14)
    assert t.noise_var[0, 1] == pytest.approx(np.log(2.01 / 1.01), rel=1e-14)  # log(1/1.01 + 1)
    assert t.noise_var[0, 0] == pytest.approx(np.log(101), rel=1e-14)


@pytest.mark.parametrize("alpha", [0.01, 0.1, 1.01, 3.0])
def test_lognormal_matches_the_gammas_mean_and_variance(alpha):
    var = np.log1p(1 / alpha)
    mean_log = np.log(alpha) - var / 2
    m, v = classification.lognormal_moments(mean_log, var)
    g = stats.gamma(alpha)
    assert m == pytest.approx(g.mean(), rel=1e-12)
    assert v == pytest.approx(g.var(), rel=1e-12)
    # the same moments by scipy's log-normal (shape s = sd of the log, scale = exp(mean of the log))
    ln = stats.lognorm(s=np.sqrt(var), scale=np.exp(mean_log))
    assert ln.mean() == pytest.approx(g.mean(), rel=1e-12)
    assert ln.var() == pytest.approx(g.var(), rel=1e-10)
    gm, gv = classification.gamma_moments(alpha)
    assert (gm, gv) == (pytest.approx(alpha), pytest.approx(alpha))


def test_lognormal_mean_by_monte_carlo():
    """exp(N(y~, s~^2)) for alpha = 1.01: the sample mean lies within 4 standard errors of alpha."""
    alpha = 1.01
    var = np.log1p(1 / alpha)
    draws = np.exp(np.random.default_rng(0).normal(np.log(alpha) - var / 2, np.sqrt(var), 200_000))
    se = draws.std() / np.sqrt(draws.size)
    assert abs(draws.mean() - alpha) < 4 * se


def test_round_trip_recovers_alpha_and_labels():
    labels = np.array([0, 2, 1, 1, 2, 0, 2])
    t = classification.transform(labels, alpha_eps=0.05)
    alpha = np.exp(t.y + t.offset + t.noise_var / 2)
    np.testing.assert_allclose(alpha, np.eye(3)[labels] + 0.05, rtol=1e-13)
    np.testing.assert_array_equal(np.argmax(t.y + t.offset, axis=1), labels)
    np.testing.assert_array_equal(np.round(alpha - 0.05).astype(int), np.eye(3, dtype=int)[labels])


def test_offsets_keep_the_prior_class_probabilities():
    labels = np.array([0] * 7 + [1] * 2 + [2])
    t = classification.transform(labels)
    np.testing.assert_allclose(softmax(t.offset), [0.7, 0.2, 0.1], rtol=1e-12)
    assert abs(t.y.mean()) < 1e-12  # the centred targets have mean zero overall
    # a network whose outputs are all zero predicts the class frequencies
    model = models.mlp(2, (3,), out_dim=3)
    zero = jax.tree.map(jnp.zeros_like, models.prior_sample(jax.random.key(0), model, 1))
    p = classification.predict_proba(model, zero, np.ones((4, 2)), t.offset)
    np.testing.assert_allclose(p[0], np.tile([0.7, 0.2, 0.1], (4, 1)), rtol=1e-12)


@pytest.mark.parametrize(
    "labels, n_classes, match",
    [
        ([0.5, 1.0], None, "integers"),
        ([-1, 0], None, "integers"),
        ([0, 0], None, "at least 2 classes"),
        ([0, 2], 2, "out of range"),
        ([[0, 1]], None, "vector"),
        ([0.0, np.nan], None, "NaN"),
        (["a", "b"], None, "integers"),
    ],
)
def test_bad_labels_get_one_clear_error(labels, n_classes, match):
    with pytest.raises(ValueError, match=match):
        classification.transform(labels, n_classes)


def test_a_class_without_labels_is_an_error():
    with pytest.raises(ValueError, match=r"class\(es\) \[1\] have no training labels"):
        classification.transform([0, 0, 2])


def test_bad_alpha_eps():
    with pytest.raises(ValueError, match="alpha_eps"):
        classification.transform([0, 1], alpha_eps=0.0)


def test_log_likelihood_and_joint_by_hand():
    rng = np.random.default_rng(3)
    model = models.mlp(2, (4,), out_dim=3, weight_var=0.5)
    params = models.prior_sample(jax.random.key(1), model)
    x = rng.normal(size=(6, 2))
    labels = np.array([0, 1, 2, 2, 1, 0])
    f = np.asarray(model.apply(params, jnp.asarray(x)))
    want = np.sum(log_softmax(f, axis=1)[np.arange(6), labels])
    got = classification.log_likelihood(model, params, jnp.asarray(x), jnp.asarray(labels))
    assert float(got) == pytest.approx(want, rel=1e-12)
    joint = classification.log_joint(model, params, jnp.asarray(x), jnp.asarray(labels))
    assert float(joint) == pytest.approx(want + float(models.prior_logpdf(model, params)), rel=1e-12)
    log_density, unravel = classification.log_density_fn(model, x, labels)
    theta, _ = models.ravel(params)
    assert float(log_density(theta)) == pytest.approx(float(joint), rel=1e-12)


def test_train_needs_one_output_per_class():
    model = models.mlp(1, (3,))
    with pytest.raises(ValueError, match="out_dim=2"):
        classification.train(jax.random.key(0), model, np.zeros(4), [0, 1, 0, 1], n_particles=2,
                             opt=ensemble.optimizer("adam", 0.01), steps=1)


def test_train_fits_separable_data_and_predicts_distributions():
    x = np.linspace(-2, 2, 20)
    labels = (x > 0).astype(int)
    model = models.mlp(1, (8,), out_dim=2, weight_var=2.0, scale_by_fan_in=True)
    fit = classification.train(jax.random.key(0), model, x, labels, n_particles=16,
                               opt=ensemble.optimizer("lbfgs", 0.5, linesearch="zoom"), steps=100)
    p = classification.predict_proba(model, fit.ensemble.params, x, fit.targets.offset)
    assert p.shape == (16, 20, 2)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    assert np.mean(np.argmax(p.mean(0), axis=1) == labels) == 1.0
    band = classification.summarise(p)
    assert np.all(band["lower"] <= band["mean"] + 1e-12) and np.all(band["mean"] <= band["upper"] + 1e-12)
    # the perturbed particles differ from each other; the plain ones start apart but climb one log joint
    assert np.std(p[:, :, 1], axis=0).max() > 1e-3


@pytest.mark.slow
def test_nuts_on_the_categorical_likelihood_matches_quadrature():
    """Softmax regression with 2 classes, one input, prior N(0, v) on every weight and bias: the likelihood
    depends only on the differences (dw, db) = (w1 - w0, b1 - b0), which are a priori independent
    N(0, 2v). So the posterior mean of p(y = 1 | x0) is a 2-D integral, done on a grid; NUTS must match it
    within 4 Monte-Carlo standard errors (ESS-based)."""
    v = 1.0
    x = np.array([-1.5, -0.7, -0.2, 0.1, 0.4, 0.9, 1.3, 2.0])
    labels = np.array([0, 0, 1, 0, 1, 1, 0, 1])
    x0 = 0.8
    g = np.linspace(-9, 9, 601)
    dw, db = np.meshgrid(g, g, indexing="ij")
    logit = dw[..., None] * x + db[..., None]
    loglik = np.sum(np.where(labels == 1, -np.logaddexp(0, -logit), -np.logaddexp(0, logit)), axis=-1)
    logpost = loglik + stats.norm.logpdf(dw, 0, np.sqrt(2 * v)) + stats.norm.logpdf(db, 0, np.sqrt(2 * v))
    w = np.exp(logpost - logsumexp(logpost))
    exact = float(np.sum(w * expit(dw * x0 + db)))

    model = models.mlp(1, (), out_dim=2, weight_var=v, bias_var=v)
    log_density, unravel = classification.log_density_fn(model, x, labels)
    init = 0.1 * jax.random.normal(jax.random.key(1), (4, models.n_params(model)), jnp.float64)
    samples, info, _, _, _ = samplers.nuts(jax.random.key(2), log_density, init, n_warmup=500, n_draws=1000)
    flat = samples.reshape(-1, samples.shape[-1])
    params = jax.vmap(unravel)(jnp.asarray(flat))
    p = classification.predict_proba(model, params, np.array([x0]), np.zeros(2))[:, 0, 1]
    chains = p.reshape(4, 1000)
    ess = float(samplers.ess(chains[..., None], "mean")[0])
    se = p.std() / np.sqrt(ess)
    assert sum(info["n_divergent"]) == 0
    assert abs(p.mean() - exact) < 4 * se, (p.mean(), exact, se)


def test_padding_rows_leave_the_targets_and_the_particles_as_without_them():
    """``observed``: padded rows (any valid label) enter neither the class offsets nor the objectives; the
    particles are the unpadded ones up to float64 rounding."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(24, 2))
    labels = (x[:, 0] + 0.3 * rng.normal(size=24) > 0).astype(int)
    model = models.mlp(2, (6,), out_dim=2)
    opt = ensemble.optimizer("lbfgs", 1.0, linesearch="zoom")
    kw = dict(n_particles=3, opt=opt, steps=15, dtype=jnp.float64)
    plain = classification.train(jax.random.key(1), model, x, labels, **kw)
    xp = np.concatenate([x, rng.normal(size=(8, 2))])
    padded = classification.train(jax.random.key(1), model, xp, np.concatenate([labels, np.ones(8, int)]),
                                  observed=np.arange(32) < 24, **kw)
    np.testing.assert_array_equal(padded.targets.offset, plain.targets.offset)
    np.testing.assert_array_equal(padded.targets.y, plain.targets.y)
    for a, b in zip(jax.tree.leaves(plain.ensemble.params), jax.tree.leaves(padded.ensemble.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-8, atol=1e-9)
