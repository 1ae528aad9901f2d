"""bootens_core.samplers.sghmc: scale-adapted SGHMC against the exact posterior of a conjugate linear regression, one
kernel step and whole runs against independent NumPy re-computations of the update equations (same keys), the
frozen adaptation after burn-in, input errors, divergence reporting and determinism.

Statistical tolerances come from the Monte-Carlo error of the quantity checked (4 standard errors, with the
effective sample size from ``samplers.ess``).
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from scipy.linalg import solve_discrete_lyapunov

from bootens_core import samplers, models
from bootens_core.ensemble import DivergedParticlesError
from bootens_core.samplers.sghmc import NOISE_VAR_FLOOR

from tests.samplers.test_mcmc import NOISE_VAR, PRIOR_VAR, LinearProblem

Z = 4.0  # standard errors allowed by every statistical check


@pytest.fixture(scope="module")
def prob():
    return LinearProblem(n=40)  # 3 features, 40 points


def _grad_u(Phi, y, w, noise_var, idx=None):
    """Hand-derived gradient of U = -(N / B) sum_batch log N(y_i | phi_i w, s2_i) - log N(w | 0, a2)."""
    n = len(y)
    idx = np.arange(n) if idx is None else np.asarray(idx)
    P, t, s2 = Phi[idx], y[idx], np.broadcast_to(noise_var, (n,))[idx]
    return -(n / len(idx)) * P.T @ ((t - P @ w) / s2) + w / PRIOR_VAR


def _np_step(theta, v, tau, g, v_hat, G, z, eps, c, adapt):
    """The update equations of the module docstring, in NumPy."""
    if adapt:
        r = 1 / (tau + 1)
        tau, g, v_hat = tau - tau * g * g / v_hat + 1, g - r * g + r * G, v_hat - r * v_hat + r * G**2
    minv = 1 / np.sqrt(v_hat)
    s2 = np.maximum(2 * eps**2 * c * minv - eps**4, NOISE_VAR_FLOOR)
    v = v - eps**2 * minv * G - c * v + np.sqrt(s2) * z
    return theta + v, v, tau, g, v_hat, minv, s2


def _variance_bias_bound(post, eps, c, minv):
    """Relative bias of the stationary variance of the frozen-preconditioner chain with exact gradients, from its
    closed form: the chain is linear, ``x' = T x + noise`` in ``x = (theta, v)``, so its stationary covariance
    solves a discrete Lyapunov equation. ``minv``: the preconditioner of every coordinate."""
    A = post.precision
    D = A.shape[0]
    P = eps**2 * minv[:, None] * A
    I = np.eye(D)
    T = np.block([[I - P, (1 - c) * I], [-P, (1 - c) * I]])
    s2 = np.maximum(2 * eps**2 * c * minv - eps**4, NOISE_VAR_FLOOR)
    B = np.vstack([I, I])
    cov = solve_discrete_lyapunov(T, B @ np.diag(s2) @ B.T)
    return np.diag(cov[:D, :D]) / np.diag(post.cov) - 1


# --------------------------------------------------------------------------------------- against the truth


@pytest.mark.parametrize("batch_size", [40, 10])
def test_sghmc_matches_exact_linear_posterior(prob, batch_size):
    # Settings: eps = lr = 0.005, C = 0.025, 10 restarts, burn-in 4000, then 2500 draws 10 steps apart.
    # Bias: the stationary mean of this linear chain is the posterior mean exactly (full batch: the fixed point of
    # the linear map; minibatches add zero-mean noise). Its variance is biased by the -eps^4 term of the noise,
    # by a relative ~ -eps^2 / (2 C M^-1) (minibatch noise adds at most the same amount back, as v_hat bounds the
    # gradient noise); the closed form below bounds it by ~1.5%, checked to be under one Monte-Carlo standard
    # error. Mixing: the drift eps^2 M^-1 G ~ eps^2 sign(G) brings a prior draw (~1 away) to the posterior in
    # ~C / eps^2 = 1000 steps, well inside the burn-in; at stationarity the chain is near critical damping with a
    # relaxation of ~2 / C = 80 steps, so 10 x 2500 draws give an ESS of about a thousand.
    lr, mdecay = 0.005, 0.025
    res = samplers.sghmc_model(
        jax.random.key(0), prob.model, prob.Phi, prob.y, NOISE_VAR, n_restarts=10, n_draws=2500, burn_in=4000,
        thin=10, lr=lr, mdecay=mdecay, batch_size=batch_size,
    )
    w = np.asarray(res.params["w"])
    assert w.shape == (10, 2500, 3)
    flat = w.reshape(-1, 3)
    ess_mean = samplers.ess(w, "mean")
    # The variance estimator is the mean of (w - mu)^2 (mu exact): its standard error is sd((w - mu)^2) / sqrt(ESS
    # of (w - mu)^2), with sd((w - mu)^2) = sqrt(2) var for a Gaussian posterior.
    ess_sq = samplers.ess((w - prob.post.mean) ** 2, "mean")
    assert np.all(ess_mean > 300) and np.all(ess_sq > 300), (ess_mean, ess_sq)
    sd = np.sqrt(prob.var)
    mean_err = flat.mean(0) - prob.post.mean
    var_hat = np.mean((flat - prob.post.mean) ** 2, axis=0)
    se_var = math.sqrt(2) * prob.var / np.sqrt(ess_sq)
    print(
        f"batch {batch_size}: exact mean {prob.post.mean}, sample mean {flat.mean(0)}, exact var {prob.var}, "
        f"sample var {var_hat}, ESS(mean) {ess_mean}, ESS(sq) {ess_sq}, z_mean {mean_err / (sd / np.sqrt(ess_mean))}, "
        f"z_var {(var_hat - prob.var) / se_var}, minv {res.info['minv_median']}"
    )
    np.testing.assert_array_less(np.abs(mean_err), Z * sd / np.sqrt(ess_mean))
    np.testing.assert_array_less(np.abs(var_hat - prob.var), Z * se_var)
    # The sample variance (about the sample mean) differs from var_hat by mean_err^2, far below the tolerance.
    np.testing.assert_array_less(np.abs(flat.var(0) - prob.var), Z * se_var + mean_err**2)
    assert np.all(samplers.rhat(w) < 1.05)
    # The discretisation bias, for the worst frozen preconditioner of each restart, is below one standard error.
    bias = np.mean(
        [np.abs(_variance_bias_bound(prob.post, lr, mdecay, np.full(3, m))).max() for m in res.info["minv_min"]]
    )
    assert bias < np.min(se_var / prob.var), (bias, se_var / prob.var)
    # Bookkeeping of the result.
    assert res.log_density.shape == (10, 2500)
    log_density, _ = samplers.log_density_fn(prob.model, prob.Phi, prob.y, NOISE_VAR)
    recomputed = jax.vmap(jax.vmap(log_density))(jnp.asarray(w[:, :20]))
    np.testing.assert_allclose(res.log_density[:, :20], np.asarray(recomputed), rtol=1e-12)
    assert np.all(np.isnan(res.accept_rate)) and res.accept_rate.shape == (10,)
    info = json.loads(json.dumps(res.info))
    assert info["n_diverged"] == 0 and info["diverged"] == [False] * 10
    assert info["first_nonfinite_step"] == [None] * 10
    assert info["step_size"] == lr and info["lr_scaling"] == "none"
    assert info["n_steps_per_chain"] == 4000 + 2500 * 10
    assert info["batch_size"] == batch_size and info["n_data"] == 40
    assert res.sampler.startswith("scale-adapted SGHMC")


# ------------------------------------------------------------------------------------------ the kernel


def test_one_step_against_numpy():
    rng = np.random.default_rng(3)
    m = 8
    theta, v, G = rng.normal(size=m), 0.1 * rng.normal(size=m), 0.5 * rng.normal(size=m)
    tau = 1 + rng.exponential(3, size=m)
    v_hat = np.exp(rng.uniform(np.log(1e-3), np.log(1e3), size=m))
    g = rng.uniform(-1, 1, size=m) * np.sqrt(v_hat)  # g^2 <= v_hat, as the adaptation keeps it
    eps, c = 0.1, 0.01  # the floor of the noise variance binds where M^-1 < eps^2 / (2 C) = 0.5
    key = jax.random.key(11)
    z = np.asarray(jax.random.normal(key, (m,), jnp.float64))  # the documented noise draw of a flat state
    state = samplers.SGHMCState(*(jnp.asarray(a) for a in (theta, v, tau, g, v_hat)))
    hyper = samplers.SGHMCHyper(eps, c)
    step = jax.jit(samplers.sghmc_step, static_argnums=4)
    for adapt in (True, False):
        new, info = step(key, state, jnp.asarray(G), hyper, adapt)
        exp = _np_step(theta, v, tau, g, v_hat, G, z, eps, c, adapt)
        for got, want in zip((*new, info.minv, info.noise_var), exp, strict=True):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13, atol=1e-15)
        floored = exp[6] == NOISE_VAR_FLOOR
        assert floored.any() and not floored.all()
        if not adapt:
            for got, old in zip(new[2:], (tau, g, v_hat), strict=True):
                np.testing.assert_array_equal(np.asarray(got), old)
    # The same state as a pytree takes the same step: the noise is drawn on the raveled position, so the
    # reference with the flat state's draw holds for it too. (Bit-identity with the flat step is not claimed:
    # XLA may round the two programs differently.)
    _, unravel = ravel_pytree({"a": jnp.zeros(3), "b": jnp.zeros((5, 1))})
    tree_state = samplers.SGHMCState(*(unravel(jnp.asarray(a)) for a in (theta, v, tau, g, v_hat)))
    new_tree, _ = step(key, tree_state, unravel(jnp.asarray(G)), hyper, True)
    exp = _np_step(theta, v, tau, g, v_hat, G, z, eps, c, True)
    for got, want in zip(new_tree, exp[:5], strict=True):  # the state; exp also holds M^-1 and the noise
        np.testing.assert_allclose(np.asarray(ravel_pytree(got)[0]), want, rtol=1e-13, atol=1e-15)


def test_init_state():
    s = samplers.sghmc_init({"w": jnp.arange(3.0)})
    np.testing.assert_array_equal(s.position["w"], [0, 1, 2])
    np.testing.assert_array_equal(s.momentum["w"], 0)
    for leaf in (s.tau, s.g, s.v_hat):
        np.testing.assert_array_equal(leaf["w"], 1)


def test_adaptation_frozen_without_adapt():
    # A kernel driven by lax.scan (as a NumPyro/blackjax-style user would): without adapt, tau, g and v_hat stay
    # bitwise equal to their values while the position moves; with adapt they change at every step.
    def grad_u(w):
        return w / 0.3

    def run(adapt):
        def body(state, key):
            state, _ = samplers.sghmc_step(key, state, grad_u(state.position), samplers.SGHMCHyper(0.1, 0.1), adapt)
            return state, state.position

        state = samplers.sghmc_init(jnp.array([1.0, -2.0]))._replace(
            tau=jnp.array([3.0, 5.0]), g=jnp.array([0.5, -0.2]), v_hat=jnp.array([2.0, 7.0])
        )
        return state, jax.lax.scan(body, state, jax.random.split(jax.random.key(0), 50))

    before, (after, path) = run(False)
    for a, b in zip((after.tau, after.g, after.v_hat), (before.tau, before.g, before.v_hat), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.all(np.abs(np.diff(np.asarray(path), axis=0)) > 0)
    before, (after, _) = run(True)
    for a, b in zip((after.tau, after.g, after.v_hat), (before.tau, before.g, before.v_hat), strict=True):
        assert np.all(np.asarray(a) != np.asarray(b))


# --------------------------------------------------------------------------- whole runs against NumPy


@pytest.mark.parametrize("batch_size", [8, 3])
def test_runs_follow_the_documented_equations_and_keys(batch_size):
    # Every step recomputed in NumPy: the hand-derived gradient of U on the documented minibatch, the documented
    # noise key, adaptation during the burn-in only, and the kept states after burn_in + thin, + 2 thin, ...
    # One noise variance per point, gathered with its minibatch.
    n, D, R, burn_in, thin, n_draws, lr, mdecay = 8, 2, 2, 3, 2, 3, 0.05, 0.1
    rng = np.random.default_rng(4)
    Phi, y, nv = rng.normal(size=(n, D)), rng.normal(size=n), rng.uniform(0.1, 0.5, size=n)
    model = models.linear_in_features(lambda x: x, D, prior_var=PRIOR_VAR)
    init = {"w": rng.normal(size=(R, D))}
    key = jax.random.key(9)
    res = samplers.sghmc_model(
        key, model, Phi, y, nv, n_restarts=R, n_draws=n_draws, burn_in=burn_in, thin=thin, lr=lr,
        mdecay=mdecay, batch_size=batch_size, init=init,
    )
    B = batch_size
    n_batches = n // B
    _, k_restarts = jax.random.split(key)
    expected = np.zeros((R, n_draws, D))
    for c, k_c in enumerate(jax.random.split(k_restarts, R)):
        k_noise, k_batch = jax.random.split(k_c)
        theta, v = init["w"][c].copy(), np.zeros(D)
        tau, g, v_hat = np.ones(D), np.ones(D), np.ones(D)
        for t in range(burn_in + n_draws * thin):
            idx = None
            if B < n:
                perm = np.asarray(jax.random.permutation(jax.random.fold_in(k_batch, t // n_batches), n))
                idx = perm[(t % n_batches) * B : (t % n_batches + 1) * B]
            G = _grad_u(Phi, y, theta, nv, idx)
            z = np.asarray(jax.random.normal(jax.random.fold_in(k_noise, t), (D,), jnp.float64))
            theta, v, tau, g, v_hat, _, _ = _np_step(theta, v, tau, g, v_hat, G, z, lr, mdecay, t < burn_in)
            if t + 1 > burn_in and (t + 1 - burn_in) % thin == 0:
                expected[c, (t + 1 - burn_in) // thin - 1] = theta
        np.testing.assert_allclose(res.info["minv_max"][c], np.max(1 / np.sqrt(v_hat)), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(res.params["w"]), expected, rtol=1e-11, atol=1e-13)
    assert res.info["minibatches"] == ("full batch" if B == n else "per-epoch shuffles, 3 of 8 points per step "
                                       "without replacement")


def test_default_start_float32_and_step_size_conventions():
    # Default starts: independent prior draws, one per restart; float32 data and chains stay float32; the
    # step-size conventions give the documented eps.
    model = models.mlp(1, (3,), "tanh")
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, 8).astype(np.float32)
    y = np.sin(3 * x).astype(np.float32)
    kw = {"n_restarts": 4, "n_draws": 2, "burn_in": 2, "thin": 1, "lr": 1e-8, "batch_size": 4, "dtype": jnp.float32}
    res = samplers.sghmc_model(jax.random.key(1), model, x, y, 0.1, **kw)
    shapes = jax.tree.leaves(model.shapes, is_leaf=lambda s: isinstance(s, tuple))
    for leaf, shape in zip(jax.tree.leaves(res.params), shapes, strict=True):
        assert leaf.shape == (4, 2, *shape) and leaf.dtype == np.float32
    assert np.unique(np.asarray(res.params[0]["w"][:, 0, 0, 0])).size == 4
    assert res.log_density.dtype == np.float32 and np.all(np.isfinite(res.log_density))
    for scaling, eps in (("none", 1e-8), ("sqrt_n", 1e-8 / math.sqrt(8)), ("sqrt_lr", 1e-4)):
        r = samplers.sghmc_model(jax.random.key(1), model, x, y, 0.1, lr_scaling=scaling, **kw)
        assert r.info["step_size"] == pytest.approx(eps, rel=1e-12)
        assert r.info["lr_scaling"] == scaling


# ------------------------------------------------------------------------------------------- divergence


def test_divergence_is_reported(prob):
    # No burn-in: M^-1 stays 1, and eps^2 M^-1 times the curvature (~200) is far beyond the stable range (< 4).
    kw = {"n_restarts": 3, "n_draws": 2, "burn_in": 0, "thin": 300, "lr": 1.0, "batch_size": 40}
    with pytest.raises(DivergedParticlesError, match=r"3 of 3 SGHMC restarts diverged to NaN/Inf") as err:
        samplers.sghmc_model(jax.random.key(0), prob.model, prob.Phi, prob.y, NOISE_VAR, **kw)
    assert err.value.diverged.tolist() == [True] * 3 and 0 <= err.value.first_step < 600
    res = samplers.sghmc_model(jax.random.key(0), prob.model, prob.Phi, prob.y, NOISE_VAR, on_diverged="report", **kw)
    assert res.info["diverged"] == [True] * 3 and res.info["n_diverged"] == 3
    assert all(isinstance(s, int) and 0 <= s < 600 for s in res.info["first_nonfinite_step"])
    assert min(res.info["first_nonfinite_step"]) == err.value.first_step
    assert not np.all(np.isfinite(res.params["w"][:, -1]))


# ----------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"n_restarts": 0}, "n_restarts must be at least 1"),
        ({"n_draws": 0}, "n_draws must be at least 1"),
        ({"n_draws": 2.5}, "n_draws must be an integer"),
        ({"thin": 0}, "thin must be at least 1"),
        ({"burn_in": -1}, "burn_in must be at least 0"),
        ({"lr": 0.0}, "lr must be positive"),
        ({"lr": -1e-3}, "lr must be positive"),
        ({"lr": float("nan")}, "lr must be positive"),
        ({"mdecay": 0.0}, "mdecay must be positive"),
        ({"mdecay": 1.5}, r"mdecay must lie in \(0, 1\]"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"batch_size": 4}, "batch_size must be at most the number of training points N = 3, got 4"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"lr_scaling": "sqrt"}, "lr_scaling must be one of"),
        ({"on_diverged": "ignore"}, "on_diverged must be"),
        ({"burn_in": 2**31}, "exceeds the limit"),
        ({"x": np.array([0.0, np.nan, 1.0])}, "x contains 1 NaN/Inf"),
        ({"y": np.array([0.0, 1.0, np.inf])}, "y contains 1 NaN/Inf"),
        ({"y": np.zeros((3, 1))}, r"labels y must be a vector"),
        ({"x": np.zeros(4)}, "x has 4 rows but y has 3 labels"),
        ({"noise_var": -0.1}, "noise_var must be positive"),
        ({"noise_var": np.ones(2)}, r"noise_var must be a scalar or have shape \(3,\)"),
        ({"init": {"w": np.zeros((3, 2))}}, "init leaf"),
    ],
)
def test_errors(change, match):
    args = {"x": np.array([0.0, 0.5, 1.0]), "y": np.array([0.0, 0.4, 1.1]), "noise_var": 0.1, "n_restarts": 2,
            "n_draws": 2, "burn_in": 0, "thin": 1, "batch_size": 2, **change}
    x, y, noise_var = args.pop("x"), args.pop("y"), args.pop("noise_var")
    with pytest.raises(ValueError, match=match):
        samplers.sghmc_model(jax.random.key(0), models.toy_relu(), x, y, noise_var, **args)


def test_non_finite_start_names_the_restarts():
    init = {"w": np.array([[0.0, 0.0], [np.nan, 0.0]])}
    with pytest.raises(ValueError, match=r"not finite at the initial state of chain\(s\) \[1\]"):
        samplers.sghmc_model(
            jax.random.key(0), models.toy_relu(), np.array([0.0, 1.0]), np.array([0.0, 1.0]), 0.1, n_restarts=2,
            n_draws=1, burn_in=0, thin=1, init=init,
        )


# ------------------------------------------------------------------------------------------ determinism


def test_determinism_chunking_and_restart_independence(prob):
    kw = {"n_restarts": 3, "n_draws": 5, "burn_in": 7, "thin": 6, "lr": 0.01, "mdecay": 0.05}  # batches of 20
    a = samplers.sghmc_model(jax.random.key(7), prob.model, prob.Phi, prob.y, NOISE_VAR, **kw)
    b = samplers.sghmc_model(jax.random.key(7), prob.model, prob.Phi, prob.y, NOISE_VAR, **kw)
    # With a progress bar the run is cut into one call per kept state: same draws.
    c = samplers.sghmc_model(jax.random.key(7), prob.model, prob.Phi, prob.y, NOISE_VAR, progress="test", **kw)
    d = samplers.sghmc_model(jax.random.key(8), prob.model, prob.Phi, prob.y, NOISE_VAR, **kw)
    for other in (b, c):
        np.testing.assert_array_equal(np.asarray(a.params["w"]), np.asarray(other.params["w"]))
        np.testing.assert_array_equal(a.log_density, other.log_density)
        assert a.info == other.info
    assert a.info["batch_size"] == 20  # the default: min(20, N)
    assert not np.any(np.asarray(a.params["w"]) == np.asarray(d.params["w"]))
    w = np.asarray(a.params["w"])
    for i in range(3):
        for j in range(i):
            assert not np.any(w[i] == w[j]), (i, j)
