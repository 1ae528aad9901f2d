"""scikit-learn estimators: Algorithm 1 behind ``fit`` / ``predict``, with intervals, saving and loading.

:class:`BootstrapEnsembleRegressor` trains ``n_particles`` fully connected networks, each on its own replicate
(perturbed labels and a prior anchor: :mod:`bootens_core.ensemble`), and predicts with their mixture
``1/k sum_i N(f_i(x), sigma^2)``. :class:`BootstrapEnsembleClassifier` does the same on the latent regression
of the labels (:mod:`bootens_core.classification`: the Dirichlet / log-normal transform) and predicts the
mean of the particles' softmax probabilities. Both standardise inside ``fit`` (inputs per column, the
regressor's labels too) and predict in the data's own units; both follow scikit-learn's estimator API
(``get_params``/``set_params``, ``clone``, ``Pipeline``, ``GridSearchCV``) and pass its estimator checks.

Example::

    from bootens_core.estimators import BootstrapEnsembleRegressor
    est = BootstrapEnsembleRegressor(random_state=0).fit(X, y)
    mean, std = est.predict(X_new, return_std=True)
    lower, upper = est.predict_interval(X_new, level=0.9)
    est.save("ensemble.npz"); est = BootstrapEnsembleRegressor.load("ensemble.npz")

``perturb=False`` gives the *plain* ensemble instead (random prior draws as starting points, every particle
climbing the same unperturbed log joint): the baseline that differs from Algorithm 1 only in the perturbation.

Settings are checked in ``fit`` (scikit-learn's convention: ``__init__`` only stores them) and a bad one
raises one ``ValueError`` naming it. Computation is in JAX's default float (float32 unless JAX's 64-bit mode
is on; see :func:`bootens_core.models.float_dtype`). This module needs scikit-learn (``pip install
scikit-learn``, or in a checkout ``pip install ".[sklearn]"``); the rest of the library does not.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import logsumexp, ndtr

from .extras import install_hint

try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils import check_random_state
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted, validate_data
except ModuleNotFoundError as err:
    raise ModuleNotFoundError(f"bootens_core.estimators needs scikit-learn ({err}): "
                              f"{install_hint('sklearn', ['scikit-learn'])}", name=err.name) from err

from . import classification, ensemble, metrics, persist
from .checks import DivergedParticlesError
from .models import ACTIVATIONS, Model, mlp, program_key, template

__all__ = ["BootstrapEnsembleRegressor", "BootstrapEnsembleClassifier", "load", "use_compilation_cache", "OPTIMIZERS",
           "NOISE_GRID", "PREDICT_ROWS", "padded_rows"]

#: The optimizers an estimator takes (``"lbfgs"`` is optax's L-BFGS with its zoom line search, the UCI
#: chapter's choice; the others are optax's, one update per step).
OPTIMIZERS = ("adam", "adagrad", "sgd", "lbfgs")

#: Rows per compiled call of the prediction (the last block padded with zeros). One shape for every input:
#: one compilation per architecture, and a row's outputs the same whatever rows come with it. In float32
#: XLA:CPU's products sum in an order that depends on the matrix's shape and on where a row falls in the
#: kernel's tiles (a row-permuted input of 20 rows changed one prediction by 2 ulps, failing scikit-learn's
#: ``check_methods_sample_order_invariance`` at its 1e-7); blocks of a fixed multiple of the tiles do not.
PREDICT_ROWS = 256

#: The default grid of ``sigma^2`` (in units of the standardised labels: fractions of their variance) from
#: which ``noise_var="auto"`` selects.
NOISE_GRID = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)


def padded_rows(n: int) -> int:
    """The rows an estimator's fit of ``n`` rows trains on: ``n`` rounded up to a multiple of an eighth of the
    largest power of two not above it (at least 8), the rest padding that adds nothing to the particles'
    objectives (``ensemble.train``'s ``observed``). The validation fits of ``noise_var="auto"`` and the final
    fit share the padded shape, and so one compiled program; so do the folds of a grid search, whose sizes
    differ by a row or two, unless a multiple falls between them. At most 12.5% more rows from 64 on."""
    n = int(n)
    if n < 1:
        raise ValueError(f"a fit needs at least one row, got {n}")
    step = max(8, 2 ** max(n.bit_length() - 4, 0))
    return -(-n // step) * step


def use_compilation_cache(path: str | os.PathLike[str] | None = None, min_compile_s: float = 0.0) -> str:
    """Keep the programs JAX compiles on disk, so that a later process fitting an estimator of the same
    settings and data shape loads them instead of compiling again (JAX's persistent compilation cache).

    A fit's first call compiles its training program (L-BFGS with its line search: seconds to tens of
    seconds on a CPU); with the cache, a new process compiles only what no earlier one did (scikit-learn's
    diabetes data, the defaults, on a 2-core AMD EPYC: a first fit of 45-50 s in a new process, 15 s in the
    next, whose programs all came from the cache; about 1 MB on disk). ``path``: the folder (default
    ``$XDG_CACHE_HOME/bootens/jax``, else ``~/.cache/bootens/jax``); programs that compiled in under
    ``min_compile_s`` seconds are not stored (with 0.5, the default fit's many small programs are compiled
    again: 23 s). This changes JAX's configuration for the whole process
    (``jax_compilation_cache_dir``), which importing the package never does; call it once, before fitting.
    Returns the folder."""
    if path is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "bootens", "jax")
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


# -- settings ------------------------------------------------------------------------------------------------


def _positive(name: str, value: Any) -> float:
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (real and value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _count(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer of at least {minimum}, got {value!r}")
    return int(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _hidden(value: Any) -> tuple[int, ...]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"hidden_layer_sizes must be a sequence of positive integers, got {value!r}")
    return tuple(_count("every hidden layer size", w) for w in value)


@functools.lru_cache(maxsize=64)
def _network(in_dim: int, hidden: tuple[int, ...], activation: str, out_dim: int, weight_var: float,
             bias_var: float, scale_by_fan_in: bool) -> Model:
    # One Model object per setting: the ensemble drivers key their compiled programs by its signature.
    return mlp(in_dim, hidden, activation, out_dim=out_dim, weight_var=weight_var, bias_var=bias_var,
               scale_by_fan_in=scale_by_fan_in)


@functools.lru_cache(maxsize=64)
def _forward(in_dim: int, hidden: tuple[int, ...], activation: str, out_dim: int):
    # The prior variances do not change the function: one compiled forward pass per architecture.
    model = _network(in_dim, hidden, activation, out_dim, 1.0, 1.0, False)
    return jax.jit(jax.vmap(model.apply, in_axes=(0, None)))


_OWN_FORWARD: dict[Any, Any] = {}


def _own_forward(model: Model):
    # One compiled forward pass per model of one's own, keyed as the ensemble drivers key their programs.
    key = program_key(model)
    if key not in _OWN_FORWARD:
        _OWN_FORWARD[key] = jax.jit(jax.vmap(model.apply, in_axes=(0, None)))
    return _OWN_FORWARD[key]


def _checked_model(model: Any, x: np.ndarray, out_dim: int, owner: str) -> Model:
    """``model`` after checking it is a :class:`~bootens_core.models.Model` mapping rows of ``x`` to the
    outputs ``owner`` needs (``(n,)`` for one output, ``(n, out_dim)`` otherwise)."""
    if not isinstance(model, Model):
        raise ValueError(f"model must be a bootens_core.models.Model (models.mlp, models.Model(...) or an "
                         f"adapter's result), got {type(model).__name__}")
    row = jax.ShapeDtypeStruct((2, x.shape[1]), x.dtype)
    try:
        out = jax.eval_shape(model.apply, template(model, x.dtype), row)
    except Exception as err:  # noqa: BLE001  (whatever the model's own code raises on these inputs)
        raise ValueError(f"model cannot take inputs of {x.shape[1]} column(s), as X has: "
                         f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
    want = (2,) if out_dim == 1 else (2, out_dim)
    if tuple(out.shape) != want:
        raise ValueError(f"model maps 2 rows of X to outputs of shape {tuple(out.shape)}; {owner} needs "
                         f"{want} ({'one output a row' if out_dim == 1 else f'{out_dim} outputs a row, one a class'})")
    return model


class _Base(BaseEstimator):
    """What the regressor and the classifier share: the network, the optimizer, the particles."""

    def _store_settings(self, values: dict[str, Any]) -> None:
        """``__init__``'s arguments stored unchanged under their own names, as scikit-learn requires (its
        ``get_params`` reads them back by the signature's names)."""
        for name in inspect.signature(type(self).__init__).parameters:
            if name != "self":
                setattr(self, name, values[name])

    def _settings(self) -> dict[str, Any]:
        """Every setting checked, as ``fit`` uses it (one ``ValueError`` naming the first bad one)."""
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        return {
            "hidden": _hidden(self.hidden_layer_sizes),
            "n_particles": _count("n_particles", self.n_particles),
            "weight_var": _positive("weight_var", self.weight_var),
            "bias_var": _positive("bias_var", self.bias_var),
            "scale_by_fan_in": _flag("scale_by_fan_in", self.scale_by_fan_in),
            "learning_rate": _positive("learning_rate", self.learning_rate),
            "steps": _count("steps", self.steps),
            "perturb": _flag("perturb", self.perturb),
        }

    def _opt(self, s: dict[str, Any]) -> ensemble.Optimizer:
        if self.optimizer == "lbfgs":
            return ensemble.optimizer("lbfgs", s["learning_rate"], linesearch="zoom")
        return ensemble.optimizer(self.optimizer, s["learning_rate"])

    def _model(self, s: dict[str, Any], in_dim: int, out_dim: int) -> Model:
        if self.model is not None:
            return self.model  # checked by fit (_checked_model) against the data
        return _network(in_dim, s["hidden"], self.activation, out_dim, s["weight_var"], s["bias_var"],
                        s["scale_by_fan_in"])

    def _key(self) -> jax.Array:
        seed = check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
        return jax.random.key(int(seed))

    def _fit_x(self, x: np.ndarray) -> np.ndarray:
        self.x_mean_ = x.mean(0)
        scale = x.std(0)
        self.x_scale_ = np.where(scale > 0, scale, 1.0)
        return (x - self.x_mean_) / self.x_scale_

    def _x(self, X: Any) -> jax.Array:
        check_is_fitted(self, "particles_")
        x = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        return jnp.asarray((x - self.x_mean_) / self.x_scale_, jax.tree.leaves(self.particles_)[0].dtype)

    def _outputs(self, X: Any) -> np.ndarray:
        """The particles' network outputs at ``X``: ``(k, n)`` or ``(k, n, C)``, computed
        :data:`PREDICT_ROWS` rows at a time (the last block padded), so that a row's outputs do not depend on
        how many rows come with it, nor where (see :data:`PREDICT_ROWS`)."""
        x = self._x(X)
        if self.model is not None:
            fwd = _own_forward(self.model)
        else:
            out_dim = self.particles_[-1]["w"].shape[-1]
            fwd = _forward(self.n_features_in_, tuple(p["w"].shape[-1] for p in self.particles_[:-1]),
                           self.activation, out_dim)
        params = jax.tree.map(jnp.asarray, self.particles_)
        n = x.shape[0]
        padded = jnp.pad(x, ((0, -n % PREDICT_ROWS), (0, 0)))
        # every block is dispatched before any is brought back, so the device never waits on the host
        blocks = [fwd(params, padded[i : i + PREDICT_ROWS]) for i in range(0, padded.shape[0], PREDICT_ROWS)]
        if not blocks:
            return np.asarray(fwd(params, x), np.float64)
        return np.concatenate([np.asarray(b, np.float64) for b in blocks], axis=1)[:, :n]

    def _keep(self, res: ensemble.EnsembleResult) -> None:
        """Store the trained particles, dropping diverged ones (with a warning; all diverged: an error)."""
        diverged = np.asarray(res.diverged, bool)
        if diverged.all():
            raise DivergedParticlesError(
                f"all {diverged.size} particles diverged (NaN/Inf parameters): lower learning_rate (now "
                f"{self.learning_rate}) or use optimizer='lbfgs'", diverged, None)
        if diverged.any():
            warnings.warn(
                f"{int(diverged.sum())} of {diverged.size} particles diverged (NaN/Inf parameters) and are "
                f"left out of the predictions; lower learning_rate (now {self.learning_rate}) to keep them",
                ConvergenceWarning, stacklevel=3)
        keep = ~diverged
        self.particles_ = jax.tree.map(lambda leaf: np.asarray(leaf)[keep], res.params)
        self.diverged_ = diverged
        self.n_particles_ = int(keep.sum())
        self.loss_curve_ = np.asarray(res.loss)

    # -- saving ----------------------------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        cfg = {}
        for name, value in self.get_params(deep=False).items():
            if name == "random_state" and not (value is None or isinstance(value, numbers.Integral)):
                value = None  # a RandomState instance: not restorable, and not needed to predict
            elif name == "model":
                value = None  # code, not data: passed again to load (the file records its structure)
            elif isinstance(value, np.generic):
                value = value.item()
            elif isinstance(value, tuple):
                value = list(value)
            cfg[name] = value
        return cfg

    def save(self, path: str | os.PathLike[str]) -> os.PathLike[str]:
        """Write the fitted ensemble to ``path`` (format: :mod:`bootens_core.persist`); returns the path.

        The file holds the settings, the standardisation, the particles, the fitted diagnostics and the
        input's column names (``feature_names_in_``, when fitted on a DataFrame); a ``random_state`` that is a
        ``RandomState`` instance is saved as ``None``. A ``model`` of one's own is code, not data: the file
        holds its particles and their structure, and :meth:`load` takes the model again (``model=``).
        """
        check_is_fitted(self, "particles_")
        own = self.model is not None
        if own:
            leaves, treedef = jax.tree.flatten(self.particles_)
            arrays = {f"particles/{j}": np.asarray(leaf) for j, leaf in enumerate(leaves)}
        else:
            arrays = {f"particles/{i}/{name}": leaf for i, layer in enumerate(self.particles_)
                      for name, leaf in layer.items()}
        arrays.update(x_mean=self.x_mean_, x_scale=self.x_scale_, diverged=self.diverged_,
                      loss_curve=self.loss_curve_)
        arrays.update(self._saved_arrays())
        fitted = {"n_features_in": int(self.n_features_in_), **self._saved_fitted()}
        if own:
            fitted["own_model"] = {"name": self.model.name, "structure": str(treedef),
                                   "shapes": [list(np.shape(leaf)[1:]) for leaf in leaves]}
        else:
            fitted["n_layers"] = len(self.particles_)
        if hasattr(self, "feature_names_in_"):  # fitted on a DataFrame: its column names, checked by predict
            fitted["feature_names_in"] = [str(name) for name in self.feature_names_in_]
        return persist.write(path, type(self).__name__, self._config(), fitted, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str], model: Model | None = None):
        """Read an ensemble :meth:`save` wrote; raises :class:`bootens_core.persist.IncompatibleFileError`
        for a file that is not one, of another estimator, in a format this version cannot read, with a
        setting ``fit`` would refuse (one edited into the file by hand), or of a model of one's own when
        ``model`` (the same network, whose particles the file holds) is not given or does not fit them."""
        saved = persist.read(path, kind=cls.__name__)
        own = saved.fitted.get("own_model")
        if own is None and model is not None:
            raise persist.IncompatibleFileError(
                f"{path}: its ensemble is of the estimator's own network; load it without model=")
        if own is not None:
            _check_own(path, own, model)
        cfg = dict(saved.config)
        if own is not None:
            cfg["model"] = model
        for name in ("hidden_layer_sizes", "noise_grid"):
            if isinstance(cfg.get(name), list):
                cfg[name] = tuple(cfg[name])
        try:
            est = cls(**cfg)
        except TypeError as err:
            raise persist.IncompatibleFileError(f"{path}: its settings do not fit {cls.__name__} ({err})") from None
        try:
            est._checked()
        except ValueError as err:
            raise persist.IncompatibleFileError(f"{path}: a setting in it is invalid: {err}") from None
        try:
            a, fitted = saved.arrays, saved.fitted
            est.n_features_in_ = int(fitted["n_features_in"])
            if own is not None:
                treedef = jax.tree.structure(template(model))
                est.particles_ = jax.tree.unflatten(treedef, [a[f"particles/{j}"] for j in range(len(own["shapes"]))])
            else:
                est.particles_ = [{name: a[f"particles/{i}/{name}"] for name in ("w", "b")}
                                  for i in range(int(fitted["n_layers"]))]
            est.x_mean_, est.x_scale_ = a["x_mean"], a["x_scale"]
            est.diverged_, est.loss_curve_ = a["diverged"], a["loss_curve"]
            est.n_particles_ = int(jax.tree.leaves(est.particles_)[0].shape[0])
            if fitted.get("feature_names_in") is not None:
                est.feature_names_in_ = np.asarray(fitted["feature_names_in"], dtype=object)
            est._restore(a, fitted)
        except (KeyError, TypeError) as err:
            raise persist.IncompatibleFileError(
                f"{path}: the {cls.__name__} in it is incomplete ({err})") from None
        return est


def _check_own(path: Any, own: dict[str, Any], model: Model | None) -> None:
    """Refuse, naming the file, a ``model`` that is missing or whose parameters are not the saved ones'."""
    if model is None:
        raise persist.IncompatibleFileError(
            f"{path} holds an ensemble of a network of one's own ({own['name']}): pass that network again, "
            f"load(path, model=...)")
    if not isinstance(model, Model):
        raise persist.IncompatibleFileError(f"{path}: model must be a bootens_core.models.Model, got "
                                            f"{type(model).__name__}")
    leaves, treedef = jax.tree.flatten(template(model))
    shapes = [list(leaf.shape) for leaf in leaves]
    if str(treedef) != own["structure"] or shapes != own["shapes"]:
        raise persist.IncompatibleFileError(
            f"{path}: the model given does not fit the saved particles (parameters {str(treedef)} of shapes "
            f"{shapes}; the file's: {own['structure']} of shapes {own['shapes']})")


def _training_doc(outputs: str, kept: str) -> str:
    """The parameters both estimators share after their own (for their docstrings' ``{training}``)."""
    return f"""optimizer: ``"lbfgs"`` (the default: optax's L-BFGS with a zoom line search, which takes every
            particle to its perturbed MAP as Algorithm 1 asks; the UCI chapter's optimizer), ``"adam"``,
            ``"adagrad"`` or ``"sgd"``.
        learning_rate: the optimizer's step size (L-BFGS: its first trial step).
        steps: optimizer steps per particle (``loss_curve_`` shows whether they were enough).
        perturb: ``False`` trains the plain ensemble (no perturbation: random starts, one log joint).
        random_state: seed (int), ``numpy.random.RandomState`` or ``None``; the same seed gives the same
            ensemble on the same machine.
        progress: show a progress bar while training.
        model: a network of one's own in place of the fully connected one (then ``hidden_layer_sizes``,
            ``activation``, ``weight_var``, ``bias_var`` and ``scale_by_fan_in`` are not used): a
            :class:`bootens_core.models.Model` -- ``models.mlp``, ``models.Model(apply, shapes, prior_var)``
            or an adapter's result (:mod:`bootens_core.adapters`: Flax, Equinox, any ``apply``) -- taking
            the standardised inputs, ``(n, n_features)``, to {outputs}.
            {kept} work as with the default network;
            :meth:`load` takes the model again."""


# -- regression ----------------------------------------------------------------------------------------------


class BootstrapEnsembleRegressor(RegressorMixin, _Base):
    """A bootstrap ensemble of fully connected networks for regression (Algorithm 1 of the paper).

    Parameters:
        hidden_layer_sizes: widths of the hidden layers (``()``: a Bayesian linear model).
        activation: one of ``relu``, ``tanh``, ``sigmoid``, ``gelu``, ``identity``.
        n_particles: ensemble size ``k``.
        weight_var, bias_var: prior variances of the weights and biases (``N(0, var)`` per parameter).
        scale_by_fan_in: if true (the default), a layer's weight variance is ``weight_var / fan_in``;
            ``False`` gives every weight ``weight_var``, as the paper's UCI networks.
        noise_var: the likelihood variance ``sigma^2`` in units of the standardised labels (a fraction of
            the labels' variance), or ``"auto"``: selected from ``noise_grid`` on held-out MNLL (a
            ``validation_fraction`` of the rows held out, the ensemble trained on the rest for every value),
            then the ensemble refitted on all rows with the selected value.
        noise_grid: the candidate values for ``"auto"`` (standardised units).
        validation_fraction: the share of rows held out for ``"auto"``.
        {training}

    Attributes:
        particles_: the trained particles: one ``{"w", "b"}`` dict per layer, leading axis ``n_particles_``
            (with ``model``: its parameters' pytree, each leaf with that leading axis).
        n_particles_: the particles kept (``n_particles`` less the diverged ones).
        diverged_: ``(n_particles,)`` booleans, the particles that diverged (left out of every prediction).
        noise_var_: the likelihood variance in the labels' units (``sigma^2 y_scale_^2``).
        noise_var_standardised_: the same in standardised units (the selected grid value with ``"auto"``).
        validation_mnll_: with ``"auto"``, the held-out MNLL of every grid value (standardised units), else
            ``None``.
        loss_curve_: ``(steps, n_particles)`` values of every particle's objective ``-log p~`` before each
            step.
        x_mean_: ``(n_features_in_,)`` the inputs' column means.
        x_scale_: ``(n_features_in_,)`` their standard deviations (1 for a constant column).
        y_mean_: the labels' mean.
        y_scale_: the labels' standard deviation (1 for constant labels).
        n_features_in_: the number of input columns.
        feature_names_in_: the input's column names, when fitted on a DataFrame with string column names.
    """

    def __init__(self, hidden_layer_sizes: Sequence[int] = (50,), activation: str = "relu",
                 n_particles: int = 20, weight_var: float = 1.0, bias_var: float = 1.0,
                 scale_by_fan_in: bool = True, noise_var: float | str = "auto",
                 noise_grid: Sequence[float] = NOISE_GRID, validation_fraction: float = 0.2,
                 optimizer: str = "lbfgs", learning_rate: float = 1.0, steps: int = 500,
                 perturb: bool = True, random_state: int | np.random.RandomState | None = None,
                 progress: bool = False, model: Model | None = None):
        self._store_settings(locals())

    def _noise(self) -> float | None:
        if isinstance(self.noise_var, str):
            if self.noise_var != "auto":
                raise ValueError(f"noise_var must be a positive number or 'auto', got {self.noise_var!r}")
            return None
        return _positive("noise_var", self.noise_var)

    def _grid(self) -> tuple[float, ...]:
        grid = self.noise_grid
        if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) or len(grid) == 0:
            raise ValueError(f"noise_grid must be a non-empty sequence of positive numbers, got {grid!r}")
        return tuple(_positive("every noise_grid value", v) for v in grid)

    def _checked(self) -> tuple[dict[str, Any], float | None, tuple[float, ...] | None, float]:
        """Every setting checked as ``fit`` uses it: the shared ones, the noise variance (``None``: "auto"),
        the grid (with "auto") and the validation fraction."""
        s = self._settings()
        noise = self._noise()
        grid = self._grid() if noise is None else None
        fraction = self.validation_fraction
        if noise is None and (isinstance(fraction, bool) or not isinstance(fraction, numbers.Real)
                              or not 0 < fraction < 1):
            raise ValueError(f"validation_fraction must lie in (0, 1), got {fraction!r}")
        return s, noise, grid, fraction

    def _train(self, key: jax.Array, s: dict[str, Any], x: np.ndarray, y: np.ndarray,
               noise_var: float, observed: np.ndarray) -> ensemble.EnsembleResult:
        model = self._model(s, x.shape[1], 1)
        return ensemble.train(key, model, x, y, noise_var=noise_var, n_particles=s["n_particles"],
                              opt=self._opt(s), steps=s["steps"], perturb_labels=s["perturb"],
                              perturb_prior=s["perturb"], observed=observed,
                              on_diverged="report", progress=bool(self.progress))

    def fit(self, X: Any, y: Any) -> BootstrapEnsembleRegressor:
        """Standardise ``X`` (per column) and ``y``, select ``sigma^2`` if ``noise_var="auto"``, train the
        ensemble; returns ``self``."""
        s, noise, grid, fraction = self._checked()
        X, y = validate_data(self, X, y, y_numeric=True, dtype=[np.float64, np.float32])
        n = X.shape[0]
        plural = "s" if n != 1 else ""
        if noise is None and n < (need := math.ceil(2 / min(fraction, 1 - fraction))):
            raise ValueError(f"{type(self).__name__} needs at least {need} samples to hold out 2 validation "
                             f"rows (validation_fraction={fraction}) for noise_var='auto', "
                             f"got {n} sample{plural}")
        if n < 2:
            raise ValueError(f"{type(self).__name__} needs at least 2 samples to standardise the labels, "
                             f"got {n} sample{plural}")
        dtype = jnp.zeros(()).dtype  # JAX's default float
        x = self._fit_x(np.asarray(X, np.float64)).astype(dtype)
        y = np.asarray(y, np.float64)
        self.y_mean_ = float(y.mean())
        scale = float(y.std())
        self.y_scale_ = scale if scale > 0 else 1.0
        ys = ((y - self.y_mean_) / self.y_scale_).astype(dtype)
        if self.model is not None:
            _checked_model(self.model, x, 1, type(self).__name__)
        k_split, k_val, k_fit = jax.random.split(self._key(), 3)
        # Every fit below trains on the same padded rows (the validation rows, and the padding, unobserved):
        # one compiled program for the validation fits and the final fit.
        rows = padded_rows(n)
        x = np.concatenate([x, np.zeros((rows - n, x.shape[1]), dtype)])
        ys = np.concatenate([ys, np.zeros(rows - n, dtype)])
        real = np.arange(rows) < n
        self.validation_mnll_ = None
        if noise is None:
            rng = np.random.default_rng(int(jax.random.randint(k_split, (), 0, np.iinfo(np.int32).max)))
            perm = rng.permutation(n)
            n_val = min(max(1, int(round(fraction * n))), n - 1)
            val = np.sort(perm[:n_val])
            fit_rows = real.copy()
            fit_rows[val] = False
            scores = []
            for nv in grid:
                res = self._train(k_val, s, x, ys, nv, fit_rows)
                ok = ~np.asarray(res.diverged)
                if not ok.any():
                    scores.append(math.inf)
                    continue
                kept = jax.tree.map(lambda a: a[ok], res.params)
                f = np.asarray(ensemble.predict(self._model(s, x.shape[1], 1), kept, x), np.float64)[:, val]
                scores.append(metrics.mixture_mnll(np.asarray(ys[val], np.float64), f, nv))
            if not any(math.isfinite(v) for v in scores):
                raise DivergedParticlesError(
                    f"every particle diverged at every noise_grid value: lower learning_rate (now "
                    f"{self.learning_rate})", np.ones(s["n_particles"], bool), None)
            self.validation_mnll_ = np.asarray(scores)
            noise = grid[int(np.argmin(scores))]
        self.noise_var_standardised_ = float(noise)
        self.noise_var_ = float(noise) * self.y_scale_**2
        self._keep(self._train(k_fit, s, x, ys, noise, real))
        return self

    # -- the predictive --------------------------------------------------------------------------------------

    def predict_particles(self, X: Any) -> np.ndarray:
        """``(n_particles_, n)``: every particle's function at ``X``, in the labels' units."""
        return self.y_mean_ + self.y_scale_ * self._outputs(X)

    def predict(self, X: Any, return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """The predictive mean at ``X``; with ``return_std`` also the predictive standard deviation
        ``sqrt(sigma^2 + var_i f_i(x))`` (the mixture's: noise plus the particles' spread)."""
        f = self._outputs(X)
        mean = self.y_mean_ + self.y_scale_ * f.mean(0)
        if not return_std:
            return mean
        return mean, self.y_scale_ * np.sqrt(self.noise_var_standardised_ + f.var(0))

    def predict_quantiles(self, X: Any, quantiles: Sequence[float] = (0.05, 0.5, 0.95)) -> np.ndarray:
        """``(n, len(quantiles))`` quantiles of the predictive mixture at ``X`` (solved by bisection on its
        CDF to within 1e-9 standardised units)."""
        q = np.asarray(quantiles, np.float64)
        if q.ndim != 1 or q.size == 0 or not np.all((q > 0) & (q < 1)):
            raise ValueError(f"quantiles must be a non-empty sequence of numbers in (0, 1), "
                             f"got {quantiles!r}")
        f = self._outputs(X)
        return self.y_mean_ + self.y_scale_ * _mixture_quantiles(f, self.noise_var_standardised_, q)

    def predict_interval(self, X: Any, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """The central ``level`` interval of the predictive mixture at ``X``: ``(lower, upper)``."""
        level = float(level)
        if not 0 < level < 1:
            raise ValueError(f"level must lie in (0, 1), got {level}")
        qs = self.predict_quantiles(X, ((1 - level) / 2, (1 + level) / 2))
        return qs[:, 0], qs[:, 1]

    def sample_y(self, X: Any, n_samples: int = 1, random_state: int | np.random.RandomState | None = 0,
                 noise: bool = True) -> np.ndarray:
        """``(n, n_samples)`` draws from the predictive at ``X``: each draw is one particle's function (chosen
        uniformly) plus, with ``noise``, independent ``N(0, sigma^2)`` observation noise."""
        n_samples = _count("n_samples", n_samples)
        f = self.predict_particles(X)
        rng = check_random_state(random_state)
        draws = f[rng.randint(f.shape[0], size=n_samples)].T
        if noise:
            draws = draws + math.sqrt(self.noise_var_) * rng.standard_normal(draws.shape)
        return draws

    def _saved_arrays(self) -> dict[str, np.ndarray]:
        return {} if self.validation_mnll_ is None else {"validation_mnll": self.validation_mnll_}

    def _saved_fitted(self) -> dict[str, Any]:
        return {"y_mean": self.y_mean_, "y_scale": self.y_scale_,
                "noise_var_standardised": self.noise_var_standardised_}

    def _restore(self, a: dict[str, np.ndarray], fitted: dict[str, Any]) -> None:
        self.y_mean_, self.y_scale_ = float(fitted["y_mean"]), float(fitted["y_scale"])
        self.noise_var_standardised_ = float(fitted["noise_var_standardised"])
        self.noise_var_ = self.noise_var_standardised_ * self.y_scale_**2
        self.validation_mnll_ = a.get("validation_mnll")


BootstrapEnsembleRegressor.__doc__ = BootstrapEnsembleRegressor.__doc__.replace("{training}", _training_doc(
    "``(n,)`` outputs in the standardised labels' units", "Standardisation, sigma^2 selection, intervals and saving"))


def _mixture_quantiles(f: np.ndarray, noise_var: float, q: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Quantiles ``q`` of ``1/k sum_i N(f_i, noise_var)`` at every point, ``f`` of shape ``(k, n)``: bisection
    on the CDF inside ``[min f - 9 sd, max f + 9 sd]``, which holds every quantile in
    ``[Phi(-9), Phi(9)]``."""
    sd = math.sqrt(noise_var)
    lo = np.broadcast_to((f.min(0) - 9 * sd)[:, None], (f.shape[1], q.size)).copy()
    hi = np.broadcast_to((f.max(0) + 9 * sd)[:, None], (f.shape[1], q.size)).copy()
    iters = max(1, math.ceil(math.log2(float((hi - lo).max()) / tol)))
    for _ in range(iters):
        mid = (lo + hi) / 2
        cdf = ndtr((mid[None] - f[:, :, None]) / sd).mean(0)
        below = cdf < q[None]
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return (lo + hi) / 2


# -- classification ------------------------------------------------------------------------------------------


class BootstrapEnsembleClassifier(ClassifierMixin, _Base):
    """A bootstrap ensemble of fully connected networks for classification (the paper's extension).

    The labels become a heteroscedastic latent regression (the Dirichlet / log-normal transform,
    :func:`bootens_core.classification.transform`) that Algorithm 1 fits with one network output per class;
    a particle predicts ``softmax(f(x) + m)`` and the ensemble the mean of its particles.

    Parameters:
        hidden_layer_sizes: widths of the hidden layers (``()``: a linear model of the latent values).
        activation: one of ``relu``, ``tanh``, ``sigmoid``, ``gelu``, ``identity``.
        n_particles: ensemble size ``k``.
        weight_var, bias_var: prior variances of the weights and biases (``N(0, var)`` per parameter).
        scale_by_fan_in: if true (the default), a layer's weight variance is ``weight_var / fan_in``.
        alpha_eps: the Dirichlet regularisation ``alpha = one_hot(y) + alpha_eps`` (the paper's 0.01; the
            classification chapter measures how it sets the spread of the probabilities). The transform
            gives every label its own variance, so there is no ``noise_var`` to select.
        {training}

    Attributes:
        classes_: the class labels, in the order of ``predict_proba``'s columns.
        offset_: ``(n_classes,)`` the class offsets ``m`` added to the networks' outputs.
        particles_: the trained particles: one ``{"w", "b"}`` dict per layer, leading axis ``n_particles_``
            (with ``model``: its parameters' pytree, each leaf with that leading axis).
        n_particles_: the particles kept (``n_particles`` less the diverged ones).
        diverged_: ``(n_particles,)`` booleans, the particles that diverged (left out of every prediction).
        loss_curve_: ``(steps, n_particles)`` values of every particle's objective before each step.
        x_mean_: ``(n_features_in_,)`` the inputs' column means.
        x_scale_: ``(n_features_in_,)`` their standard deviations (1 for a constant column).
        n_features_in_: the number of input columns.
        feature_names_in_: the input's column names, when fitted on a DataFrame with string column names.
    """

    def __init__(self, hidden_layer_sizes: Sequence[int] = (50,), activation: str = "relu",
                 n_particles: int = 20, weight_var: float = 1.0, bias_var: float = 1.0,
                 scale_by_fan_in: bool = True, alpha_eps: float = classification.ALPHA_EPS,
                 optimizer: str = "lbfgs", learning_rate: float = 1.0, steps: int = 500,
                 perturb: bool = True, random_state: int | np.random.RandomState | None = None,
                 progress: bool = False, model: Model | None = None):
        self._store_settings(locals())

    def _checked(self) -> tuple[dict[str, Any], float]:
        """Every setting checked as ``fit`` uses it: the shared ones and ``alpha_eps``."""
        return self._settings(), _positive("alpha_eps", self.alpha_eps)

    def fit(self, X: Any, y: Any) -> BootstrapEnsembleClassifier:
        """Standardise ``X`` (per column), transform the labels, train the ensemble; returns ``self``."""
        s, alpha_eps = self._checked()
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32])
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if self.classes_.size < 2:
            raise ValueError(f"{type(self).__name__} needs samples of at least 2 classes, got 1 class "
                             f"({self.classes_[0]!r})")
        dtype = jnp.zeros(()).dtype
        x = self._fit_x(np.asarray(X, np.float64)).astype(dtype)
        c = int(self.classes_.size)
        if self.model is not None:
            _checked_model(self.model, x, c, type(self).__name__)
        # padded as the regressor's rows (padded_rows): folds of nearly equal size share one compiled loop
        n = x.shape[0]
        rows = padded_rows(n)
        x = np.concatenate([x, np.zeros((rows - n, x.shape[1]), dtype)])
        codes = np.concatenate([codes, np.zeros(rows - n, codes.dtype)])
        fit = classification.train(self._key(), self._model(s, x.shape[1], c), x, codes,
                                   n_particles=s["n_particles"], opt=self._opt(s), steps=s["steps"],
                                   n_classes=c, alpha_eps=alpha_eps, observed=np.arange(rows) < n,
                                   perturb=s["perturb"], on_diverged="report", progress=bool(self.progress))
        self.offset_ = np.asarray(fit.targets.offset, np.float64)
        self._keep(fit.ensemble)
        return self

    def predict_proba_particles(self, X: Any) -> np.ndarray:
        """``(n_particles_, n, n_classes)``: every particle's class probabilities at ``X``."""
        z = self._outputs(X) + self.offset_
        return np.exp(z - logsumexp(z, axis=-1, keepdims=True))

    def predict_proba(self, X: Any) -> np.ndarray:
        """``(n, n_classes)`` class probabilities: the mean of the particles'."""
        return self.predict_proba_particles(X).mean(0)

    def predict_proba_interval(self, X: Any, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """The central ``level`` band of the particles' probabilities of every class: ``(lower, upper)``,
        each ``(n, n_classes)``."""
        level = float(level)
        if not 0 < level < 1:
            raise ValueError(f"level must lie in (0, 1), got {level}")
        p = self.predict_proba_particles(X)
        lo, hi = np.quantile(p, [(1 - level) / 2, (1 + level) / 2], axis=0)
        return lo, hi

    def predict(self, X: Any) -> np.ndarray:
        """The class of largest mean probability at every row of ``X``."""
        proba = self.predict_proba(X)  # first: it raises NotFittedError before fit
        return self.classes_[np.argmax(proba, axis=1)]

    def _saved_arrays(self) -> dict[str, np.ndarray]:
        return {"offset": self.offset_}

    def _saved_fitted(self) -> dict[str, Any]:
        classes = self.classes_
        if not (np.issubdtype(classes.dtype, np.number) or np.issubdtype(classes.dtype, np.str_)
                or classes.dtype == bool):
            raise TypeError(f"class labels of dtype {classes.dtype} cannot be saved: use numbers or strings")
        return {"classes": classes.tolist(), "classes_dtype": classes.dtype.str}

    def _restore(self, a: dict[str, np.ndarray], fitted: dict[str, Any]) -> None:
        self.classes_ = np.asarray(fitted["classes"], dtype=np.dtype(fitted["classes_dtype"]))
        self.offset_ = a["offset"]


BootstrapEnsembleClassifier.__doc__ = BootstrapEnsembleClassifier.__doc__.replace("{training}", _training_doc(
    "``(n, n_classes)`` latent values, one a class", "Standardisation, probability bands and saving"))


def load(path: str | os.PathLike[str], model: Model | None = None
         ) -> BootstrapEnsembleRegressor | BootstrapEnsembleClassifier:
    """Read an ensemble file whatever estimator saved it (:mod:`bootens_core.persist`); ``model``: the network
    of one's own it was fitted with, if any."""
    kind = persist.read(path).kind
    classes = {c.__name__: c for c in (BootstrapEnsembleRegressor, BootstrapEnsembleClassifier)}
    if kind not in classes:
        raise persist.IncompatibleFileError(f"{path} holds a {kind}, which no estimator here loads")
    return classes[kind].load(path, model=model)
