"""Deep ensembles (Lakshminarayanan, Pritzel & Blundell, NeurIPS 2017): independently trained networks that
each predict a distribution, trained with fast-gradient-sign adversarial examples.

The paper under the book cites deep ensembles as the ensemble method that perturbs the data (adversarial
training) instead of the labels and the prior. This module is our reading of their UCI protocol ("Simple and
Scalable Predictive Uncertainty Estimation using Deep Ensembles", Section 3 and Appendix), in JAX:

Networks
    ``n_networks`` (``M``, theirs: 5) ReLU multilayer perceptrons with ``hidden`` units per hidden layer
    (theirs: one layer of 50; 100 for Protein) and a linear output layer. Each starts from its own random
    initialisation: Glorot-uniform weights ``U(-a, a)``, ``a = sqrt(6 / (fan_in + fan_out))``, and zero
    biases, Keras' ``Dense`` defaults. The paper does not say how it initialises; this is our choice (the one
    :mod:`~bootens_core.baselines.dropout` makes for Gal's protocol).
Regression (``likelihood="gaussian"``)
    Two outputs per network: the mean ``mu`` and a raw value turned into the variance
    ``var = softplus(raw) + min_var`` (``min_var = 1e-6``, their positivity constraint). The loss of a
    minibatch is the mean Gaussian negative log-likelihood ``0.5 log(2 pi var) + (y - mu)^2 / (2 var)``
    (:func:`gaussian_nll`).
Classification (``likelihood="categorical"``)
    ``C`` logits per network; the loss is the mean softmax cross-entropy (:func:`categorical_nll`). Labels
    are integer class indices ``0 .. C-1``.
Adversarial training
    Fast gradient sign: ``x' = x + eps * range_d * sign(d loss / d x)``, where ``range_d`` is the range
    (max - min) of training input column ``d`` and ``eps = adversarial_eps`` (theirs: 1% of the input range,
    so ``eps = 0.01``). The training objective of a minibatch is ``loss(x, y) + loss(x', y)`` (their
    Algorithm 1); ``x'`` is a constant of the step (no derivative is taken through it). ``eps = 0`` switches
    adversarial training off: the objective is then ``loss(x, y)`` alone. A constant input column has range
    0 and is never perturbed.
Optimiser
    Adam (optax defaults ``b1 = 0.9``, ``b2 = 0.999``, ``eps = 1e-8``) with a fixed learning rate ``lr``
    (theirs: 0.1), minibatches of ``batch_size`` rows (theirs: 100; a batch larger than the data is the
    whole data) and ``epochs`` passes over the data (theirs: 40). Every network draws a new order of the rows
    every epoch. The last, partial batch is kept; its loss is the mean over its own rows.
Prediction
    Regression: each network's ``(mu, var)``; the ensemble's predictive is their equal-weight Gaussian
    mixture (mean ``mean_m mu_m``, variance ``mean_m (var_m + mu_m^2) - mean^2``). Classification: the
    mean of the networks' softmax probabilities.

The inputs are used as given: the caller standardises them (the protocol standardises inputs and, for
regression, labels with training statistics). Networks train independently, all at once: a ``jax.vmap``
over networks around one ``lax.scan`` driver (epochs outer, minibatches inner). Network ``m`` draws
everything from ``fold_in(key, m)``, so its result does not depend on ``n_networks``.

Example::

    ens = deep_ensemble.fit(key, s.x_train, s.y_train)          # standardised inputs and labels
    mu, var = deep_ensemble.predict(ens, s.x_test)              # (M, n) each
    mean = mu.mean(0); sd = np.sqrt((var + mu**2).mean(0) - mean**2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..checks import check_finite
from ..models import float_dtype
from ._dense import check_count, glorot_uniform

__all__ = [
    "LIKELIHOODS",
    "MIN_VAR",
    "DeepEnsemble",
    "Params",
    "adversarial_inputs",
    "batch_order",
    "categorical_nll",
    "fit",
    "forward",
    "gaussian_nll",
    "init",
    "loss",
    "predict",
    "predict_proba",
    "row_losses",
]

Params = list  # [{"w": (d_in, d_out), "b": (d_out,)}, ...], one dict per dense layer, output layer last

MIN_VAR = 1e-6  # the variance floor of a regression network: var = softplus(raw) + MIN_VAR
LIKELIHOODS = ("gaussian", "categorical")


class DeepEnsemble(NamedTuple):
    """A trained deep ensemble (:func:`fit`).

    Attributes:
        params: the networks' parameters, every leaf with a leading axis ``n_networks``: a list of
            ``{"w": (M, d_in, d_out), "b": (M, d_out)}``, output layer last.
        likelihood: ``"gaussian"`` (outputs: mean and raw variance) or ``"categorical"`` (``C`` logits).
        diverged: ``(M,)`` bool: the network's final parameters or one of its epoch losses are not finite.
            :func:`predict` and :func:`predict_proba` leave such networks out.
        loss: ``(M, epochs)`` the mean over rows of the plain loss ``loss(x, y)`` in each epoch, each batch at
            its parameters before its update (the adversarial term is left out, so that runs with
            different ``eps`` compare).
        x_range: ``(d,)`` the range (max - min) of each training input column, which scales the adversarial
            step.
        min_var: the variance floor of a regression network.
        lr: the learning rate it was trained with.
        adversarial_eps: the adversarial step as a fraction of each column's range (0: off).
    """

    params: Params
    likelihood: str
    diverged: np.ndarray
    loss: np.ndarray
    x_range: np.ndarray
    min_var: float
    lr: float
    adversarial_eps: float


# ------------------------------------------------------------------------------------------- network


def init(key: jax.Array, sizes: Sequence[int], dtype: Any = None) -> Params:
    """One network of layer widths ``sizes = (d_in, *hidden, d_out)``: Glorot-uniform weights
    ``U(-a, a)`` with ``a = sqrt(6 / (fan_in + fan_out))`` and zero biases (Keras' ``Dense`` defaults).
    Layer ``l`` draws its weights with ``split(key, len(sizes) - 1)[l]``."""
    dtype = float_dtype(dtype)
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"layer sizes must be at least (d_in, d_out), all positive, got {sizes}")
    return glorot_uniform(key, sizes, dtype)


def forward(params: Params, x: jax.Array) -> jax.Array:
    """The raw outputs ``(n, d_out)`` of one network: ReLU hidden layers, a linear output layer."""
    h = x
    for layer in params[:-1]:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    return h @ params[-1]["w"] + params[-1]["b"]


def _gaussian_heads(raw: jax.Array, min_var: Any) -> tuple[jax.Array, jax.Array]:
    """``(mu, var)`` of a regression network's two raw outputs: ``var = softplus(raw_1) + min_var``."""
    return raw[..., 0], jax.nn.softplus(raw[..., 1]) + min_var


def gaussian_nll(mu: Any, var: Any, y: Any) -> jax.Array:
    """The negative log-density of ``y`` under ``N(mu, var)``, elementwise:
    ``0.5 log(2 pi var) + (y - mu)^2 / (2 var)``."""
    return 0.5 * jnp.log(2.0 * jnp.pi * var) + (y - mu) ** 2 / (2.0 * var)


def categorical_nll(logits: Any, labels: Any) -> jax.Array:
    """The softmax cross-entropy of each row: ``-log softmax(logits_i)[labels_i]`` for logits ``(n, C)`` and
    integer labels ``(n,)``."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, jnp.asarray(labels)[:, None], axis=-1)[:, 0]


def row_losses(params: Params, x: jax.Array, y: jax.Array, likelihood: str = "gaussian",
               min_var: Any = MIN_VAR) -> jax.Array:
    """The loss of each row ``(n,)`` of one network: :func:`gaussian_nll` or :func:`categorical_nll`."""
    raw = forward(params, x)
    if likelihood == "categorical":
        return categorical_nll(raw, y)
    mu, var = _gaussian_heads(raw, min_var)
    return gaussian_nll(mu, var, y)


def loss(params: Params, x: jax.Array, y: jax.Array, likelihood: str = "gaussian", min_var: Any = MIN_VAR,
         weights: jax.Array | None = None) -> jax.Array:
    """The mean of :func:`row_losses` over the rows; ``weights`` (0/1 per row) restricts the mean to the rows
    of a partial batch padded to full size."""
    rows = row_losses(params, x, y, likelihood, min_var)
    return jnp.mean(rows) if weights is None else jnp.sum(weights * rows) / jnp.sum(weights)


def adversarial_inputs(params: Params, x: jax.Array, y: jax.Array, eps: Any, x_range: jax.Array,
                       likelihood: str = "gaussian", min_var: Any = MIN_VAR) -> jax.Array:
    """Fast gradient sign: ``x + eps * x_range * sign(d loss_i / d x_i)`` for every row ``i``, with
    ``loss_i`` the row's loss (:func:`row_losses`; the sign is that of the minibatch mean's gradient too).
    The result carries no derivative (``stop_gradient``). No validation: it runs inside the training step."""
    grad = jax.grad(lambda z: jnp.sum(row_losses(params, z, y, likelihood, min_var)))(x)
    return jax.lax.stop_gradient(x + eps * x_range * jnp.sign(grad))


def batch_order(key: jax.Array, n: int) -> jax.Array:
    """The order in which a network visits the ``n`` rows in one epoch: ``argsort`` (stable) of ``n``
    i.i.d. 32-bit random integers ``jax.random.bits(key, (n,), uint32)``; rows ``order[j*b:(j+1)*b]`` form
    batch ``j``. (Ties, of probability about ``n^2 / 2^33``, keep the row order.)"""
    return jnp.argsort(jax.random.bits(key, (n,), jnp.uint32), stable=True)


# ------------------------------------------------------------------------------------------ training


def _train_one(key, x, y, x_range, lr, eps, min_var, *, sizes, epochs, batch_size, likelihood, adversarial):
    """One network: ``k_init, k_shuffle = split(key)``; ``lax.scan`` over epochs around ``lax.scan`` over
    batches; epoch ``e`` visits the rows in :func:`batch_order` ``(fold_in(k_shuffle, e), n)``."""
    n = x.shape[0]
    bs = min(batch_size, n)
    n_batches = -(-n // bs)
    pad = n_batches * bs - n
    k_init, k_shuffle = jax.random.split(key)
    params = init(k_init, sizes, x.dtype)
    tx = optax.adam(lr)
    weights = (jnp.arange(n_batches * bs) < n).astype(x.dtype).reshape(n_batches, bs)
    counts = weights.sum(1)

    def objective(p, xb, yb, w):
        plain = loss(p, xb, yb, likelihood, min_var, w)
        if not adversarial:
            return plain, plain
        x_adv = adversarial_inputs(p, xb, yb, eps, x_range, likelihood, min_var)
        return plain + loss(p, x_adv, yb, likelihood, min_var, w), plain

    grad_fn = jax.grad(objective, has_aux=True)

    def batch_step(carry, inp):
        p, opt_state = carry
        rows, w = inp
        grad, plain = grad_fn(p, x[rows], y[rows], w)
        updates, opt_state = tx.update(grad, opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), plain

    def epoch_step(carry, epoch):
        order = batch_order(jax.random.fold_in(k_shuffle, epoch), n)
        rows = jnp.concatenate([order, jnp.zeros((pad,), order.dtype)]).reshape(n_batches, bs)
        carry, plain = jax.lax.scan(batch_step, carry, (rows, weights))
        return carry, jnp.sum(plain * counts) / n

    (params, _), losses = jax.lax.scan(epoch_step, (params, tx.init(params)), jnp.arange(epochs))
    return params, losses


@partial(jax.jit, static_argnames=("n_networks", "sizes", "epochs", "batch_size", "likelihood", "adversarial"))
def _train(key, x, y, x_range, lr, eps, min_var, *, n_networks, **static):
    keys = jax.vmap(lambda m: jax.random.fold_in(key, m))(jnp.arange(n_networks))
    return jax.vmap(lambda k: _train_one(k, x, y, x_range, lr, eps, min_var, **static))(keys)


# -------------------------------------------------------------------------------------------- checks


def _positive(v: Any, what: str, zero_ok: bool = False) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {v!r}") from None
    if not math.isfinite(f) or f < 0 or (f == 0 and not zero_ok):
        raise ValueError(f"{what} must be {'non-negative' if zero_ok else 'positive'} and finite, got {v!r}")
    return f


def _check_x(x: Any, in_dim: int | None = None) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"inputs x must have shape (n, d) (reshape a single input with x[:, None]), "
                         f"got shape {x.shape}")
    if x.shape[0] == 0:
        raise ValueError("no rows in x (n = 0)")
    if in_dim is not None and x.shape[1] != in_dim:
        raise ValueError(f"x has {x.shape[1]} input columns but the networks take {in_dim}")
    check_finite("x", x)
    return x


def _check_labels(y: Any, n: int, likelihood: str, n_classes: Any) -> tuple[np.ndarray, int | None]:
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels y must be a vector of shape (n,), got shape {y.shape}")
    if y.shape[0] != n:
        raise ValueError(f"x has {n} rows but y has {y.shape[0]} labels")
    check_finite("y", y)
    if likelihood == "gaussian":
        if n_classes is not None:
            raise ValueError(f"n_classes is for likelihood='categorical'; got n_classes={n_classes!r} with "
                             "likelihood='gaussian'")
        return y, None
    if y.dtype == bool or not np.all(y == np.round(y)):
        raise ValueError("a classifier's labels y must be integer class indices 0 .. C-1")
    labels = y.astype(np.int64)
    c = int(labels.max()) + 1 if n_classes is None else check_count(n_classes, "n_classes", 2)
    if c < 2:
        raise ValueError(f"a classifier needs at least 2 classes; the labels hold only class {int(labels.max())}"
                         " (pass n_classes)")
    if labels.min() < 0 or labels.max() >= c:
        raise ValueError(f"labels y must be class indices in 0 .. {c - 1} (n_classes = {c}), got values from "
                         f"{int(labels.min())} to {int(labels.max())}")
    return labels, c


def _check_hidden(hidden: Any) -> tuple[int, ...]:
    if isinstance(hidden, str | bytes) or not isinstance(hidden, Sequence):
        raise ValueError(f"hidden must be a sequence of layer widths such as (50,), got {hidden!r}")  # noqa: TRY004
    return tuple(check_count(h, "every hidden width") for h in hidden)


# --------------------------------------------------------------------------------------------- public


def fit(
    key: jax.Array,
    x: Any,
    y: Any,
    *,
    hidden: Sequence[int] = (50,),
    n_networks: int = 5,
    epochs: int = 40,
    batch_size: int = 100,
    lr: float = 0.1,
    adversarial_eps: float = 0.01,
    likelihood: str = "gaussian",
    n_classes: int | None = None,
    min_var: float = MIN_VAR,
    dtype: Any = None,
) -> DeepEnsemble:
    """Train a deep ensemble on ``(x, y)`` (the protocol of the module docstring).

    Args:
        key: network ``m`` uses ``k_m = fold_in(key, m)``, split into ``k_init, k_shuffle = split(k_m)``:
            its initial weights (:func:`init` with ``k_init``) and the row order of epoch ``e``
            (:func:`batch_order` with ``fold_in(k_shuffle, e)``). So network ``m`` does not depend on
            ``n_networks``.
        x: ``(n, d)`` inputs, used as given (standardise them first).
        y: ``(n,)`` labels: real numbers (``"gaussian"``; standardise them first) or integer class indices
            ``0 .. C-1`` (``"categorical"``).
        hidden: widths of the ReLU hidden layers (theirs: ``(50,)``, ``(100,)`` for Protein).
        n_networks: ``M`` (theirs: 5).
        epochs, batch_size, lr: Adam's passes, minibatch size and fixed learning rate (theirs: 40, 100, 0.1).
        adversarial_eps: the fast-gradient-sign step as a fraction of each input column's range (theirs:
            0.01); 0 trains on the plain loss alone.
        likelihood: ``"gaussian"`` (regression) or ``"categorical"`` (classification).
        n_classes: ``C`` for ``"categorical"`` (default: the largest label + 1).
        min_var: the variance floor of a regression network.
        dtype: the float dtype to train in (default: JAX's default float, see
            :func:`~bootens_core.models.float_dtype`).

    Returns:
        A :class:`DeepEnsemble`; networks whose parameters or loss went non-finite are flagged in
        ``diverged``, not dropped (:func:`predict` drops them).

    Raises:
        ValueError: naming the problem with any input (shapes, NaN/Inf, counts, rates, labels, dtype).
    """
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be 'gaussian' or 'categorical', got {likelihood!r}")
    dtype = float_dtype(dtype)
    x = _check_x(x)
    y, c = _check_labels(y, x.shape[0], likelihood, n_classes)
    hidden = _check_hidden(hidden)
    n_networks = check_count(n_networks, "n_networks")
    epochs = check_count(epochs, "epochs")
    batch_size = check_count(batch_size, "batch_size")
    lr = _positive(lr, "learning rate lr")
    eps = _positive(adversarial_eps, "adversarial_eps", zero_ok=True)
    min_var = _positive(min_var, "min_var")

    x_np = x.astype(np.float64)
    x_range = x_np.max(0) - x_np.min(0)
    out = 2 if likelihood == "gaussian" else c
    y_j = jnp.asarray(y, dtype) if likelihood == "gaussian" else jnp.asarray(y, jnp.int32)
    params, losses = _train(
        key, jnp.asarray(x_np, dtype), y_j, jnp.asarray(x_range, dtype), jnp.asarray(lr, dtype),
        jnp.asarray(eps, dtype), jnp.asarray(min_var, dtype), n_networks=n_networks,
        sizes=(x.shape[1], *hidden, out), epochs=epochs, batch_size=batch_size, likelihood=likelihood,
        adversarial=eps > 0,
    )
    losses = np.asarray(losses)
    finite = np.all(np.isfinite(losses), axis=1)
    for leaf in jax.tree.leaves(params):
        finite &= np.all(np.isfinite(np.asarray(leaf)).reshape(n_networks, -1), axis=1)
    return DeepEnsemble(params=params, likelihood=likelihood, diverged=~finite, loss=losses, x_range=x_range,
                        min_var=min_var, lr=lr, adversarial_eps=eps)


def _kept(ens: DeepEnsemble, x: Any, likelihood: str) -> tuple[Params, jax.Array]:
    if not isinstance(ens, DeepEnsemble):
        raise TypeError(f"expected a DeepEnsemble from deep_ensemble.fit, got {type(ens).__name__}")
    if ens.likelihood != likelihood:
        use = "predict_proba" if ens.likelihood == "categorical" else "predict"
        raise ValueError(f"this ensemble has likelihood {ens.likelihood!r}: use deep_ensemble.{use}")
    ok = ~np.asarray(ens.diverged, bool)
    if not ok.any():
        raise RuntimeError(f"all {ok.size} networks diverged (non-finite parameters or loss): the learning rate "
                           f"lr = {ens.lr:g} is too large for this problem; lower it")
    params = jax.tree.map(lambda a: a[ok], ens.params)
    x = _check_x(x, int(params[0]["w"].shape[1]))
    return params, jnp.asarray(x, params[0]["w"].dtype)


_forward_all = jax.jit(jax.vmap(forward, in_axes=(0, None)))


def predict(ens: DeepEnsemble, x: Any) -> tuple[np.ndarray, np.ndarray]:
    """A regression ensemble's networks at ``x`` ``(n, d)``: means ``(M', n)`` and variances ``(M', n)`` of
    the ``M'`` networks that did not diverge, in the units of the labels it was trained on.

    Raises ``RuntimeError`` (naming the learning rate) if every network diverged."""
    params, x = _kept(ens, x, "gaussian")
    mu, var = _gaussian_heads(_forward_all(params, x), ens.min_var)
    return np.asarray(mu), np.asarray(var)


def predict_proba(ens: DeepEnsemble, x: Any) -> np.ndarray:
    """A classification ensemble's networks at ``x`` ``(n, d)``: softmax probabilities ``(M', n, C)`` of the
    ``M'`` networks that did not diverge (the ensemble's predictive is their mean over the first axis).

    Raises ``RuntimeError`` (naming the learning rate) if every network diverged."""
    params, x = _kept(ens, x, "categorical")
    return np.asarray(jax.nn.softmax(_forward_all(params, x), axis=-1))
