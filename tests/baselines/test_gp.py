"""bootens_core.baselines.gp against the closed-form GP posterior and marginal likelihood computed in numpy."""

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

from bootens_core.baselines import gp

# Not pytest.importorskip: that would import TensorFlow here, unsilenced, before bootens_core.baselines.gp does.
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


@pytest.fixture(scope="module")
def small_gpr_lapack(small):
    """The fit with the closed-form gradient computed in numpy/LAPACK (``gradient="closed_form"``)."""
    return gp.fit_predict(jax.random.key(0), *small, method="gpr", gradient="closed_form")


@pytest.mark.parametrize("fit_name", ["small_gpr", "small_gpr_lapack"], ids=["autodiff", "closed_form"])
def test_gpr_matches_the_closed_form_at_its_hyperparameters(small, fit_name, request):
    x, y, x_test = small
    fit = request.getfixturevalue(fit_name)
    assert fit.method == "gpr" and fit.converged and 0 < fit.n_iter <= 1000
    assert fit.mean.shape == fit.var.shape == (15,)
    assert fit.mean.dtype == fit.var.dtype == np.float64
    mean, var, lml = _gp_numpy(x, y, x_test, fit.lengthscale, fit.signal_var, fit.noise_var)
    np.testing.assert_allclose(fit.mean, mean, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(fit.var, var, rtol=1e-6)
    assert fit.objective == pytest.approx(lml, rel=1e-6)
    assert "isotropic squared-exponential" in fit.description and "L-BFGS-B" in fit.description


@pytest.mark.parametrize("fit_name", ["small_gpr", "small_gpr_lapack"], ids=["autodiff", "closed_form"])
def test_gpr_hyperparameters_are_a_maximum_of_the_marginal_likelihood(small, fit_name, request):
    """Moving any of the 3 fitted hyper-parameters by +-5% never increases the numpy marginal likelihood."""
    x, y, _ = small
    fit = request.getfixturevalue(fit_name)
    fitted = np.array([fit.lengthscale, fit.signal_var, fit.noise_var])
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


# scipy's L-BFGS-B stops when an iteration improves the objective f by less than FTOL * max(|f|, 1)
# (its default ftol: factr 1e7 times the float64 machine epsilon). Near a well-conditioned optimum L-BFGS
# converges superlinearly, so the gap left after that last iteration is smaller than that last improvement.
FTOL = 1e7 * np.finfo(np.float64).eps


def _log_params(fit):
    return np.log([fit.lengthscale, fit.signal_var, fit.noise_var])


def _hessian(f, theta, h=1e-3):
    """Central finite differences of f's Hessian at theta (3 x 3)."""
    k = len(theta)
    hess = np.empty((k, k))
    for i in range(k):
        for j in range(k):
            ei, ej = np.eye(k)[i] * h, np.eye(k)[j] * h
            hess[i, j] = (f(theta + ei + ej) - f(theta + ei - ej) - f(theta - ei + ej)
                          + f(theta - ei - ej)) / (4 * h * h)
    return hess


@pytest.fixture(scope="module")
def mid():
    """n = 800, d = 3: a smooth function plus noise of variance 0.04, standardised; 60 test inputs; and the
    plain fit (automatic gradient, default start)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(800, 3))
    y = np.sin(2.0 * x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + 0.2 * rng.normal(size=800)
    y = (y - y.mean()) / y.std()
    x_test = rng.normal(size=(60, 3))
    return x, y, x_test, gp.fit_predict(jax.random.key(0), x, y, x_test, method="gpr")


@pytest.mark.parametrize(
    "fast_path",
    [{"gradient": "closed_form"}, {"warm_start_rows": 200},
     {"gradient": "closed_form", "warm_start_rows": 200}],
    ids=["closed_form", "warm_start", "both"],
)
def test_fast_paths_reach_the_plain_fits_optimum(mid, fast_path):
    """The closed-form gradient and the warm start (hyper-parameters fitted on 200 of the 800 rows first,
    then L-BFGS-B on all rows) stop at the plain fit's optimum: the same log marginal likelihood, hyper-
    parameters and predictions, to what the optimiser's stopping rule allows.

    Each fit is within delta = FTOL * |f| of the maximum f* (see FTOL), so the objectives differ by at most
    2 delta. In theta = log(lengthscale, signal variance, noise variance), f ~ f* - (t - t*)' H (t - t*) / 2
    (H: minus the Hessian, by finite differences of the numpy marginal likelihood), so each fit lies within
    sqrt(2 delta) of t* in H's norm, the two within 2 sqrt(2 delta); and a prediction p(theta) with gradient
    J moves by at most |J (t1 - t2)| <= sqrt(J H^-1 J') * 2 sqrt(2 delta) (Cauchy-Schwarz).
    """
    x, y, x_test, plain = mid
    fast = gp.fit_predict(jax.random.key(0), x, y, x_test, method="gpr", **fast_path)
    assert plain.converged and fast.converged and fast.n_iter > 0
    assert (plain.warm_start_rows, plain.warm_start_iter) == (0, 0)
    assert "warm-started" not in plain.description and "closed-form" not in plain.description
    if "warm_start_rows" in fast_path:
        assert fast.warm_start_rows == 200 and fast.warm_start_iter > 0
        assert "warm-started: fitted first on 200 of the 800 training rows" in fast.description
    else:
        assert (fast.warm_start_rows, fast.warm_start_iter) == (0, 0)
    assert ("closed-form gradient" in fast.description) == ("gradient" in fast_path)

    delta = FTOL * max(abs(plain.objective), 1.0)
    assert abs(fast.objective - plain.objective) <= 2 * delta
    # Both objectives are the numpy marginal likelihood at the fitted hyper-parameters.
    for fit in (plain, fast):
        assert fit.objective == pytest.approx(_lml(x, y, fit.lengthscale, fit.signal_var, fit.noise_var),
                                              rel=1e-9)

    def lml(theta):
        return _lml(x, y, *np.exp(theta))

    theta = _log_params(plain)
    hess = -_hessian(lml, theta)
    assert np.all(np.linalg.eigvalsh(hess) > 0)  # a strict local maximum (the quadratic model is valid)
    step = _log_params(fast) - theta
    assert step @ hess @ step <= (2 * np.sqrt(2 * delta)) ** 2

    def predictions(t):
        mean, var, _ = _gp_numpy(x, y, x_test, *np.exp(t))
        return np.concatenate([mean, var])

    h = 1e-5
    jac = np.stack([(predictions(theta + h * e) - predictions(theta - h * e)) / (2 * h) for e in np.eye(3)],
                   axis=1)
    bound = np.sqrt(np.einsum("ij,jk,ik->i", jac, np.linalg.inv(hess), jac)) * 2 * np.sqrt(2 * delta)
    diff = np.concatenate([fast.mean - plain.mean, fast.var - plain.var])
    assert np.all(np.abs(diff) <= bound), np.max(np.abs(diff) / bound)


def test_warm_start_rows_at_or_above_n_is_the_plain_fit(small, small_gpr):
    """The warm start only starts above warm_start_rows training rows; up to it the plain fit runs, unchanged
    (the committed results of the small datasets depend on it)."""
    x, y, x_test = small
    fit = gp.fit_predict(jax.random.key(7), x, y, x_test, method="gpr", warm_start_rows=len(y))
    assert fit.warm_start_rows == 0 and fit.description == small_gpr.description
    np.testing.assert_array_equal(fit.mean, small_gpr.mean)
    np.testing.assert_array_equal(fit.var, small_gpr.var)
    assert (fit.objective, fit.lengthscale, fit.noise_var, fit.n_iter) == (
        small_gpr.objective, small_gpr.lengthscale, small_gpr.noise_var, small_gpr.n_iter)


def test_svgp_minibatch_adam_improves_the_elbo(small):
    x, y, x_test = small
    short = gp.fit_predict(jax.random.key(2), x, y, x_test, method="svgp", n_inducing=10, minibatch=20,
                           max_iter=1)
    long = gp.fit_predict(jax.random.key(2), x, y, x_test, method="svgp", n_inducing=10, minibatch=20,
                          max_iter=300)
    assert long.n_iter == 300 and "Adam" in long.description
    assert long.objective > short.objective
    assert np.all(np.isfinite(long.mean)) and np.all(long.var > 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sgpr_closed_form_loss_and_gradient_match_gpflow(seed):
    """The closed-form SGPR objective and its gradient (hyper-parameters and inducing inputs, through GPflow's
    transforms) against GPflow's own training loss and TensorFlow's automatic gradient, at random settings
    (n = 300, d = 3, M = 25; inducing inputs near training inputs, as fit_predict starts them)."""
    tf, gpflow = gp._import_tf()  # the module's own helpers: the closed form is checked term by term here
    rng = np.random.default_rng(seed)
    n, d, m = 300, 3, 25
    x = rng.normal(size=(n, d))
    y = np.sin(x[:, 0]) + 0.3 * x[:, 1] * x[:, 2] + 0.2 * rng.normal(size=n)
    y = (y - y.mean()) / y.std()
    kernel = gpflow.kernels.SquaredExponential(variance=rng.uniform(0.3, 3.0), lengthscales=rng.uniform(0.5, 2.0))
    likelihood = gpflow.likelihoods.Gaussian(variance=rng.uniform(0.01, 0.5), variance_lower_bound=1e-6)
    z = x[rng.choice(n, m, replace=False)] + 0.01 * rng.normal(size=(m, d))
    model = gpflow.models.SGPR((x, y[:, None]), kernel, z, likelihood=likelihood)
    out = []
    for loss in (model.training_loss, gp._sgpr_loss_closed_form_gradient(tf, gpflow, model)):
        with tf.GradientTape() as tape:
            value = loss()
        grads = tape.gradient(value, model.trainable_variables)
        out.append((float(value), np.concatenate([np.ravel(g.numpy()) for g in grads])))
    (value_tf, grad_tf), (value_np, grad_np) = out
    assert value_np == pytest.approx(value_tf, rel=1e-11)
    assert grad_np.shape == grad_tf.shape == (3 + m * d,)
    np.testing.assert_allclose(grad_np, grad_tf, rtol=1e-8, atol=1e-9 * np.max(np.abs(grad_tf)))


def test_sgpr_closed_form_fit_follows_the_autodiff_fit():
    """fit_predict wires the closed-form SGPR loss in: over its first 10 L-BFGS-B iterations from the same
    inducing inputs it follows the autodiff fit (the same bound and predictions up to the round-off that
    L-BFGS-B's line searches amplify: 7e-10 relative on the bound on one CPU; a wiring error, such as a
    parameter without its gradient, shows at order one). Run to convergence the two stop at the same bound
    to ~1e-8, but at points that differ along its flat directions (the inducing inputs)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 2))
    y = np.sin(1.5 * x[:, 0]) + 0.5 * x[:, 1] + 0.1 * rng.normal(size=400)
    y = (y - y.mean()) / y.std()
    x_test = rng.normal(size=(30, 2))
    auto, closed = (gp.fit_predict(jax.random.key(0), x, y, x_test, method="svgp", n_inducing=15, max_iter=10,
                                   gradient=g) for g in gp.GRADIENTS)
    assert "closed-form gradient" in closed.description and "closed-form" not in auto.description
    assert closed.n_iter == auto.n_iter == 10
    assert closed.objective == pytest.approx(auto.objective, rel=1e-7)
    np.testing.assert_allclose(closed.mean, auto.mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(closed.var, auto.var, rtol=1e-6)


@pytest.mark.parametrize("gradient", gp.GRADIENTS)
def test_overflowing_data_raise_instead_of_returning_nans(gradient):
    x = np.linspace(-1, 1, 10)[:, None]
    with pytest.raises(RuntimeError, match="GP fit failed for gpr on n=10"):
        gp.fit_predict(jax.random.key(0), x, np.full(10, 1e200), x, method="gpr", gradient=gradient)


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
        ({"gradient": "numeric"}, r"unknown gradient 'numeric'; known gradients: autodiff, closed_form"),
        ({"method": "svgp", "n_inducing": 3, "minibatch": 2, "gradient": "closed_form"},
         r"gradient='closed_form' applies to full-batch fits only"),
        ({"warm_start_rows": 0}, r"warm_start_rows must be None or a positive integer, got 0"),
        ({"warm_start_rows": 2.5}, r"warm_start_rows must be None or a positive integer, got 2.5"),
        ({"warm_start_rows": True}, r"warm_start_rows must be None or a positive integer, got True"),
        ({"method": "svgp", "n_inducing": 3, "warm_start_rows": 2}, r"warm_start_rows applies to method"),
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
        import bootens_core, bootens_core.baselines.gp
        print(sorted(m for m in ("tensorflow", "gpflow") if m in sys.modules))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_fitting_writes_nothing_to_stderr():
    """TF's C++ start-up log lines (oneDNN, cuda, CPU instructions, absl) would land in notebook outputs."""
    proc = _run("""
        import numpy as np, jax
        from bootens_core.baselines import gp
        x = np.linspace(-1, 1, 8)[:, None]
        fit = gp.fit_predict(jax.random.key(0), x, np.sin(3 * x[:, 0]), x, method="svgp", n_inducing=4,
                             max_iter=20)
        warm = gp.fit_predict(jax.random.key(0), x, np.sin(3 * x[:, 0]), x, warm_start_rows=4)
        print(fit.mean.shape, warm.warm_start_rows)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(8,) 4"
    assert proc.stderr == ""
