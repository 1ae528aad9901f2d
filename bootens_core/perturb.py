"""Parametric bootstrap (Section 3): perturbed labels, prior anchors, and the log joints.

For a Gaussian likelihood ``N(y; f(x; theta), sigma^2)`` and prior ``N(0, alpha^2)``, a particle sees

    log p~(D, theta) = log N(y~; f(x; theta), sigma^2) + log N(theta; theta~, alpha^2)        (Eq. logp_perturbed)

with ``y~ = y + N(0, sigma^2)`` and ``theta~ ~ N(0, alpha^2)``. ``sigma^2`` may be a scalar or one variance
per data point (the heteroscedastic latent regression of the classification extension).

A data point whose variance is ``+inf`` is *unobserved*: ``N(y; f, sigma^2)`` carries no information about
``f`` as ``sigma^2 -> inf``, so the point adds nothing to the log likelihood (its constant dropped) and its
label is not perturbed. Rows padded this way leave every particle's objective, its gradient and the other
rows' replicates as they are without them, so one compiled program serves every row count up to the padded
one (:func:`bootens_core.ensemble.train`'s ``observed``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .models import Model, Params, prior_logpdf, prior_sample

__all__ = [
    "Perturbation",
    "particle_keys",
    "sample",
    "gaussian_loglik",
    "log_joint",
    "perturbed_log_joint",
]


class Perturbation(NamedTuple):
    """The random replicate one particle optimises (a leading particle axis when batched).

    Attributes:
        y: perturbed labels ``y~``, shape ``(n,)`` (``(k, n)`` batched).
        anchor: prior sample ``theta~`` the particle's prior is centred on (a parameter pytree).
    """

    y: jax.Array
    anchor: Params


def particle_keys(key: jax.Array, n: int) -> jax.Array:
    """The keys of particles ``0 .. n-1``: particle ``i``'s is ``fold_in(key, i)``, whatever ``n`` is, so the
    first ``k`` particles of a larger ensemble are the ``k``-particle ensemble (and padding or sharding the
    particle axis cannot change them)."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(int(n), dtype=jnp.uint32))


def sample(key: jax.Array, model: Model, y: jax.Array, noise_var: float | jax.Array, n: int) -> Perturbation:
    """Draw ``n`` replicates: ``y~ = y + sqrt(noise_var) * N(0, 1)`` and ``theta~`` from the prior.

    Replicate ``i`` comes from particle ``i``'s own key (:func:`particle_keys`): the first ``k`` of ``n``
    replicates are the ``k`` drawn alone."""
    y = jnp.asarray(y)

    def one(k: jax.Array) -> tuple[jax.Array, Params]:
        k_labels, k_anchor = jax.random.split(k)
        return jax.random.normal(k_labels, y.shape, y.dtype), prior_sample(k_anchor, model, dtype=y.dtype)

    noise, anchor = jax.vmap(one)(particle_keys(key, n))
    scale = jnp.sqrt(jnp.asarray(noise_var, y.dtype))
    # an unobserved point (variance +inf) keeps its label: inf * N(0, 1) would make it inf or NaN
    y_tilde = y[None] + jnp.where(jnp.isinf(scale), 0, scale * noise)
    return Perturbation(y=y_tilde, anchor=anchor)


def gaussian_loglik(f: jax.Array, y: jax.Array, noise_var: float | jax.Array) -> jax.Array:
    """``sum_i log N(y_i; f_i, noise_var_i)`` over the observed points (an unobserved one, ``noise_var_i =
    +inf``, adds 0, and no gradient)."""
    var = jnp.broadcast_to(jnp.asarray(noise_var, f.dtype), f.shape)
    terms = (y - f) ** 2 / var + jnp.log(2 * jnp.pi * var)
    return -0.5 * jnp.sum(jnp.where(jnp.isinf(var), 0, terms))


def log_joint(model: Model, params: Params, x: jax.Array, y: jax.Array, noise_var: float | jax.Array) -> jax.Array:
    """The unperturbed log joint ``log p(D, theta) = log p(y | x, theta) + log p(theta)``."""
    return gaussian_loglik(model.apply(params, x), y, noise_var) + prior_logpdf(model, params)


def perturbed_log_joint(
    model: Model, params: Params, x: jax.Array, pert: Perturbation, noise_var: float | jax.Array
) -> jax.Array:
    """The perturbed log joint ``log p(y~ | x, theta) + log N(theta; theta~, alpha^2)`` of one particle."""
    return gaussian_loglik(model.apply(params, x), pert.y, noise_var) + prior_logpdf(model, params, pert.anchor)
