"""bootens_core.gp against the closed-form GP posterior and marginal likelihood computed in numpy."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from scipy import linalg

from bootens_core import gp

# Not pytest.importorskip: that would import TensorFlow here, unsilenced, before bootens_core.gp does.
if importlib.util.find_spec("gpflow") is None:
    pytest.skip("GPflow is not installed (the 'gp' extra)", allow_module_level=True)


def _kernel(a, b, lengthscale, signal_var):
    sq = np.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1)
    return signal_var * np.exp(-sq / (2.0 * lengthscale**2))


def _gp_numpy(x, y, x_test, lengthscale, signal_var, noise_var):
    """Exact GP regression: predictive mean, predictive variance of y, and the log marginal likelihood."""
    n = len(y)
    chol = linalg.cholesky(_kernel(x, x, lengthscale, signal_var) + noise_var * np.eye(n), lower=True)
    alpha = linalg.cho_solve((chol, True), y)
    k_star = _kernel(x, x_test, lengthscale, signal_var)
    v = linalg.solve_triangular(chol, k_star, lower=True)
    mean = k_star.T @ alpha
    var = signal_var - np.sum(v**2, axis=0) + noise_var
    lml = -0.5 * y @ alpha - np.sum(np.log(np.diag(chol))) - 0.5 * n * np.log(2 * np.pi)
    return mean, var, lml


def _lml(x, y, lengthscale, signal_var, noise_var):
    return _gp_numpy(x, y, x[:1], lengthscale, signal_var, noise_var)[2]


@pytest.fixture(scope="module")
def small():
    """n = 40, d = 2: a smooth function plus noise of variance 0.01, standardised like the harness does."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    y = np.sin(1.5 * x[:, 0]) + 0.5 * x[:, 1] + 0.1 * rng.normal(size=40)
    y = (y - y.mean()) / y.std()
    x_test = rng.normal(size=(15, 2))
    return x, y, x_test


@pytest.fixture(scope="module")
def small_gpr(small):
    return gp.fit_predict(jax.random.key(0), *small, method="gpr")


def test_gpr_matches_the_closed_form_at_its_hyperparameters(small, small_gpr):
    x, y, x_test = small
    fit = small_gpr
    assert fit.method == "gpr" and fit.converged and 0 < fit.n_iter <= 1000
    assert fit.mean.shape == fit.var.shape == (15,)
    assert fit.mean.dtype == fit.var.dtype == np.float64
    mean, var, lml = _gp_numpy(x, y, x_test, fit.lengthscale, fit.signal_var, fit.noise_var)
    np.testing.assert_allclose(fit.mean, mean, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(fit.var, var, rtol=1e-6)
    assert fit.objective == pytest.approx(lml, rel=1e-6)
    assert "isotropic squared-exponential" in fit.description and "L-BFGS-B" in fit.description


def test_gpr_hyperparameters_are_a_maximum_of_the_marginal_likelihood(small, small_gpr):
    """Moving any of the 3 fitted hyper-parameters by +-5% never increases the numpy marginal likelihood."""
    x, y, _ = small
    fitted = np.array([small_gpr.lengthscale, small_gpr.signal_var, small_gpr.noise_var])
    best = _lml(x, y, *fitted)
    for i in range(3):
        for factor in (0.95, 1.05):
            moved = fitted.copy()
            moved[i] *= factor
            assert _lml(x, y, *moved) <= best + 1e-8, (i, factor)


def test_svgp_with_every_training_input_inducing_is_exact(small, small_gpr):
    """With Z = X (n_inducing = n) Titsias' bound is tight, so SVGP's predictions are the exact GP's at
    SVGP's own hyper-parameters, and its ELBO is the log marginal likelihood, approached from below.

    Not exactly: GPflow adds a 1e-6 jitter to K_uu (u then is a slightly noisy f(Z), still a valid inducing
    variable, so the bound stays a lower bound), which on this ill-conditioned 40 x 40 kernel matrix costs
    ~1e-3 nats and moves means/variances by ~1e-4 of y's (unit) sd/variance. The tolerances (1e-3 of y's sd
    and variance, 1e-2 nats) leave a 10x margin; a wrong posterior (the prior, or the noise left out of the
    variance) would be off by O(0.01-1).
    """
    x, y, x_test = small
    fit = gp.fit_predict(jax.random.key(1), x, y, x_test, method="svgp", n_inducing=len(y))
    assert fit.method == "svgp" and fit.converged and "40 inducing points" in fit.description
    mean, var, lml = _gp_numpy(x, y, x_test, fit.lengthscale, fit.signal_var, fit.noise_var)
    np.testing.assert_allclose(fit.mean, mean, rtol=0, atol=1e-3)
    np.testing.assert_allclose(fit.var, var, rtol=0, atol=1e-3)
    assert fit.objective <= lml
    assert fit.objective == pytest.approx(lml, abs=1e-2)
    # Both maximise (nearly) the same function of the hyper-parameters, so they agree with GPR's too.
    np.testing.assert_allclose(fit.mean, small_gpr.mean, rtol=0, atol=1e-3)
    assert fit.noise_var == pytest.approx(small_gpr.noise_var, rel=0.05)


def test_gpr_recovers_a_known_noise_variance():
    """y = f(x) + N(0, 0.01), n = 200, d = 1. The MLE of a noise variance from 200 residuals has a relative
    sd of about sqrt(2 / 200) = 0.1, so a factor of 2 either way is more than 5 sd; the posterior mean
    tracks the true f at test inputs far better than the noise sd 0.1."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-2.0, 2.0, size=(200, 1))

    def f(t):
        return np.sin(2.0 * t[:, 0]) + 0.3 * np.cos(5.0 * t[:, 0])

    y = f(x) + 0.1 * rng.normal(size=200)
    x_test = np.linspace(-1.8, 1.8, 50)[:, None]
    fit = gp.fit_predict(jax.random.key(0), x, y, x_test, method="gpr")
    assert 0.005 < fit.noise_var < 0.02
    assert np.sqrt(np.mean((fit.mean - f(x_test)) ** 2)) < 0.05
    assert np.all(fit.var > fit.noise_var)


def test_svgp_minibatch_adam_improves_the_elbo(small):
    x, y, x_test = small
    short = gp.fit_predict(jax.random.key(2), x, y, x_test, method="svgp", n_inducing=10, minibatch=20,
                           max_iter=1)
    long = gp.fit_predict(jax.random.key(2), x, y, x_test, method="svgp", n_inducing=10, minibatch=20,
                          max_iter=300)
    assert long.n_iter == 300 and "Adam" in long.description
    assert long.objective > short.objective
    assert np.all(np.isfinite(long.mean)) and np.all(long.var > 0)


def test_overflowing_data_raise_instead_of_returning_nans():
    x = np.linspace(-1, 1, 10)[:, None]
    with pytest.raises(RuntimeError, match="GP fit failed for gpr on n=10"):
        gp.fit_predict(jax.random.key(0), x, np.full(10, 1e200), x, method="gpr")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"x_train": np.array([[np.nan, 0.0]] + [[0.0, 1.0]] * 4)}, r"x_train has 1 non-finite value"),
        ({"y_train": np.array([0.0, np.inf, 1.0, np.nan, 2.0])}, r"y_train has 2 non-finite value"),
        ({"x_train": np.zeros(5)}, r"x_train must be a 2-D array"),
        ({"y_train": np.zeros((5, 1))}, r"y_train must be a 1-D array"),
        ({"y_train": np.zeros(4)}, r"x_train has 5 rows but y_train has 4"),
        ({"x_test": np.zeros((3, 3))}, r"x_test has 3 input dimensions but x_train has 2"),
        ({"method": "sgpr"}, r"unknown GP method 'sgpr'; known methods: gpr, svgp"),
        ({"method": "svgp", "n_inducing": 6}, r"n_inducing=6 exceeds the number of training points n=5"),
        ({"method": "svgp", "n_inducing": 0}, r"n_inducing must be a positive integer"),
        ({"method": "svgp", "n_inducing": 3, "minibatch": 9}, r"minibatch=9 exceeds"),
        ({"minibatch": 2}, r"minibatch applies to method 'svgp' only"),
        ({"max_iter": 0}, r"max_iter must be a positive integer"),
        ({"init_noise_var": -1.0}, r"init_noise_var must be a finite number"),
    ],
)
def test_bad_input(kwargs, match):
    args = {"x_train": np.zeros((5, 2)), "y_train": np.zeros(5), "x_test": np.zeros((3, 2))}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gp.fit_predict(jax.random.key(0), args.pop("x_train"), args.pop("y_train"), args.pop("x_test"),
                       **args)


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def test_importing_does_not_import_tensorflow():
    proc = _run("""
        import sys
        import bootens_core, bootens_core.gp
        print(sorted(m for m in ("tensorflow", "gpflow") if m in sys.modules))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_fitting_writes_nothing_to_stderr():
    """TF's C++ start-up log lines (oneDNN, cuda, CPU instructions, absl) would land in notebook outputs."""
    proc = _run("""
        import numpy as np, jax
        from bootens_core import gp
        x = np.linspace(-1, 1, 8)[:, None]
        fit = gp.fit_predict(jax.random.key(0), x, np.sin(3 * x[:, 0]), x, method="svgp", n_inducing=4,
                             max_iter=20)
        print(fit.mean.shape)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(8,)"
    assert proc.stderr == ""
