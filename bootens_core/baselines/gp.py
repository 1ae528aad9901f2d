"""Gaussian-process regression baselines of the paper's UCI tables (GPflow).

The paper's Appendix: an exact GP with an isotropic squared-exponential kernel whose hyper-parameters
maximise the log marginal likelihood; for Protein, sparse variational GP regression (Titsias 2009) with 400
inducing points whose hyper-parameters maximise the ELBO. :func:`fit_predict` does either on data the caller
has already standardised (with the training statistics) and returns the predictive mean and variance of
``y`` at the test inputs in the same standardised units.

TensorFlow and GPflow are imported lazily, by the first call of :func:`fit_predict` only: importing
:mod:`bootens_core` or this module never imports TensorFlow (the JAX-only GPU machine has none, and TF adds
~1 GB and several seconds). That first call

- sets ``TF_CPP_MIN_LOG_LEVEL=3`` unless the caller set it, and silences the C-level stderr (file
  descriptor 2) while TensorFlow and GPflow import, so that TF's start-up log lines never reach a notebook's
  stored outputs, and ignores the DeprecationWarnings TensorFlow Probability and GPflow raise on import;
- hides GPUs from TensorFlow (GP baselines run on the CPU; the GPU, if any, is JAX's);
- sets TF's intra- and inter-op threads to the cores this process may use (its CPU affinity), when TF's
  runtime is not initialised yet (TF refuses thread settings after its first op);
- makes float64 GPflow's default float (it already is; set explicitly, the checks below depend on it).

Exact GPR costs O(n^3) per evaluation of the marginal likelihood, and TensorFlow's automatic gradient
through the Cholesky factor costs ~15 times the factorisation itself (three n x n matrix products and a
triangular solve with n right-hand sides): on 2 CPU cores one evaluation with its gradient takes ~75 CPU
seconds at n = 7373 (Kin8nm), the objective alone ~5. For large ``n``, ``gradient="closed_form"`` computes
the same objective and gradient in numpy from LAPACK's Cholesky factor and inverse (``dpotrf``, ``dpotri``),
3.4 times cheaper than the autodiff path's factor alone at n = 10 741 (and for SGPR, the collapsed bound
with its gradient in closed form, 2.4 times cheaper at n = 41 157), and
``warm_start_rows`` starts L-BFGS-B from hyper-parameters fitted on a random subset; both reach the plain
fit's optimum (same objective, same stopping rule). See :func:`fit_predict`.

Example::

    fit = gp.fit_predict(jax.random.key(0), split.x_train, split.y_train, split.x_test)
    mean = fit.mean * split.y_std + split.y_mean          # back to the original units
    var = fit.var * split.y_std**2
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any, NamedTuple

import jax
import numpy as np
from scipy import linalg

__all__ = ["METHODS", "GRADIENTS", "GPFit", "fit_predict"]

METHODS = ("gpr", "svgp")
# How a full-batch fit's L-BFGS-B gets its objective and gradient (see fit_predict).
GRADIENTS = ("autodiff", "closed_form")

# Adam's learning rate for minibatch SVGP (GPflow's tutorials use 0.01 on standardised data).
_ADAM_LEARNING_RATE = 0.01
_NOISE_VAR_LOWER_BOUND = 1e-6


class GPFit(NamedTuple):
    """A fitted GP and its predictions at the test inputs (all in the units of the ``y_train`` given).

    ``mean`` (n_test,) is the predictive mean of ``y`` (the latent mean) and ``var`` (n_test,) the
    predictive variance of ``y``: latent variance plus the fitted noise variance. ``objective`` is the final
    log marginal likelihood (``"gpr"``) or ELBO (``"svgp"``) in nats, summed over the training set.
    ``n_iter``, ``n_eval`` and ``converged`` describe the optimisation on the full training set (iterations,
    objective-and-gradient evaluations, and whether the optimiser's stopping rule was met); with a warm start
    (``warm_start_rows > 0``: the hyper-parameters were first fitted on that many rows) ``warm_start_iter``
    counts the iterations on the subset.
    """

    mean: np.ndarray
    var: np.ndarray
    noise_var: float
    lengthscale: float
    signal_var: float
    objective: float
    n_iter: int
    converged: bool
    method: str
    description: str
    n_eval: int = 0
    warm_start_rows: int = 0
    warm_start_iter: int = 0


class _TF(NamedTuple):
    tf: ModuleType
    gpflow: ModuleType


_TF_MODULES: _TF | None = None


def _import_tf() -> _TF:
    """Import TensorFlow and GPflow once, quietly, and configure them (see the module docstring)."""
    global _TF_MODULES
    if _TF_MODULES is not None:
        return _TF_MODULES
    tf_was_loaded = "tensorflow" in sys.modules
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # TF logs through absl both while importing and when its runtime starts (e.g. "failed call to cuInit"
    # at the first device query, whatever TF_CPP_MIN_LOG_LEVEL says): configure and start it silenced too.
    with _stderr_silenced(), warnings.catch_warnings():
        # TFP's distutils LooseVersion and GPflow's pkg_resources, at import time only: not ours to fix.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import gpflow
            import tensorflow as tf
        except ImportError as err:
            raise ImportError(
                f"bootens_core.baselines.gp needs GPflow and TensorFlow: install the 'gp' extra ({err})"
            ) from err

        try:
            tf.config.set_visible_devices([], "GPU")
        except (RuntimeError, ValueError):  # the runtime is already initialised: leave the devices alone
            pass
        if not tf_was_loaded:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(_n_cores())
                tf.config.threading.set_inter_op_parallelism_threads(_n_cores())
            except RuntimeError:  # TF already ran an op (imported and used before us): keep its settings
                pass
        tf.reduce_sum(tf.zeros(2, dtype=tf.float64)).numpy()  # start the runtime while stderr is silenced
    gpflow.config.set_default_float(np.float64)
    _TF_MODULES = _TF(tf, gpflow)
    return _TF_MODULES


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null (C-level writes included), and restore it afterwards."""
    sys.stderr.flush()
    saved_fd = os.dup(2)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
        finally:
            os.close(devnull)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved_fd, 2)
        os.close(saved_fd)


def _n_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def fit_predict(
    key: jax.Array,
    x_train: Any,
    y_train: Any,
    x_test: Any,
    *,
    method: str = "gpr",
    n_inducing: int = 400,
    max_iter: int = 1000,
    init_noise_var: float = 0.1,
    minibatch: int | None = None,
    gradient: str = "autodiff",
    warm_start_rows: int | None = None,
) -> GPFit:
    """Fit a GP regression baseline by type-II maximum likelihood (or ELBO) and predict at ``x_test``.

    The kernel is an isotropic squared exponential ``s^2 exp(-|x - x'|^2 / (2 l^2))`` (one lengthscale),
    started at ``l = sqrt(d)`` (on standardised inputs a typical squared distance between two points is
    ``2d``, so ``sqrt(d)`` is of the order of the median distance) and ``s^2 = 1``; the Gaussian noise
    variance starts at ``init_noise_var`` and is kept above ``1e-6``.

    Args:
        key: a JAX PRNG key (``jax.random.key``). ``"svgp"`` draws its initial inducing inputs from it:
            ``n_inducing`` distinct training inputs, chosen uniformly without replacement with
            ``jax.random.choice(..., replace=False)`` from the first half of ``jax.random.split(key)``; the
            second half seeds the minibatch order if ``minibatch`` is given. ``"gpr"`` uses it only for the
            warm start's subset (see ``warm_start_rows``); without one it is deterministic.
        x_train: ``(n, d)`` training inputs, standardised by the caller.
        y_train: ``(n,)`` training labels, standardised by the caller.
        x_test: ``(m, d)`` test inputs, standardised with the training statistics.
        method: ``"gpr"``: exact GP (``gpflow.models.GPR``), log marginal likelihood maximised by scipy's
            L-BFGS-B. ``"svgp"``: sparse variational GP regression with ``n_inducing`` inducing inputs,
            trained with the hyper-parameters. Full batch (``minibatch=None``): Titsias' (2009) collapsed
            ELBO, ``q(u)`` optimal in closed form (``gpflow.models.SGPR``), maximised by L-BFGS-B; the
            uncollapsed ``gpflow.models.SVGP`` is not used there, as L-BFGS-B does not converge its free
            ``q(u)`` (``m(m+3)/2`` numbers) even for ``m = 40`` in 1000 iterations. With ``minibatch``:
            ``gpflow.models.SVGP`` (whitened, ``q(u)`` a free Gaussian; Hensman et al. 2013), minibatch
            ELBO estimates maximised by Adam (learning rate 0.01) for ``max_iter`` steps.
            ``objective`` is then the full-batch uncollapsed ELBO at the end.
        n_inducing: number of inducing points for ``"svgp"`` (at most ``n``).
        max_iter: L-BFGS-B's iteration limit (Adam's number of steps with ``minibatch``).
        init_noise_var: the initial noise variance.
        minibatch: ``"svgp"`` only: the minibatch size for Adam; ``None`` trains on the full batch.
        gradient: full-batch fits only (``"gpr"``, or ``"svgp"`` without ``minibatch``): how L-BFGS-B gets
            the objective and its gradient. ``"autodiff"`` (the default): GPflow's objective and TensorFlow's
            automatic gradient. ``"closed_form"``, for ``"gpr"``: the same objective computed in
            numpy, ``K`` factorised by LAPACK ``dpotrf`` and inverted by ``dpotri``, and its gradient in
            closed form, ``(alpha alpha^T - K^-1) / 2`` with ``alpha = K^-1 y`` with respect to ``K``, reduced
            to the three hyper-parameters in numpy and chained through GPflow's transforms by TensorFlow.
            Equal up to round-off, so L-BFGS-B reaches the same optimum (the reported ``objective`` is
            GPflow's, at the end); one evaluation costs about a Cholesky factorisation and an inverse instead
            of a factorisation, three ``n x n`` matrix products and a triangular solve, and LAPACK's factor
            is faster than TensorFlow's: on 2 cores 10 CPU seconds at ``n = 10 741`` (Naval) against 34 with
            TensorFlow's factor and the same closed form. For ``"svgp"``: GPflow's collapsed bound (the
            same formulas and jitter) and its gradient with respect to the hyper-parameters and the
            inducing inputs in closed form, in numpy (matrix products instead of triangular solves with
            ``n`` right-hand sides): on 2 cores 0.9 CPU seconds an evaluation at ``n = 41 157``, 400
            inducing points (Protein), against 2.2 for automatic differentiation; the values agree to
            ~1e-13 relative. For ``n`` in the thousands; the default keeps earlier fits bit for bit.
        warm_start_rows: ``"gpr"`` only. ``None`` (the default), or ``n <= warm_start_rows``: L-BFGS-B starts
            from the initial values above. ``n > warm_start_rows``: it starts from the hyper-parameters
            fitted first (from those initial values, with the same settings and ``gradient``) on
            ``warm_start_rows`` distinct training rows drawn uniformly without replacement by
            ``jax.random.choice(..., replace=False)`` from the first half of ``jax.random.split(key)``, and
            then runs on all ``n`` rows to the plain fit's stopping rule (scipy's defaults, at most
            ``max_iter`` iterations; not a truncated fit), so it reaches the same optimum. It saves
            full-data iterations only where the subset's optimum is near the full one: on Kin8nm (2000 of
            7373 rows) 9 instead of 14, on Power (2000 of 8611 rows, where the fitted lengthscale falls from
            3.4 to 0.8 with the extra rows) none.

    Returns:
        A :class:`GPFit` with float64 numpy predictions in the units of ``y_train``.

    Raises:
        ValueError: bad shapes, non-finite values, unknown ``method``, ``n_inducing > n`` or other bad
            settings (an unknown ``gradient``, or ``"closed_form"`` with ``minibatch``; ``warm_start_rows``
            not ``None`` nor a positive integer, or given with ``"svgp"``).
        RuntimeError: the optimisation failed (a Cholesky factorisation failed, or the objective or the
            predictions are not finite).
    """
    x_train, y_train, x_test = _check_data(x_train, y_train, x_test)
    n, d = x_train.shape
    if method not in METHODS:
        raise ValueError(f"unknown GP method {method!r}; known methods: {', '.join(METHODS)}")
    max_iter = _positive_int("max_iter", max_iter)
    init_noise_var = float(init_noise_var)
    if not (math.isfinite(init_noise_var) and init_noise_var > _NOISE_VAR_LOWER_BOUND):
        raise ValueError(
            f"init_noise_var must be a finite number above {_NOISE_VAR_LOWER_BOUND:g}, got {init_noise_var!r}"
        )
    if gradient not in GRADIENTS:
        raise ValueError(f"unknown gradient {gradient!r}; known gradients: {', '.join(GRADIENTS)}")
    if gradient != "autodiff" and method != "gpr" and minibatch is not None:
        raise ValueError(f"gradient={gradient!r} applies to full-batch fits only ('gpr', or 'svgp' without "
                         "minibatch)")
    if warm_start_rows is not None:
        if method != "gpr":
            raise ValueError("warm_start_rows applies to method 'gpr' only (exact GP regression)")
        if isinstance(warm_start_rows, bool) or not isinstance(warm_start_rows, (int, np.integer)) or (
            warm_start_rows < 1
        ):
            raise ValueError(f"warm_start_rows must be None or a positive integer, got {warm_start_rows!r}")
        warm_start_rows = int(warm_start_rows)
    if method == "gpr":
        if minibatch is not None:
            raise ValueError("minibatch applies to method 'svgp' only (exact GP regression is full-batch)")
    else:
        n_inducing = _positive_int("n_inducing", n_inducing)
        if n_inducing > n:
            raise ValueError(
                f"n_inducing={n_inducing} exceeds the number of training points n={n} (inducing points start "
                "at distinct training inputs)"
            )
        if minibatch is not None:
            minibatch = _positive_int("minibatch", minibatch)
            if minibatch > n:
                raise ValueError(f"minibatch={minibatch} exceeds the number of training points n={n}")

    tf, gpflow = _import_tf()
    kernel = gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=math.sqrt(d))
    likelihood = gpflow.likelihoods.Gaussian(
        variance=init_noise_var, variance_lower_bound=_NOISE_VAR_LOWER_BOUND
    )
    data = (x_train, y_train[:, None])
    what = f"{method} on n={n} training points (d={d})"
    warm = (0, 0)  # (warm_start_rows, warm_start_iter) of GPFit
    try:
        if method == "gpr":

            def loss(m: Any) -> Any:
                if gradient == "autodiff":
                    return m.training_loss
                return _gpr_loss_closed_form_gradient(tf, gpflow, m)

            description = (
                f"exact GP regression (GPflow {gpflow.__version__} GPR), isotropic squared-exponential "
                f"kernel, hyper-parameters by maximising the log marginal likelihood (scipy L-BFGS-B, at "
                f"most {max_iter} iterations)"
            )
            if warm_start_rows is not None and n > warm_start_rows:
                subset_key, _ = jax.random.split(key)
                rows = jax.random.choice(subset_key, n, (warm_start_rows,), replace=False)
                rows = np.sort(np.asarray(rows))
                # The subset's model and the full model share the kernel and likelihood objects, so the
                # second optimisation starts where the first stopped.
                subset = gpflow.models.GPR((x_train[rows], y_train[rows, None]), kernel=kernel,
                                           likelihood=likelihood)
                warm_iter = _scipy_minimize(gpflow, loss(subset), subset.trainable_variables, max_iter)[0]
                warm = (warm_start_rows, warm_iter)
                description += (f", warm-started: fitted first on {warm_start_rows} of the {n} training "
                                f"rows drawn from the key ({warm_iter} iterations), then to convergence on "
                                f"all rows")
            model = gpflow.models.GPR(data, kernel=kernel, likelihood=likelihood)
            n_iter, converged, n_eval = _scipy_minimize(gpflow, loss(model), model.trainable_variables,
                                                        max_iter)
            objective = float(model.log_marginal_likelihood().numpy())
            if gradient == "closed_form":
                description += "; closed-form gradient"
        else:
            init_key, batch_key = jax.random.split(key)
            rows = np.asarray(jax.random.choice(init_key, n, (n_inducing,), replace=False))
            z = x_train[rows].copy()
            if minibatch is None:
                # Titsias' collapsed bound: the ELBO maximised over q(u) in closed form. (Uncollapsed SVGP
                # leaves q(u)'s m(m+3)/2 entries to L-BFGS-B, which fails to converge them even for m=40.)
                model = gpflow.models.SGPR(data, kernel, z, likelihood=likelihood)
                sgpr_loss = (model.training_loss if gradient == "autodiff"
                             else _sgpr_loss_closed_form_gradient(tf, gpflow, model))
                n_iter, converged, n_eval = _scipy_minimize(gpflow, sgpr_loss, model.trainable_variables,
                                                            max_iter)
                how = (f"the collapsed ELBO, q(u) optimal in closed form (GPflow {gpflow.__version__} SGPR; "
                       f"scipy L-BFGS-B, at most {max_iter} iterations"
                       + ("" if gradient == "autodiff" else "; closed-form gradient") + ")")
            else:
                model = gpflow.models.SVGP(kernel, likelihood, z, num_data=n, whiten=True)
                seed = int(jax.random.randint(batch_key, (), 0, np.iinfo(np.int32).max))
                n_iter, converged = _adam(tf, gpflow, model, data, minibatch, max_iter, seed)
                n_eval = n_iter
                how = (f"minibatch estimates of the uncollapsed ELBO, q(u) a free Gaussian (Hensman et al. "
                       f"2013; GPflow {gpflow.__version__} SVGP, whitened; Adam, lr {_ADAM_LEARNING_RATE:g}, "
                       f"batch {minibatch}, {max_iter} steps)")
            objective = float((model.elbo() if minibatch is None else model.elbo(data)).numpy())
            description = (
                f"sparse variational GP regression (Titsias 2009), {n_inducing} inducing points started at "
                f"distinct training inputs drawn from the key and trained, isotropic squared-exponential "
                f"kernel, hyper-parameters by maximising {how}"
            )
        mean, var = (t.numpy()[:, 0].astype(np.float64) for t in model.predict_y(x_test))
    # Cholesky failures surface as InvalidArgumentError; a LAPACK failure in the closed-form gradient (run
    # by tf.numpy_function) as UnknownError.
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as err:
        raise RuntimeError(f"GP fit failed for {what}: {err.message.splitlines()[0]}") from err
    noise_var = float(likelihood.variance.numpy())
    lengthscale = float(kernel.lengthscales.numpy())
    signal_var = float(kernel.variance.numpy())
    values = {"objective": objective, "noise variance": noise_var, "lengthscale": lengthscale,
              "signal variance": signal_var}
    bad = [name for name, v in values.items() if not math.isfinite(v)]
    n_bad = int(np.sum(~np.isfinite(mean)) + np.sum(~np.isfinite(var)))
    if bad or n_bad:
        raise RuntimeError(
            f"GP fit failed for {what}: non-finite {', '.join(bad) or 'values'}"
            + (f"; {n_bad} non-finite predictive means/variances" if n_bad else "")
        )
    return GPFit(mean, var, noise_var, lengthscale, signal_var, objective, n_iter, converged, method,
                 description, n_eval, *warm)


def _scipy_minimize(gpflow: ModuleType, loss: Any, variables: Any, max_iter: int) -> tuple[int, bool, int]:
    """L-BFGS-B with scipy's default stopping rule; returns (iterations, converged, evaluations)."""
    result = gpflow.optimizers.Scipy().minimize(
        loss, variables, method="L-BFGS-B", options={"maxiter": max_iter}, compile=True
    )
    return int(result.nit), bool(result.success), int(result.nfev)


def _isotropic_data(model: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """The model's ``(x, y, n)`` in float64 (``y`` a vector), after checking that its kernel has one
    (isotropic) lengthscale, as the closed-form gradients assume."""
    x, y = (np.asarray(t, dtype=np.float64) for t in model.data)
    if np.ndim(model.kernel.lengthscales.numpy()) != 0:
        raise ValueError("the closed-form gradient needs one (isotropic) lengthscale")
    return x, y[:, 0], len(y)


def _gpr_loss_closed_form_gradient(tf: ModuleType, gpflow: ModuleType, model: Any) -> Any:
    """``model.training_loss`` of a GPR with an isotropic squared-exponential kernel and zero mean, computed
    in numpy/LAPACK with its gradient in closed form (see :func:`fit_predict`, ``gradient="closed_form"``).

    The loss is a function of the three constrained hyper-parameters (signal variance ``s2``, lengthscale
    ``l``, noise variance ``v``); TensorFlow chains its gradient through GPflow's parameter transforms to the
    variables L-BFGS-B moves. With ``E = exp(-D / (2 l^2))`` (``D`` the squared distances, computed once),
    ``K = s2 E + v I``, ``alpha = K^-1 y`` and ``G = d log N(y | 0, K) / dK = (alpha alpha^T - K^-1) / 2``:
    ``d/ds2 = sum(G * E)``, ``d/dv = trace(G)``, ``d/dl = s2 / l^3 sum(G * E * D)``.
    """
    x, y, n = _isotropic_data(model)
    sq = np.sum(x * x, axis=1)
    dist = np.asfortranarray(x @ x.T)
    dist *= -2.0
    dist += sq[:, None]
    dist += sq[None, :]
    dist += dist.T.copy()
    dist *= 0.5  # exactly symmetric, so that every n x n array below is too
    np.maximum(dist, 0.0, out=dist)
    dist.flat[:: n + 1] = 0.0
    log_2pi = math.log(2.0 * math.pi)

    def evaluate(signal_var: np.ndarray, lengthscale: np.ndarray, noise_var: np.ndarray) -> list[np.ndarray]:
        s2, ls, v = float(signal_var), float(lengthscale), float(noise_var)
        e = np.multiply(dist, -0.5 / ls**2, order="F")
        np.exp(e, out=e)
        k = np.multiply(e, s2, order="F")
        k.flat[:: n + 1] += v
        chol = linalg.cholesky(k, lower=True, overwrite_a=True, check_finite=False)  # zeros above the diagonal
        alpha = linalg.cho_solve((chol, True), y, check_finite=False)
        value = 0.5 * (y @ alpha) + np.sum(np.log(np.diag(chol))) + 0.5 * n * log_2pi
        # The lower triangle of K^-1 (dpotri leaves the zeros above it). For a symmetric S,
        # sum(K^-1 * S) = 2 sum(lower(K^-1) * S) - sum(diag(K^-1) diag(S)).
        inv, info = linalg.lapack.dpotri(chol, lower=1, overwrite_c=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"LAPACK dpotri failed (info={info})")
        inv_diag = np.diag(inv).copy()
        d_v = -0.5 * (alpha @ alpha - np.sum(inv_diag))
        d_s2 = -0.5 * (alpha @ (e @ alpha) - (2.0 * np.einsum("ij,ij->", inv, e) - np.sum(inv_diag)))
        e *= dist  # E * D, whose diagonal is zero
        d_l = -0.5 * s2 / ls**3 * (alpha @ (e @ alpha) - 2.0 * np.einsum("ij,ij->", inv, e))
        return [np.float64(value), np.float64(d_s2), np.float64(d_l), np.float64(d_v)]

    params = (model.kernel.variance, model.kernel.lengthscales, model.likelihood.variance)
    return _numpy_loss(tf, model, evaluate, params)


def _sgpr_loss_closed_form_gradient(tf: ModuleType, gpflow: ModuleType, model: Any) -> Any:
    """``model.training_loss`` of an SGPR (Titsias' collapsed bound; isotropic squared-exponential kernel,
    zero mean, one noise variance) computed in numpy with its gradient in closed form, GPflow's formulas and
    jitter. With ``n`` rows and ``M`` inducing inputs it costs a few ``M^2 n`` matrix products and no
    triangular solve with ``n`` right-hand sides (see :func:`fit_predict`, ``gradient="closed_form"``).

    Writing ``P = K_uf K_fu``, ``v = K_uf y``, ``S = K_uu + P / t`` (``t`` the noise variance) and
    ``w = S^-1 v``, the bound is ``-n/2 log 2 pi - 1/2 log|S| + 1/2 log|K_uu| - n/2 log t - n s2 / (2t)
    + tr(K_uu^-1 P) / (2t) - y'y / (2t) + v'w / (2t^2)``; its derivatives with respect to ``K_uu``
    (``(K_uu^-1 - S^-1) / 2 - K_uu^-1 P K_uu^-1 / (2t) - w w' / (2t^2)``), ``P``
    (``(K_uu^-1 - S^-1 - w w' / t^2) / (2t)``), ``v`` (``w / t^2``) and ``t`` are chained to the signal
    variance, the lengthscale and the inducing inputs through the kernel. ``S`` is never formed: with
    ``K_uu = L L'`` and ``B = I + L^-1 P L^-T / t`` (GPflow's ``B``), ``S = L B L'``.
    """
    x, y, n = _isotropic_data(model)
    sq_x = np.sum(x * x, axis=1)
    yy = float(y @ y)
    jitter = float(gpflow.config.default_jitter())
    log_2pi = math.log(2.0 * math.pi)

    def evaluate(signal_var: np.ndarray, lengthscale: np.ndarray, noise_var: np.ndarray,
                 z: np.ndarray) -> list[np.ndarray]:
        s2, ls, t = float(signal_var), float(lengthscale), float(noise_var)
        m = len(z)
        eye = np.eye(m)
        sq_z = np.sum(z * z, axis=1)
        d_uf = np.maximum(sq_z[:, None] + sq_x[None, :] - 2.0 * (z @ x.T), 0.0)
        d_uu = sq_z[:, None] + sq_z[None, :] - 2.0 * (z @ z.T)
        d_uu = np.maximum(0.5 * (d_uu + d_uu.T), 0.0)
        np.fill_diagonal(d_uu, 0.0)
        k_uf = s2 * np.exp(d_uf * (-0.5 / ls**2))
        k_uu0 = s2 * np.exp(d_uu * (-0.5 / ls**2))  # without the jitter
        chol = linalg.cholesky(k_uu0 + jitter * eye, lower=True, check_finite=False)
        l_inv = linalg.solve_triangular(chol, eye, lower=True, check_finite=False)
        # GPflow's A (times the noise sd): L^-1 K_uf, as accurate as its triangular solve; forming P = K_uf K_fu
        # first and then L^-1 P L^-T is not (it cancels where K_uu is ill-conditioned).
        a = l_inv @ k_uf
        q = a @ a.T  # L^-1 P L^-T
        q = 0.5 * (q + q.T)
        chol_b = linalg.cholesky(eye + q / t, lower=True, check_finite=False)
        l_v = a @ y  # L^-1 v
        c = linalg.solve_triangular(chol_b, l_v / t, lower=True, check_finite=False)
        tr_q = float(np.trace(q))
        elbo = (-0.5 * n * log_2pi - np.sum(np.log(np.diag(chol_b))) - 0.5 * n * math.log(t)
                - 0.5 * (n * s2 / t - tr_q / t) - 0.5 * (yy / t - c @ c))
        b_inv = linalg.cho_solve((chol_b, True), eye, check_finite=False)
        w = l_inv.T @ (b_inv @ l_v)
        w_f = w @ k_uf  # K_fu w
        i_minus_b_inv = eye - b_inv
        kinv_minus_sinv = l_inv.T @ i_minus_b_inv @ l_inv
        ww = np.outer(w, w)
        g_uu = 0.5 * kinv_minus_sinv - (l_inv.T @ q @ l_inv) / (2.0 * t) - ww / (2.0 * t**2)
        # 2 G_P K_uf + w y' / t^2, with G_P K_uf = (L^-T (I - B^-1) A - w w_f' / t^2) / (2t)
        g_uf = (l_inv.T @ (i_minus_b_inv @ a) - np.outer(w, w_f) / t**2) / t + np.outer(w, y) / t**2
        d_t = (0.5 * np.sum(b_inv * q) / t**2 - 0.5 * n / t + 0.5 * n * s2 / t**2 - 0.5 * tr_q / t**2
               + 0.5 * yy / t**2 - (l_v @ (b_inv @ l_v)) / t**3 + (w_f @ w_f) / (2.0 * t**4))
        h = g_uu * k_uu0  # each K_uu entry's derivative times the entry
        g_uf *= k_uf  # the same for K_uf, in place
        d_s2 = (np.sum(h) + np.sum(g_uf)) / s2 - 0.5 * n / t
        d_l = (np.sum(h * d_uu) + np.sum(g_uf * d_uf)) / ls**3
        # d k(a, b) / d a = -k(a, b) (a - b) / l^2; K_uu holds z on both sides.
        d_z = (-(2.0 / ls**2) * (h.sum(axis=1)[:, None] * z - h @ z)
               - (1.0 / ls**2) * (g_uf.sum(axis=1)[:, None] * z - g_uf @ x))
        return [np.float64(-elbo), np.float64(-d_s2), np.float64(-d_l), np.float64(-d_t), -d_z]

    params = (model.kernel.variance, model.kernel.lengthscales, model.likelihood.variance, model.inducing_variable.Z)
    return _numpy_loss(tf, model, evaluate, params)


def _numpy_loss(tf: ModuleType, model: Any, evaluate: Any, params: tuple[Any, ...]) -> Any:
    """A loss closure for GPflow's scipy optimiser: ``evaluate(*constrained parameter values)`` returns the
    loss and its gradient with respect to each (numpy, run by ``tf.numpy_function``); TensorFlow chains the
    gradient through the parameters' transforms. The model's log prior density is subtracted as in
    ``training_loss``."""

    def quiet(*values: np.ndarray) -> list[np.ndarray]:
        # Overflowing data give non-finite values, which fit_predict reports as a failed fit.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return evaluate(*values)

    @tf.custom_gradient
    def value_of(*values: Any) -> Any:
        value, *grads = tf.numpy_function(quiet, list(values), [tf.float64] * (1 + len(values)), stateful=False)

        def grad(upstream: Any) -> Any:
            return [upstream * tf.reshape(g, tf.shape(x)) for g, x in zip(grads, values)]

        return tf.reshape(value, ()), grad

    @tf.autograph.experimental.do_not_convert  # straight-line code: nothing for AutoGraph to convert
    def loss() -> Any:
        return value_of(*(tf.convert_to_tensor(p) for p in params)) - model.log_prior_density()

    return loss


def _adam(tf: ModuleType, gpflow: ModuleType, model: Any, data: tuple[np.ndarray, np.ndarray],
          batch: int, steps: int, seed: int) -> tuple[int, bool]:
    """``steps`` Adam steps on minibatch ELBO estimates; batches cycle through reshuffled epochs."""
    x, y = data
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .shuffle(min(len(x), 10_000), seed=seed, reshuffle_each_iteration=True)
        .batch(batch, drop_remainder=True)
    )
    loss = model.training_loss_closure(iter(dataset), compile=True)
    opt = gpflow.keras.tf_keras.optimizers.Adam(_ADAM_LEARNING_RATE)

    @tf.function
    def step() -> None:
        opt.minimize(loss, model.trainable_variables)

    for _ in range(steps):
        step()
    # A fixed number of stochastic steps has no convergence test: report "converged" as finished.
    return steps, True


def _check_data(x_train: Any, y_train: Any, x_test: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arrays = {}
    for name, value, ndim in (("x_train", x_train, 2), ("y_train", y_train, 1), ("x_test", x_test, 2)):
        a = np.asarray(value, dtype=np.float64)
        if a.ndim != ndim:
            want = "(n, d)" if name == "x_train" else "(n,)" if name == "y_train" else "(m, d)"
            raise ValueError(f"{name} must be a {ndim}-D array of shape {want}, got shape {a.shape}")
        n_bad = int(np.sum(~np.isfinite(a)))
        if n_bad:
            raise ValueError(f"{name} has {n_bad} non-finite value(s) (NaN or Inf)")
        arrays[name] = a
    x, y, xt = arrays["x_train"], arrays["y_train"], arrays["x_test"]
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x_train has {x.shape[0]} rows but y_train has {y.shape[0]} entries")
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"x_train must have at least one row and one column, got shape {x.shape}")
    if xt.shape[1] != x.shape[1]:
        raise ValueError(f"x_test has {xt.shape[1]} input dimensions but x_train has {x.shape[1]}")
    return x, y, xt


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
