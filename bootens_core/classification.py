"""Classification as heteroscedastic latent regression (the paper's appendix, after Milios et al. 2018).

A label ``y_i`` in ``{0, ..., C-1}`` becomes a one-hot row, then Dirichlet parameters ``alpha_i = y_i +
alpha_eps`` (``alpha_eps = 0.01`` in the paper). Each ``alpha_ic`` is read as the parameter of a
``Gamma(alpha_ic, 1)`` variable (a Dirichlet draw is a vector of independent Gammas, normalised), and that
Gamma is matched in mean and variance by a log-normal: with

    sigma~^2_ic = log(1 / alpha_ic + 1),        y~_ic = log(alpha_ic) - sigma~^2_ic / 2,

``exp(N(y~_ic, sigma~^2_ic))`` has mean ``alpha_ic`` and variance ``alpha_ic``, the Gamma's. Classification
becomes ``C`` regressions with Gaussian likelihood ``N(y~_ic; f_c(x_i), sigma~^2_ic)``, a different noise
variance for every point and class, on one network with ``C`` outputs.

The latent targets are shifted by a per-class offset ``m_c = log(pi_c) + c0`` (``pi_c`` the class frequencies,
``c0`` the mean of ``y~ - log(pi)`` over all points and classes): the network regresses ``y~ - m``, whose
overall mean is zero, and ``m`` is added back at prediction. Far from the data a prior function is near zero,
so the prediction there is ``softmax(m) = pi``: the prior class probabilities are right.

Algorithm 1 then runs unchanged on the latent regression: every particle perturbs each latent target with its
own variance, ``y~_ic + N(0, sigma~^2_ic)``, anchors its prior at a prior draw, and is optimised. A particle
predicts ``softmax(f(x) + m)``; the particles together give a distribution of classifiers (mean probability
and a 95% band).

:func:`log_joint` is the reference model: the same network with a categorical (Bernoulli for ``C = 2``)
likelihood ``p(y_i | x_i) = softmax(f(x_i))_{y_i}`` and the same prior, for MCMC.

Example::

    model = models.mlp(1, (50,), "relu", out_dim=2)
    fit = classification.train(key, model, x, labels, n_particles=200,
                               opt=ensemble.optimizer("lbfgs", 0.5, linesearch="zoom"), steps=500)
    p = classification.predict_proba(model, fit.ensemble.params, x_grid, fit.targets.offset)  # (200, n, 2)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from . import ensemble
from .checks import check_finite, check_observed, model_outputs
from .models import Model, Params, float_dtype, prior_logpdf, zeros

__all__ = [
    "ALPHA_EPS",
    "LatentTargets",
    "ClassifierFit",
    "check_labels",
    "one_hot",
    "transform",
    "dirichlet_alpha",
    "lognormal_moments",
    "gamma_moments",
    "train",
    "predict_proba",
    "summarise",
    "log_likelihood",
    "log_joint",
    "log_density_fn",
]

ALPHA_EPS = 0.01  # the paper's regularisation of the degenerate Beta/Dirichlet (Appendix)


class LatentTargets(NamedTuple):
    """The regression problem a classification problem becomes.

    Attributes:
        y: ``(n, C)`` centred latent targets ``y~ - offset`` (what the network regresses).
        noise_var: ``(n, C)`` per-point, per-class likelihood variances ``sigma~^2``.
        offset: ``(C,)`` the class offsets ``m`` added back to the network's outputs at prediction.
        alpha_eps: the Dirichlet regularisation used.
    """

    y: np.ndarray
    noise_var: np.ndarray
    offset: np.ndarray
    alpha_eps: float


class ClassifierFit(NamedTuple):
    """What :func:`train` returns: the ensemble (Algorithm 1 on the latent regression) and its targets."""

    ensemble: ensemble.EnsembleResult
    targets: LatentTargets


def check_labels(labels: Any, n_classes: int | None = None) -> tuple[np.ndarray, int]:
    """Labels as an integer vector in ``{0, ..., C-1}`` and ``C``; one clear error otherwise."""
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"class labels must be a vector of shape (n,), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("no labels (n = 0)")
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"class labels must be integers 0..C-1, got dtype {arr.dtype}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("class labels contain NaN/Inf")
    if not np.all(arr == np.round(arr)) or arr.min() < 0:
        raise ValueError(f"class labels must be integers 0..C-1, got values such as {np.unique(arr)[:5].tolist()}")
    arr = arr.astype(np.int64)
    c = int(arr.max()) + 1 if n_classes is None else int(n_classes)
    if c < 2:
        raise ValueError(f"classification needs at least 2 classes, got {c}")
    if arr.max() >= c:
        raise ValueError(f"label {int(arr.max())} is out of range for {c} classes (labels are 0..{c - 1})")
    return arr, c


def one_hot(labels: Any, n_classes: int | None = None) -> np.ndarray:
    """``(n, C)`` one-hot rows of integer labels."""
    arr, c = check_labels(labels, n_classes)
    return np.eye(c)[arr]


def dirichlet_alpha(labels: Any, n_classes: int | None = None, alpha_eps: float = ALPHA_EPS) -> np.ndarray:
    """``alpha = one_hot(y) + alpha_eps``: the regularised Dirichlet parameters of each label."""
    a = float(alpha_eps)
    if not (a > 0 and np.isfinite(a)):
        raise ValueError(f"alpha_eps must be positive and finite, got {alpha_eps!r}")
    return one_hot(labels, n_classes) + a


def lognormal_moments(mean_log: Any, var_log: Any) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of ``exp(N(mean_log, var_log))``."""
    m, v = np.asarray(mean_log, float), np.asarray(var_log, float)
    return np.exp(m + v / 2), np.expm1(v) * np.exp(2 * m + v)


def gamma_moments(shape: Any, rate: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of ``Gamma(shape, rate)``."""
    a = np.asarray(shape, float)
    return a / rate, a / rate**2


def transform(labels: Any, n_classes: int | None = None, alpha_eps: float = ALPHA_EPS) -> LatentTargets:
    """Labels -> the heteroscedastic latent regression targets (module docstring).

    The log-normal ``N(y~, sigma~^2)`` in log space matches ``Gamma(alpha, 1)`` in mean and variance
    (:func:`lognormal_moments`, :func:`gamma_moments`); the targets are centred by the class offsets.
    """
    arr, c = check_labels(labels, n_classes)
    alpha = dirichlet_alpha(arr, c, alpha_eps)
    var = np.log1p(1.0 / alpha)
    y_tilde = np.log(alpha) - var / 2
    counts = np.bincount(arr, minlength=c).astype(float)
    if np.any(counts == 0):
        missing = np.nonzero(counts == 0)[0].tolist()
        raise ValueError(f"class(es) {missing} have no training labels: their prior probability would be 0")
    log_pi = np.log(counts / counts.sum())
    offset = log_pi + np.mean(y_tilde - log_pi[None])
    return LatentTargets(y=y_tilde - offset[None], noise_var=var, offset=offset, alpha_eps=float(alpha_eps))


def train(
    key: jax.Array,
    model: Model,
    x: Any,
    labels: Any,
    *,
    n_particles: int,
    opt: ensemble.Optimizer,
    steps: int,
    n_classes: int | None = None,
    alpha_eps: float = ALPHA_EPS,
    perturb: bool = True,
    dtype: Any = None,
    on_diverged: str = "raise",
    progress: bool | str = False,
    observed: Any = None,
) -> ClassifierFit:
    """Algorithm 1 on the latent regression of ``labels``: one particle per classifier.

    ``model`` must have one output per class. With ``perturb=False`` the particles see the unperturbed
    latent targets and the plain prior (independent prior starts): the *plain* ensemble, whose particles all
    climb the same log joint. ``observed``: ``(n,)`` booleans, ``False`` for padding rows (any valid label),
    which neither enter the targets' class offsets nor the particles' objectives (:func:`ensemble.train`'s
    ``observed``); the returned targets are the observed rows'. Other arguments as :func:`ensemble.train`.
    """
    if observed is None:
        targets = transform(labels, n_classes, alpha_eps)
        y, noise_var = targets.y, targets.noise_var
    else:
        rows = check_observed(observed, len(np.asarray(labels)))
        targets = transform(np.asarray(labels)[rows], n_classes, alpha_eps)
        y = np.zeros((rows.size, targets.y.shape[1]))
        noise_var = np.ones_like(y)
        y[rows], noise_var[rows] = targets.y, targets.noise_var
    outputs = model_outputs(model, np.asarray(x))
    c = targets.y.shape[1]
    if outputs != c:
        raise ValueError(f"the model has {outputs or 1} output(s) but the labels have {c} classes: use out_dim={c}")
    res = ensemble.train(
        key, model, x, y, noise_var=noise_var, n_particles=n_particles, opt=opt, steps=steps,
        perturb_labels=perturb, perturb_prior=perturb, dtype=dtype, on_diverged=on_diverged, progress=progress,
        observed=observed,
    )
    return ClassifierFit(res, targets)


def predict_proba(model: Model, params: Params, x: Any, offset: Any) -> np.ndarray:
    """``(k, n, C)`` class probabilities ``softmax(f(x) + offset)`` of every particle (leading axis ``k``)."""
    x = jnp.asarray(x)
    f = jax.vmap(model.apply, in_axes=(0, None))(params, x)
    if f.ndim != 3:
        raise ValueError(f"the model must have one output per class (apply -> (n, C)), got outputs of shape {f.shape[1:]}")
    return np.asarray(jax.nn.softmax(f + jnp.asarray(offset, f.dtype), axis=-1))


def summarise(probs: Any, level: float = 0.95) -> dict[str, np.ndarray]:
    """Mean probability and the central ``level`` band over particles of ``(k, n, C)`` probabilities."""
    p = np.asarray(probs, float)
    if p.ndim != 3:
        raise ValueError(f"probs must have shape (k, n, C), got {p.shape}")
    lo, hi = np.percentile(p, [50 * (1 - level), 50 * (1 + level)], axis=0)
    return {"mean": p.mean(0), "lower": lo, "upper": hi}


def log_likelihood(model: Model, params: Params, x: jax.Array, labels: jax.Array) -> jax.Array:
    """``sum_i log softmax(f(x_i))_{y_i}``: the categorical (Bernoulli for 2 classes) log likelihood."""
    f = model.apply(params, x)
    logp = jax.nn.log_softmax(f, axis=-1)
    return jnp.sum(jnp.take_along_axis(logp, labels[:, None], axis=1))


def log_joint(model: Model, params: Params, x: jax.Array, labels: jax.Array) -> jax.Array:
    """``log p(y | x, theta) + log p(theta)`` of the categorical-likelihood network (the MCMC reference)."""
    return log_likelihood(model, params, x, labels) + prior_logpdf(model, params)


def log_density_fn(model: Model, x: Any, labels: Any, dtype: Any = None):
    """:func:`log_joint` as a function of one flat parameter vector, and the unravel map (for NUTS); ``dtype``
    as :func:`~bootens_core.models.float_dtype`."""
    dtype = float_dtype(dtype)
    arr, _ = check_labels(labels)
    x_np = np.asarray(x)
    check_finite("x", x_np)
    if x_np.shape[0] != arr.shape[0]:
        raise ValueError(f"x has {x_np.shape[0]} rows but there are {arr.shape[0]} labels")
    x_j, y_j = jnp.asarray(x_np, dtype), jnp.asarray(arr)
    _, unravel = ravel_pytree(zeros(model, dtype))

    def log_density(theta: jax.Array) -> jax.Array:
        return log_joint(model, unravel(theta), x_j, y_j)

    return log_density, unravel
