"""Densities of two-parameter models on a grid: the exact posterior, KDEs of samples, and their KL.

For a model with two parameters (the paper's toy ReLU network) the posterior can be normalised by
numerical integration on a grid, so it needs no MCMC. The paper's own KL curve uses bivariate KDEs
(``scipy.stats.gaussian_kde``) and ``scipy.integrate``; :func:`kl` integrates ``q log(q / p)`` with
Simpson's rule (``scipy.integrate.simpson``) on the same grid. Both densities are renormalised on the grid,
so the KL is that of the two densities truncated to the grid's square (stated in every chapter using it).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy import integrate, special, stats

from ..models import Model
from ..perturb import log_joint

__all__ = ["Grid2D", "grid", "grid_log_posterior", "kde_log_density", "normalise", "kl"]


class Grid2D(NamedTuple):
    """A square grid over two parameters: axes ``a`` (first parameter) and ``b`` (second), ``(n,)`` each."""

    a: np.ndarray
    b: np.ndarray

    @property
    def points(self) -> np.ndarray:
        """``(n*n, 2)`` grid points, first parameter varying slowest (``ij`` indexing)."""
        aa, bb = np.meshgrid(self.a, self.b, indexing="ij")
        return np.stack([aa.ravel(), bb.ravel()], axis=1)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.a.size, self.b.size)


def grid(half_width: float, n: int) -> Grid2D:
    """A grid of ``n x n`` points on ``[-half_width, half_width]^2``; ``n`` odd (Simpson's rule)."""
    if n < 5 or n % 2 == 0:
        raise ValueError(f"grid points must be odd and at least 5 (Simpson's rule), got {n}")
    if not half_width > 0:
        raise ValueError(f"grid half width must be positive, got {half_width}")
    axis = np.linspace(-half_width, half_width, n)
    return Grid2D(axis, axis.copy())


def _integrate(values: np.ndarray, g: Grid2D) -> float:
    return float(integrate.simpson(integrate.simpson(values, x=g.b, axis=1), x=g.a))


def normalise(log_density: np.ndarray, g: Grid2D) -> np.ndarray:
    """Shift a ``(n, n)`` unnormalised log density so that its density integrates to 1 on the grid."""
    log_density = np.asarray(log_density, np.float64)
    if log_density.shape != g.shape:
        raise ValueError(f"log density shape {log_density.shape} does not match the grid {g.shape}")
    top = np.max(log_density)
    if not np.isfinite(top):
        raise ValueError("log density is not finite anywhere on the grid")
    z = _integrate(np.exp(log_density - top), g)
    return log_density - top - np.log(z)


def grid_log_posterior(model: Model, x: jax.Array, y: jax.Array, noise_var: float, g: Grid2D) -> np.ndarray:
    """The exact log posterior ``log p(theta | D)`` of a two-parameter model on the grid, normalised there.

    The model's parameters must ravel to two numbers (e.g. ``{"w": (2,)}``); the first is the grid's ``a``.
    """
    from ..models import n_params, prior_sample, ravel

    if n_params(model) != 2:
        raise ValueError(f"grid posterior needs a model with 2 parameters, this one has {n_params(model)}")
    _, unravel = ravel(prior_sample(jax.random.key(0), model))
    x = jnp.asarray(x)
    y = jnp.asarray(y)

    @jax.jit
    def logp(points: jax.Array) -> jax.Array:
        return jax.vmap(lambda t: log_joint(model, unravel(t), x, y, noise_var))(points)

    values = np.asarray(logp(jnp.asarray(g.points))).reshape(g.shape)
    return normalise(values, g)


def kde_log_density(samples: np.ndarray, g: Grid2D, bw_method: str | float | None = None) -> np.ndarray:
    """Log density of ``scipy.stats.gaussian_kde(samples)`` (Scott's rule by default) on the grid, normalised there.

    Args:
        samples: ``(k, 2)`` draws; ``k`` must exceed 2 and the draws must not all lie on a line.
    """
    samples = np.asarray(samples, np.float64)
    if samples.ndim != 2 or samples.shape[1] != 2:
        raise ValueError(f"samples must have shape (k, 2), got {samples.shape}")
    if not np.all(np.isfinite(samples)):
        raise ValueError("samples contain NaN or Inf (diverged particles?)")
    if samples.shape[0] < 3:
        raise ValueError(f"a bivariate KDE needs at least 3 samples, got {samples.shape[0]}")
    try:
        kde = stats.gaussian_kde(samples.T, bw_method=bw_method)
    except np.linalg.LinAlgError as err:
        raise ValueError("the samples are degenerate (collinear): their KDE has a singular covariance") from err
    return normalise(kde.logpdf(g.points.T).reshape(g.shape), g)


def kl(log_q: np.ndarray, log_p: np.ndarray, g: Grid2D) -> float:
    """``KL(q || p) = integral q log(q / p)`` of two grid log densities, by Simpson's rule on the grid."""
    log_q = np.asarray(log_q, np.float64)
    log_p = np.asarray(log_p, np.float64)
    if log_q.shape != g.shape or log_p.shape != g.shape:
        raise ValueError(f"log densities {log_q.shape}, {log_p.shape} do not match the grid {g.shape}")
    q = np.exp(log_q)
    integrand = special.xlogy(q, q) - q * log_p  # q log q - q log p, with 0 log 0 = 0
    return _integrate(integrand, g)
