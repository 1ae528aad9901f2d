"""Networks of one's own as :class:`~bootens_core.models.Model`: any ``apply(params, x)``, Flax (Linen or NNX)
and Equinox modules, each with a Gaussian prior per parameter leaf, ready for Algorithm 1.

A :class:`~bootens_core.models.Model` needs a function ``apply(params, x) -> (n,)`` (or ``(n, C)``), the
shapes of the parameters and a prior variance per leaf. The adapters read the shapes from the module itself
(without computing anything: :func:`jax.eval_shape`), wrap the framework's forward pass and give every leaf
its variance from ``prior_var``:

- a number: the same variance for every parameter;
- a pytree with the parameters' structure and one number per leaf;
- a function ``prior_var(path, shape) -> variance`` of the leaf's path (as :func:`jax.tree_util.keystr`
  writes it, e.g. ``"['Dense_0']['kernel']"``) and shape, e.g. :func:`layer_prior`, which gives weights
  ``weight_var`` (optionally divided by their fan-in) and biases ``bias_var``.

The parameter values a module was built with are not used: Algorithm 1 starts every particle at a prior
draw. Outputs of shape ``(n, 1)`` are flattened to ``(n,)`` (one regression output); ``(n, C)`` stays, one
column per output (e.g. the classes of :mod:`bootens_core.classification`).

Example (Flax Linen)::

    import flax.linen as nn
    net = nn.Sequential([nn.Dense(50), nn.relu, nn.Dense(1)])
    model = adapters.from_flax_linen(net, x[:1], prior_var=adapters.layer_prior(1.0, 1.0, fan_in="flax"))
    res = ensemble.train(key, model, x, y, noise_var=0.1, n_particles=100, opt=opt, steps=2000)

Flax and Equinox are imported only by the adapter that needs them (``pip install ".[flax]"`` or
``".[equinox]"``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .extras import install_hint
from .models import Model, Params

__all__ = ["from_apply", "from_flax_linen", "from_flax_nnx", "from_equinox", "layer_prior"]

PriorSpec = Any  # a number, a pytree of numbers, or a function (path, shape) -> number


def layer_prior(weight_var: float = 1.0, bias_var: float = 1.0, *, fan_in: str | None = None
                ) -> Callable[[str, tuple[int, ...]], float]:
    """Prior variances by leaf: a leaf of two or more dimensions is a weight (``weight_var``), any other a
    bias (``bias_var``).

    ``fan_in`` divides a weight's variance by its fan-in, the number of inputs of a unit: ``"flax"`` for
    kernels laid out ``(..., inputs, outputs)`` (Flax's ``Dense`` and ``Conv``: every axis but the last),
    ``"equinox"`` for weights laid out ``(outputs, inputs, ...)`` (Equinox's and PyTorch's ``Linear`` and
    ``Conv``: every axis but the first); ``None`` keeps ``weight_var``.
    """
    w, b = _variance("weight_var", weight_var), _variance("bias_var", bias_var)
    if fan_in not in (None, "flax", "equinox"):
        raise ValueError(f"fan_in must be None, 'flax' or 'equinox', got {fan_in!r}")

    def prior_var(path: str, shape: tuple[int, ...]) -> float:
        if len(shape) < 2:
            return b
        if fan_in is None:
            return w
        n_in = math.prod(shape[:-1]) if fan_in == "flax" else math.prod(shape[1:])
        return w / max(n_in, 1)

    return prior_var


def _variance(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    return float(v)


def _prior_tree(shapes: Params, prior_var: PriorSpec) -> Params:
    """``prior_var`` (number, pytree or function) as a pytree of floats with the structure of ``shapes``."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    if not leaves:
        raise ValueError("the model has no parameters")
    if callable(prior_var):
        values = [prior_var(jax.tree_util.keystr(path), tuple(leaf.shape)) for path, leaf in leaves]
    elif isinstance(prior_var, numbers.Real) and not isinstance(prior_var, bool):
        values = [prior_var] * len(leaves)
    else:
        try:
            values = treedef.flatten_up_to(prior_var)
        except (ValueError, TypeError) as err:
            raise ValueError(f"prior_var must be a number, a function (path, shape) -> variance, or a pytree "
                             f"with the parameters' structure: {err}") from None
    out = []
    for (path, _), v in zip(leaves, values, strict=True):
        out.append(_variance(f"the prior variance of {jax.tree_util.keystr(path) or 'the parameters'}", v))
    return jax.tree_util.tree_unflatten(treedef, out)


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f"this adapter needs {module.split('.')[0]} ({err}): "
                                  f"{install_hint(extra, [extra])}", name=err.name) from err


def _flat_output(out: jax.Array) -> jax.Array:
    return out[:, 0] if out.ndim == 2 and out.shape[1] == 1 else out


def from_apply(apply: Callable[[Params, jax.Array], jax.Array], params: Params, prior_var: PriorSpec = 1.0, *,
               per_example: bool = False, name: str = "model") -> Model:
    """Any ``apply(params, x)`` as a :class:`Model`.

    Args:
        apply: the forward pass: inputs ``(n, ...)`` to outputs ``(n,)``, ``(n, 1)`` or ``(n, C)``; with
            ``per_example``, one input to one output (``()``, ``(1,)`` or ``(C,)``), mapped over the rows.
        params: a pytree of the parameters, or of ``jax.ShapeDtypeStruct``: only the structure and shapes
            are read.
        prior_var: see the module docstring.
        name: for plots and provenance.
    """
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(tuple(a.shape), jnp.result_type(a.dtype)), params)
    prior = _prior_tree(shapes, prior_var)
    row = jax.vmap(apply, in_axes=(None, 0)) if per_example else apply

    def model_apply(p: Params, x: jax.Array) -> jax.Array:
        return _flat_output(row(p, x))

    return Model(apply=model_apply, shapes=shapes, prior_var=prior, name=name)


def from_flax_linen(module: Any, x: Any, prior_var: PriorSpec = 1.0, *, name: str | None = None) -> Model:
    """A Flax Linen module as a :class:`Model`: parameters are its ``"params"`` collection (read from
    ``module.init`` by :func:`jax.eval_shape` on the example inputs ``x``, without computing); the forward
    pass is ``module.apply({"params": p}, x)``. Modules with other collections (batch statistics) are
    refused."""
    variables = jax.eval_shape(module.init, jax.random.key(0), jnp.asarray(x))
    extra = sorted(set(variables) - {"params"})
    if extra:
        raise ValueError(f"the module has variable collections {extra} besides 'params': only stateless "
                         "modules (no batch statistics) train with Algorithm 1")

    def apply(p: Params, x: jax.Array) -> jax.Array:
        return module.apply({"params": p}, x)

    return from_apply(apply, variables["params"], prior_var, name=name or f"Flax {type(module).__name__}")


def from_flax_nnx(module: Any, prior_var: PriorSpec = 1.0, *, name: str | None = None) -> Model:
    """A Flax NNX module as a :class:`Model`: parameters are its ``nnx.Param`` variables
    (``nnx.split(module, nnx.Param, ...)``); the forward pass merges them back into the module's graph and
    calls it, ``nnx.merge(graphdef, p, rest)(x)``. The module is not changed."""
    nnx = _require("flax.nnx", "flax")
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)

    def apply(p: Params, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, p, rest)(x)

    return from_apply(apply, params, prior_var, name=name or f"Flax NNX {type(module).__name__}")


def from_equinox(module: Any, prior_var: PriorSpec = 1.0, *, per_example: bool = True,
                 name: str | None = None) -> Model:
    """An Equinox module as a :class:`Model`: parameters are its floating-point arrays
    (``eqx.partition(module, eqx.is_inexact_array)``), the rest is fixed; the forward pass is
    ``eqx.combine(p, rest)(x)``, mapped over the rows (Equinox's layers take one example; pass
    ``per_example=False`` for a module that takes a batch)."""
    eqx = _require("equinox", "equinox")
    params, static = eqx.partition(module, eqx.is_inexact_array)

    def apply(p: Params, x: jax.Array) -> jax.Array:
        return eqx.combine(p, static)(x)

    return from_apply(apply, params, prior_var, per_example=per_example,
                      name=name or f"Equinox {type(module).__name__}")
