"""bootens_core.perturb: log likelihood and log joints against scipy, gradients against finite differences,
the law of the perturbations, and the paper's identity E[grad log p~] = grad log p."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bootens_core import models, perturb


@pytest.fixture(scope="module")
def mlp_problem():
    """A small tanh network (smooth, so finite differences are clean) with 2-D inputs."""
    model = models.mlp(2, (5, 4), "tanh", weight_var=1.5, bias_var=0.4, scale_by_fan_in=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 2))
    y = rng.normal(size=7)
    params = jax.jit(lambda k: models.prior_sample(k, model))(jax.random.key(10))
    return model, jnp.asarray(x), jnp.asarray(y), params


@pytest.fixture(scope="module")
def linear_problem():
    rng = np.random.default_rng(1)
    n, D = 9, 4
    Phi = rng.normal(size=(n, D))
    model = models.linear_in_features(lambda x: x, D, prior_var=0.8)
    y = Phi @ rng.normal(size=D) + 0.3 * rng.normal(size=n)
    w = rng.normal(size=D)
    return model, Phi, y, w


def test_gaussian_loglik_scalar_variance():
    rng = np.random.default_rng(2)
    f, y = rng.normal(size=13), rng.normal(size=13)
    want = stats.norm.logpdf(y, f, np.sqrt(0.37)).sum()
    assert float(perturb.gaussian_loglik(jnp.asarray(f), jnp.asarray(y), 0.37)) == pytest.approx(
        want, rel=1e-13
    )


def test_gaussian_loglik_per_point_variance():
    rng = np.random.default_rng(3)
    f, y = rng.normal(size=13), rng.normal(size=13)
    var = rng.uniform(0.05, 3.0, size=13)
    want = stats.norm.logpdf(y, f, np.sqrt(var)).sum()
    got = float(perturb.gaussian_loglik(jnp.asarray(f), jnp.asarray(y), jnp.asarray(var)))
    assert got == pytest.approx(want, rel=1e-13)


def test_log_joint_is_loglik_plus_prior(mlp_problem):
    model, x, y, params = mlp_problem
    want = float(perturb.gaussian_loglik(model.apply(params, x), y, 0.2)) + float(
        models.prior_logpdf(model, params)
    )
    assert float(perturb.log_joint(model, params, x, y, 0.2)) == pytest.approx(want, rel=1e-13)


def test_log_joint_linear_against_scipy(linear_problem):
    model, Phi, y, w = linear_problem
    want = stats.norm.logpdf(y, Phi @ w, np.sqrt(0.3)).sum() + stats.norm.logpdf(w, 0, np.sqrt(0.8)).sum()
    got = float(perturb.log_joint(model, {"w": jnp.asarray(w)}, jnp.asarray(Phi), jnp.asarray(y), 0.3))
    assert got == pytest.approx(want, rel=1e-13)


def test_perturbed_log_joint_against_scipy(linear_problem):
    """log N(y~; f, sigma^2) + log N(theta; theta~, alpha^2): the labels and the prior centre are replaced."""
    model, Phi, y, w = linear_problem
    rng = np.random.default_rng(4)
    y_t, w_t = y + rng.normal(size=y.shape), rng.normal(size=w.shape)
    pert = perturb.Perturbation(y=jnp.asarray(y_t), anchor={"w": jnp.asarray(w_t)})
    want = stats.norm.logpdf(y_t, Phi @ w, np.sqrt(0.3)).sum() + stats.norm.logpdf(w, w_t, np.sqrt(0.8)).sum()
    got = float(perturb.perturbed_log_joint(model, {"w": jnp.asarray(w)}, jnp.asarray(Phi), pert, 0.3))
    assert got == pytest.approx(want, rel=1e-13)


def test_unperturbed_replicate_gives_the_log_joint(mlp_problem):
    model, x, y, params = mlp_problem
    zero = jax.tree.map(jnp.zeros_like, params)
    got = perturb.perturbed_log_joint(model, params, x, perturb.Perturbation(y=y, anchor=zero), 0.2)
    assert float(got) == pytest.approx(float(perturb.log_joint(model, params, x, y, 0.2)), rel=1e-14)


def _central_fd(fun, theta, eps=1e-5):
    theta = np.asarray(theta, float)
    out = np.empty_like(theta)
    for i in range(theta.size):
        e = np.zeros_like(theta)
        e[i] = eps
        out[i] = (fun(theta + e) - fun(theta - e)) / (2 * eps)
    return out


def _sample(key, model, y, noise_var, n):
    return jax.jit(lambda k: perturb.sample(k, model, y, noise_var, n))(key)


def _check_gradient(model, params, x, pert, noise_var):
    theta0, unravel = models.ravel(params)

    def f(th):
        return perturb.perturbed_log_joint(model, unravel(th), x, pert, noise_var)

    value = jax.jit(f)
    grad = np.asarray(jax.jit(jax.grad(f))(theta0))
    fd = _central_fd(lambda th: float(value(jnp.asarray(th))), theta0)
    # Central differences in float64, eps = 1e-5: truncation O(eps^2 |f'''|), round-off O(1e-16 |f| / eps).
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6 * np.max(np.abs(fd)))


def test_perturbed_gradient_mlp_finite_differences(mlp_problem):
    model, x, y, params = mlp_problem
    pert = _sample(jax.random.key(5), model, y, 0.2, 1)
    pert = jax.tree.map(lambda a: a[0], pert)
    _check_gradient(model, params, x, pert, 0.2)


def test_perturbed_gradient_mlp_per_point_noise(mlp_problem):
    model, x, y, params = mlp_problem
    var = jnp.linspace(0.05, 0.5, y.shape[0])
    pert = jax.tree.map(lambda a: a[0], _sample(jax.random.key(6), model, y, var, 1))
    _check_gradient(model, params, x, pert, var)


def test_perturbed_gradient_linear_closed_form_and_fd(linear_problem):
    """For f = Phi w the gradient is Phi^T (y~ - Phi w) / sigma^2 - (w - w~) / alpha^2."""
    model, Phi, y, w = linear_problem
    pert = jax.tree.map(lambda a: a[0], _sample(jax.random.key(7), model, jnp.asarray(y), 0.3, 1))
    params = {"w": jnp.asarray(w)}
    _check_gradient(model, params, jnp.asarray(Phi), pert, 0.3)
    g = jax.jit(jax.grad(lambda p: perturb.perturbed_log_joint(model, p, jnp.asarray(Phi), pert, 0.3)))(
        params
    )["w"]
    y_t, w_t = np.asarray(pert.y), np.asarray(pert.anchor["w"])
    want = Phi.T @ (y_t - Phi @ w) / 0.3 - (w - w_t) / 0.8
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-12)


def test_sample_shapes_and_determinism(mlp_problem):
    model, x, y, params = mlp_problem
    pert = _sample(jax.random.key(8), model, y, 0.2, 5)
    assert pert.y.shape == (5, y.shape[0])
    for leaf, p in zip(jax.tree.leaves(pert.anchor), jax.tree.leaves(params), strict=True):
        assert leaf.shape == (5, *p.shape)
    again = _sample(jax.random.key(8), model, y, 0.2, 5)
    for a, b in zip(jax.tree.leaves(pert), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = _sample(jax.random.key(9), model, y, 0.2, 5)
    assert not np.allclose(np.asarray(pert.y), np.asarray(other.y))


def test_each_replicate_comes_from_its_particles_own_key(mlp_problem):
    """Replicate i is drawn from fold_in(key, i) alone: the first k of n replicates are the k-replicate draw,
    and replicate i's labels are y + sigma * N(0, 1) from the first half of particle i's key."""
    model, x, y, params = mlp_problem
    key = jax.random.key(21)
    big, small = _sample(key, model, y, 0.2, 7), _sample(key, model, y, 0.2, 3)
    for a, b in zip(jax.tree.leaves(big), jax.tree.leaves(small), strict=True):
        np.testing.assert_array_equal(np.asarray(a)[:3], np.asarray(b))
    keys = perturb.particle_keys(key, 7)
    assert keys.shape == (7,)
    for i in (0, 4, 6):
        assert jnp.array_equal(jax.random.key_data(keys[i]), jax.random.key_data(jax.random.fold_in(key, i)))
        k_labels, _ = jax.random.split(keys[i])
        alone = np.asarray(y) + np.sqrt(0.2) * np.asarray(jax.random.normal(k_labels, y.shape, y.dtype))
        np.testing.assert_allclose(np.asarray(big.y)[i], alone, rtol=1e-12, atol=1e-12)
    # distinct particles differ
    assert not np.allclose(np.asarray(big.y)[0], np.asarray(big.y)[1])


def _check_normal_sample(z, var, what):
    """iid N(0, var) entries: mean within 5 sqrt(var/N), sample variance within 5 var sqrt(2/(N-1))."""
    z = np.asarray(z).ravel()
    N = z.size
    assert abs(z.mean()) < 5 * np.sqrt(var / N), what
    assert abs(z.var(ddof=1) - var) < 5 * var * np.sqrt(2 / (N - 1)), (what, z.var(ddof=1), var)


def test_perturbed_labels_have_noise_variance():
    """y~ - y ~ N(0, sigma^2) independently per point and replicate."""
    model = models.scalar_linear()
    y = jnp.linspace(-2.0, 3.0, 10)
    pert = _sample(jax.random.key(11), model, y, 0.3, 3000)
    eps = np.asarray(pert.y) - np.asarray(y)[None]
    _check_normal_sample(eps, 0.3, "labels")
    # Independent across points: correlations between columns have sd ~ 1/sqrt(3000).
    corr = np.corrcoef(eps, rowvar=False)
    assert np.max(np.abs(corr[~np.eye(10, dtype=bool)])) < 5 / np.sqrt(3000)


def test_perturbed_labels_with_per_point_variance():
    model = models.scalar_linear()
    y = jnp.zeros(6)
    var = np.array([0.01, 0.1, 0.5, 1.0, 2.0, 4.0])
    pert = _sample(jax.random.key(12), model, y, jnp.asarray(var), 4000)
    _check_normal_sample(np.asarray(pert.y) / np.sqrt(var)[None], 1.0, "standardised labels")
    for i in (0, 5):
        _check_normal_sample(np.asarray(pert.y)[:, i], var[i], f"point {i}")


def test_anchors_have_the_prior_variances():
    model = models.mlp(3, (20,), weight_var=2.0, bias_var=0.5, scale_by_fan_in=True)
    pert = _sample(jax.random.key(13), model, jnp.zeros(4), 0.1, 3000)
    for layer, var in zip(pert.anchor, model.prior_var, strict=True):
        for name in ("w", "b"):
            _check_normal_sample(layer[name], var[name], name)


def test_expected_perturbed_gradient_is_the_gradient(mlp_problem):
    """The paper's identity: averaging over replicates, E[grad log p~(D, theta)] = grad log p(D, theta).

    For the Gaussian model the perturbed gradient is grad log p + J^T eps / sigma^2 + theta~ / alpha^2 (J the
    Jacobian of f), so with N replicates each coordinate of the mean gradient is off by a N(0, SE^2) error,
    SE the sample sd over sqrt(N): we allow 5 SE per coordinate. The covariance of the perturbation
    term is C = J^T J / sigma^2 + diag(1 / alpha^2); the mean of ||g - grad log p||^2 is tr C with Monte-Carlo
    sd sqrt(2 tr C^2 / N) (Gaussian quadratic form), checked at 5 of those.
    """
    model, x, y, params = mlp_problem
    noise_var, N = 0.2, 4000
    theta0, unravel = models.ravel(params)
    pert = _sample(jax.random.key(14), model, y, noise_var, N)
    g_one = jax.grad(lambda th, p: perturb.perturbed_log_joint(model, unravel(th), x, p, noise_var))
    grads = np.asarray(jax.jit(jax.vmap(g_one, in_axes=(None, 0)))(theta0, pert))
    exact = np.asarray(
        jax.jit(jax.grad(lambda th: perturb.log_joint(model, unravel(th), x, y, noise_var)))(theta0)
    )
    se = grads.std(0, ddof=1) / np.sqrt(N)
    z = (grads.mean(0) - exact) / se
    assert np.max(np.abs(z)) < 5, z

    J = np.asarray(jax.jit(jax.jacobian(lambda th: model.apply(unravel(th), x)))(theta0))  # (n, m)
    inv_alpha2 = np.concatenate(
        [
            np.full(np.size(p), 1 / v)
            for v, p in zip(jax.tree.leaves(model.prior_var), jax.tree.leaves(params), strict=True)
        ]
    )
    assert inv_alpha2.shape == theta0.shape
    C = J.T @ J / noise_var + np.diag(inv_alpha2)
    q = np.sum((grads - exact) ** 2, axis=1)
    assert abs(q.mean() - np.trace(C)) < 5 * np.sqrt(2 * np.trace(C @ C) / N)


def test_an_unobserved_point_adds_nothing_and_keeps_its_label(mlp_problem):
    """Variance +inf: the point leaves the log likelihood (value and gradient) as without it, and its label is
    not perturbed (inf * N(0, 1) would be inf or NaN)."""
    model, x, y, params = mlp_problem
    var = jnp.asarray([0.2] * 5 + [jnp.inf] * 2)
    f = model.apply(params, x)
    assert float(perturb.gaussian_loglik(f, y, var)) == pytest.approx(
        float(perturb.gaussian_loglik(f[:5], y[:5], 0.2)), rel=1e-13)
    pert = perturb.sample(jax.random.key(3), model, y, var, 4)
    assert np.all(np.isfinite(pert.y)) and np.array_equal(np.asarray(pert.y[:, 5:]), np.tile(y[5:], (4, 1)))
    alone = perturb.sample(jax.random.key(3), model, y[:5], 0.2, 4)
    np.testing.assert_array_equal(np.asarray(pert.y[:, :5]), np.asarray(alone.y))  # drawn by the row's index
    grad = jax.grad(lambda p: perturb.perturbed_log_joint(model, p, x, jax.tree.map(lambda a: a[0], pert), var))
    want = jax.grad(lambda p: perturb.perturbed_log_joint(model, p, x[:5], jax.tree.map(lambda a: a[0], alone),
                                                          0.2))
    for g, w in zip(jax.tree.leaves(grad(params)), jax.tree.leaves(want(params))):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12, atol=1e-14)
