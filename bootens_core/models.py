"""Model functions ``f(params, x) -> (n,)`` with diagonal Gaussian priors over their parameters.

A :class:`Model` bundles the function, a template of its parameters (a pytree of shapes) and the prior
variance of every leaf (a pytree of scalars with the same structure). Priors are ``N(0, var)`` per leaf,
so every model here is a "Gaussian prior and likelihood" model in the sense of the paper's Theorem 2.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = [
    "Params",
    "Model",
    "ACTIVATIONS",
    "mlp",
    "linear_in_features",
    "given_features",
    "trig_features",
    "scalar_linear",
    "toy_relu",
    "float_dtype",
    "template",
    "program_key",
    "zeros",
    "prior_sample",
    "prior_logpdf",
    "n_params",
    "ravel",
    "predict",
]

Params = Any  # a pytree of arrays

#: The activations :func:`mlp` takes, by name.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "gelu": jax.nn.gelu,
    "identity": lambda z: z,
}


class Model(NamedTuple):
    """A regression model with a diagonal Gaussian prior.

    Attributes:
        apply: ``apply(params, x) -> (n,)`` latent function values at the ``n`` inputs.
        shapes: pytree with the structure of the parameters whose leaves give each parameter's shape: shape
            tuples, ``jax.ShapeDtypeStruct`` or arrays (only their shapes count); :func:`template` reads it.
        prior_var: pytree with the structure of the parameters whose leaves are scalar prior variances.
        features: for models linear in their parameters, ``features(x) -> (n, D)`` with
            ``apply({"w": w}, x) == features(x) @ w``; ``None`` otherwise.
        name: a short description, for plots and provenance.
        signature: a hashable description of the function ``apply`` computes (the constructors here set one,
            e.g. ``("mlp", 3, (50,), "relu", 1)``): models with equal signatures, shapes and prior variances
            share compiled programs (:func:`program_key`). ``None`` (a model of one's own): ``apply`` itself
            identifies the program, so the same model object reuses compilations.
    """

    apply: Callable[[Params, jax.Array], jax.Array]
    shapes: Params
    prior_var: Params
    features: Callable[[jax.Array], jax.Array] | None = None
    name: str = "model"
    signature: Any = None


def float_dtype(dtype: Any = None) -> jnp.dtype:
    """The float dtype to compute in: ``dtype``, or with ``None`` JAX's default float (float64 when JAX's
    64-bit mode is on, float32 otherwise). The package never switches that mode itself; turn it on with
    ``jax.config.update("jax_enable_x64", True)`` before the first array, or scope it with ``jax.enable_x64()``.

    Raises ``ValueError`` for a dtype that is not a float, and for float64 while the 64-bit mode is off (JAX
    would otherwise compute in float32 without a word).
    """
    if dtype is None:
        return jnp.dtype(jax.dtypes.canonicalize_dtype(jnp.float64))
    try:
        d = jnp.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"dtype {dtype!r} is not a dtype") from e
    if not jnp.issubdtype(d, jnp.floating):
        raise ValueError(f"dtype {d} is not a float dtype")
    if jax.dtypes.canonicalize_dtype(d) != d:
        raise ValueError(
            f"dtype {d} needs JAX's 64-bit mode, which is off: call jax.config.update('jax_enable_x64', True) "
            "before creating arrays (or compute inside `with jax.enable_x64():`), or pass a 32-bit dtype"
        )
    return d


def template(model: Model, dtype: Any = None) -> Params:
    """The parameters of ``model`` as a pytree of ``jax.ShapeDtypeStruct`` leaves (the structure and shapes of
    one draw, no data): what ``jax.eval_shape``, ``jax.tree.map(jnp.zeros_like, ...)`` or ``ravel_pytree`` of
    zeros need. Leaves of ``model.shapes`` may be shape tuples, ``ShapeDtypeStruct`` or arrays; ``dtype`` sets
    every leaf's dtype (default: JAX's default float dtype; see :func:`float_dtype`).

    Raises ``ValueError`` naming the leaf whose shape is not a tuple of non-negative integers.
    """
    dtype = float_dtype(dtype)

    def leaf(path: Any, s: Any) -> jax.ShapeDtypeStruct:
        shape = getattr(s, "shape", s)
        if not (isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise ValueError(
                f"model.shapes leaf {jax.tree_util.keystr(path) or '<root>'} is {s!r}: give a shape tuple of "
                "non-negative integers, a jax.ShapeDtypeStruct or an array"
            )
        return jax.ShapeDtypeStruct(shape, dtype)

    def is_leaf(s: Any) -> bool:
        return hasattr(s, "shape") or (isinstance(s, tuple) and all(isinstance(d, int) for d in s))

    return jax.tree_util.tree_map_with_path(leaf, model.shapes, is_leaf=is_leaf)


def program_key(model: Model) -> tuple:
    """What decides the programs compiled for ``model``: its signature (else its ``apply`` function), the
    structure and shapes of its parameters, and its prior variances (compiled in as constants). Two models
    with equal keys compute the same thing, so the library's caches of compiled functions key on this rather
    than on the model object."""
    leaves, treedef = jax.tree.flatten(template(model))
    ident = model.apply if model.signature is None else model.signature
    return (ident, str(treedef), tuple(leaf.shape for leaf in leaves), repr(model.prior_var))


def mlp(
    in_dim: int,
    hidden: Sequence[int] = (50,),
    activation: str = "relu",
    *,
    out_dim: int = 1,
    weight_var: float = 1.0,
    bias_var: float = 1.0,
    scale_by_fan_in: bool = False,
) -> Model:
    """A fully connected network ``in_dim -> hidden... -> out_dim``.

    Args:
        in_dim: input dimension; inputs are ``(n, in_dim)`` (or ``(n,)`` when ``in_dim == 1``).
        hidden: widths of the hidden layers (``()`` gives a linear model).
        activation: one of :data:`ACTIVATIONS`.
        out_dim: output dimension; ``apply`` returns ``(n,)`` when it is 1, else ``(n, out_dim)``.
        weight_var, bias_var: prior variances alpha_w^2, alpha_b^2.
        scale_by_fan_in: if true, the weight variance of a layer is ``weight_var / fan_in`` (still a
            diagonal Gaussian prior, with a different variance per layer).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}: choose one of {sorted(ACTIVATIONS)}")
    widths = [in_dim, *hidden, out_dim]
    if any(int(w) < 1 for w in widths):
        raise ValueError(f"layer widths must be positive, got {widths}")
    act = ACTIVATIONS[activation]
    shapes = [{"w": (a, b), "b": (b,)} for a, b in zip(widths[:-1], widths[1:], strict=True)]
    prior_var = [
        {"w": float(weight_var / a if scale_by_fan_in else weight_var), "b": float(bias_var)}
        for a in widths[:-1]
    ]

    def apply(params: Params, x: jax.Array) -> jax.Array:
        h = x.reshape(x.shape[0], -1) if x.ndim != 2 else x
        for layer in params[:-1]:
            h = act(h @ layer["w"] + layer["b"])
        out = h @ params[-1]["w"] + params[-1]["b"]
        return out[:, 0] if out_dim == 1 else out

    name = f"MLP {in_dim}-{'-'.join(map(str, hidden))}{'-' if hidden else ''}{out_dim} ({activation})"
    signature = ("mlp", int(in_dim), tuple(int(w) for w in hidden), activation, int(out_dim))
    return Model(apply=apply, shapes=shapes, prior_var=prior_var, name=name, signature=signature)


def linear_in_features(
    features: Callable[[jax.Array], jax.Array], n_features: int, prior_var: float = 1.0, name: str = "linear",
    signature: Any = None,
) -> Model:
    """A Bayesian linear model ``f(x) = features(x) @ w`` with ``w ~ N(0, prior_var I)``; ``signature``
    describes ``features`` (see :class:`Model`; ``None``: the model object identifies it)."""

    def apply(params: Params, x: jax.Array) -> jax.Array:
        return features(x) @ params["w"]

    return Model(
        apply=apply,
        shapes={"w": (n_features,)},
        prior_var={"w": float(prior_var)},
        features=features,
        name=name,
        signature=None if signature is None else ("linear_in_features", signature),
    )


def given_features(model: Model) -> Model:
    """``model`` (linear in its parameters: ``model.features`` set) as a function of its features: the returned
    model's ``apply({"w": w}, phi)`` is ``phi @ w`` for ``phi = model.features(x)``, with the same parameters
    and prior. Training on ``model.features(x)`` with it computes the features once instead of at every step
    (the ensemble drivers do so); its compiled programs depend only on the shapes and the prior, not on which
    features were computed."""
    if model.features is None:
        raise ValueError(f"model {model.name!r} is not linear in its parameters (its features are None)")

    def apply(params: Params, phi: jax.Array) -> jax.Array:
        return phi @ params["w"]

    return Model(apply=apply, shapes=model.shapes, prior_var=model.prior_var, features=None,
                 name=f"{model.name}, on given features", signature="given_features")


def trig_features(omega: jax.Array, prior_var: float = 1.0) -> Model:
    """The paper's trigonometric-feature model ``f(x) = w^T cos(omega x - pi/4)`` for 1-D inputs ``x``."""
    omega = jnp.asarray(omega)

    def features(x: jax.Array) -> jax.Array:
        return jnp.cos(jnp.reshape(x, (-1, 1)) * omega[None, :] - jnp.pi / 4)

    host = np.asarray(omega)
    digest = hashlib.sha256(host.tobytes()).hexdigest()
    return linear_in_features(features, omega.shape[0], prior_var, name=f"trig features (D={omega.shape[0]})",
                              signature=("trig", host.dtype.name, host.shape, digest))


def scalar_linear(prior_var: float = 1.0) -> Model:
    """The one-weight model ``f(x) = w x`` of the paper's Figure 1."""
    return linear_in_features(lambda x: jnp.reshape(x, (-1, 1)), 1, prior_var, name="f(x) = w x",
                              signature="x")


def toy_relu(prior_var: float = 1.0) -> Model:
    """The paper's toy network ``f(x) = ReLU(w1 x) + ReLU(w2 x)`` with weights ``w = (w1, w2)``."""

    def apply(params: Params, x: jax.Array) -> jax.Array:
        x = jnp.reshape(x, (-1,))
        return jax.nn.relu(params["w"][0] * x) + jax.nn.relu(params["w"][1] * x)

    return Model(apply=apply, shapes={"w": (2,)}, prior_var={"w": float(prior_var)}, name="ReLU(w1 x)+ReLU(w2 x)",
                 signature=("toy_relu",))


def zeros(model: Model, dtype: Any = None) -> Params:
    """Parameters of ``model`` set to zero (``ravel(zeros(model, dtype))[1]`` unflattens vectors of its size)."""
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), template(model, dtype))


def prior_sample(key: jax.Array, model: Model, n: int | None = None, dtype: Any = None) -> Params:
    """Draw parameters from the prior; with ``n``, a leading axis of ``n`` independent draws (``dtype``: see
    :func:`float_dtype`)."""
    dtype = float_dtype(dtype)
    leaves, treedef = jax.tree.flatten(template(model, dtype))
    variances = treedef.flatten_up_to(model.prior_var)
    keys = jax.random.split(key, len(leaves))
    lead = () if n is None else (n,)
    draws = [
        jnp.sqrt(jnp.asarray(v, dtype)) * jax.random.normal(k, lead + leaf.shape, dtype)
        for k, leaf, v in zip(keys, leaves, variances, strict=True)
    ]
    return jax.tree.unflatten(treedef, draws)


def prior_logpdf(model: Model, params: Params, mean: Params | None = None) -> jax.Array:
    """``log N(params; mean, diag(prior_var))`` summed over all parameters (``mean`` defaults to 0)."""
    leaves, treedef = jax.tree.flatten(params)
    variances = treedef.flatten_up_to(model.prior_var)
    means = [None] * len(leaves) if mean is None else treedef.flatten_up_to(mean)
    total = jnp.zeros((), dtype=leaves[0].dtype)
    for leaf, var, mu in zip(leaves, variances, means, strict=True):
        diff = leaf if mu is None else leaf - mu
        var = jnp.asarray(var, leaf.dtype)
        total = total - 0.5 * jnp.sum(diff**2) / var - 0.5 * leaf.size * jnp.log(2 * jnp.pi * var)
    return total


def n_params(model: Model) -> int:
    """The number ``m`` of scalar parameters."""
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(template(model)))


def ravel(params: Params) -> tuple[jax.Array, Callable[[jax.Array], Params]]:
    """Flatten one parameter pytree to a vector ``theta in R^m``; returns it and the inverse map."""
    return ravel_pytree(params)


def predict(model: Model, params: Params, x: jax.Array) -> jax.Array:
    """Latent predictions of every particle: params with a leading particle axis -> ``(k, n)``."""
    return jax.vmap(model.apply, in_axes=(0, None))(params, x)
