"""Shared pieces of the samplers: the result type, argument checks, the model's flat log joint and prior start."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..checks import check_data
from ..models import Model, Params, float_dtype, template, zeros
from ..perturb import log_joint

__all__ = ["MCMCResult", "log_density_fn", "prior_starts", "unravel_draws"]

class MCMCResult(NamedTuple):
    """What :func:`metropolis_model` and :func:`nuts_model` return.

    Attributes:
        params: kept draws, a pytree like the model's parameters whose leaves have leading axes
            ``(n_chains, n_draws)``.
        log_density: ``(n_chains, n_draws)`` unnormalised log joint ``log p(D, theta)`` of every kept draw.
        accept_rate: ``(n_chains,)``: for MH the acceptance rate over the post-burn-in steps; for NUTS the
            mean acceptance probability of the sampling phase.
        info: JSON-able facts about the sampler. MH: ``proposal_var``, ``burn_in``, ``thin``,
            ``n_steps_per_chain``, ``accept_rate_burn_in`` (per chain; ``None`` entries without burn-in).
            NUTS: ``step_size``, ``n_divergent``, ``mean_num_steps`` (leapfrog steps per draw), each per chain,
            and ``max_tree_depth``, ``target_accept``, ``n_warmup``.
        sampler: one-line description of the sampler and its settings.
    """

    params: Params
    log_density: np.ndarray
    accept_rate: np.ndarray
    info: dict
    sampler: str


# --------------------------------------------------------------------------------------------- validation


def _count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int ``>= minimum``, else a ValueError naming ``name``."""
    integral = isinstance(value, int | np.integer) or (
        isinstance(value, float | np.floating) and float(value).is_integer()
    )
    if isinstance(value, bool) or not integral:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {v}")
    return v


def _positive(name: str, value: Any) -> float:
    v = float(value)
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return v


def _check_initial(log_densities: np.ndarray) -> None:
    bad = np.nonzero(~np.isfinite(log_densities))[0]
    if bad.size:
        raise ValueError(
            f"log density is not finite at the initial state of chain(s) {bad[:10].tolist()}"
            f"{'...' if bad.size > 10 else ''} (values {log_densities[bad[:3]].tolist()}); "
            "start those chains where the log density is finite"
        )


def _leaf_specs(model: Model) -> tuple[list[tuple[int, ...]], Any]:
    """Leaf shapes of one parameter draw (in :func:`models.ravel` order) and the tree structure."""
    leaves, treedef = jax.tree.flatten(template(model))
    return [leaf.shape for leaf in leaves], treedef


def _prepare(x: Any, y: Any, noise_var: Any, dtype: Any):
    x, y = check_data(x, y, noise_var)
    return x.astype(dtype), y.astype(dtype), jnp.asarray(noise_var, dtype)


def _flat_init(key: jax.Array, model: Model, init: Params | None, n_chains: int, dtype: Any) -> jax.Array:
    """Starting points ``(n_chains, m)``: independent prior draws, or the given pytree after checking it."""
    shapes, treedef = _leaf_specs(model)
    if init is None:
        # theta_0 = prior_sd * N(0, I_m): one normal draw for all leaves (a sampler per leaf, as
        # models.prior_sample does, costs one XLA compilation per leaf shape).
        sd = np.concatenate(
            [np.full(math.prod(s), math.sqrt(v)) for s, v in zip(shapes, treedef.flatten_up_to(model.prior_var), strict=True)]
        )
        return jnp.asarray(sd, dtype) * jax.random.normal(key, (n_chains, sd.size), dtype)
    try:
        leaves = treedef.flatten_up_to(init)
    except (ValueError, TypeError) as err:
        raise ValueError(f"init must be a parameter pytree like {treedef} with a leading n_chains axis: {err}") from None
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(template(model, dtype))[0]]
    for path, leaf, shape in zip(paths, leaves, shapes, strict=True):
        if tuple(np.shape(leaf)) != (n_chains, *shape):
            raise ValueError(
                f"init leaf {path or '<root>'} has shape {tuple(np.shape(leaf))}, expected (n_chains, ...) = "
                f"{(n_chains, *shape)}"
            )
    return jnp.asarray(np.concatenate([np.asarray(leaf).reshape(n_chains, -1) for leaf in leaves], axis=1), dtype)


# ---------------------------------------------------------------------------------------- log density


def log_density_fn(
    model: Model, x: Any, y: Any, noise_var: float | Any
) -> tuple[Callable[[jax.Array], jax.Array], Callable[[jax.Array], Params]]:
    """The unnormalised log posterior of ``model`` on ``(x, y)`` as a function of one flat parameter vector.

    Args:
        model: the model and its prior.
        x, y: training inputs and labels (their float dtype, float64 for integer labels, is the dtype of the
            parameters).
        noise_var: likelihood variance ``sigma^2``, scalar or one per point.

    Returns:
        ``(log_density, unravel)``: ``log_density(theta) = log p(D, theta)`` (:func:`perturb.log_joint`) for a
        vector ``theta`` of length ``m``, and ``unravel(theta)`` -> the parameter pytree.
    """
    x, y = jnp.asarray(x), jnp.asarray(y)
    dtype = y.dtype if jnp.issubdtype(y.dtype, jnp.floating) else float_dtype()
    x = x.astype(dtype) if not jnp.issubdtype(x.dtype, jnp.floating) else x
    y = y.astype(dtype)
    noise_var = jnp.asarray(noise_var, dtype)
    _, unravel = ravel_pytree(zeros(model, dtype))

    def log_density(theta: jax.Array) -> jax.Array:
        return log_joint(model, unravel(theta), x, y, noise_var)

    return log_density, unravel


# ------------------------------------------------------------------------------------ Metropolis-Hastings


def prior_starts(key: jax.Array, model: Model, n_chains: int, dtype: Any = None) -> jax.Array:
    """``(n_chains, m)`` independent prior draws of ``model``'s parameters as flat vectors (in
    :func:`models.ravel` order): the starting points the samplers use when no ``init`` is given, for a
    sampler of one's own log density (e.g. :func:`nuts` on a classification likelihood). ``dtype`` as
    :func:`~bootens_core.models.float_dtype`."""
    return _flat_init(key, model, None, n_chains, float_dtype(dtype))


def unravel_draws(model: Model, flat: Any) -> Params:
    """``(C, n, m)`` flat draws -> a pytree with numpy leaves of leading axes ``(C, n)`` (host-side inverse of
    :func:`models.ravel`: leaves in tree order, each raveled in C order)."""
    flat = np.asarray(flat)
    shapes, treedef = _leaf_specs(model)
    sizes = [math.prod(s) for s in shapes]
    parts = np.split(flat, np.cumsum(sizes)[:-1], axis=-1)
    return jax.tree.unflatten(treedef, [p.reshape(*flat.shape[:2], *s) for p, s in zip(parts, shapes, strict=True)])
