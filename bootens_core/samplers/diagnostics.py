"""Convergence diagnostics through ArviZ: R-hat and ESS, per coordinate and on predictive functions."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..models import Model
from ._common import MCMCResult

__all__ = ["ess", "predictive_diagnostics", "rhat"]


def _arviz():
    """Import ArviZ without its once-a-day FutureWarning (it would make notebook outputs vary by day)."""
    warnings.filterwarnings("ignore", message=r"\s*ArviZ is undergoing a major refactor", category=FutureWarning)
    import arviz

    return arviz


def _per_element(draws: Any, fn: Callable[[np.ndarray], float]) -> np.ndarray:
    arr = np.asarray(draws, np.float64)
    if arr.ndim < 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"draws must have shape (n_chains, n_draws, *event), got {arr.shape}")
    event = arr.shape[2:]
    flat = arr.reshape(arr.shape[0], arr.shape[1], -1)
    out = np.array([fn(flat[:, :, j]) for j in range(flat.shape[2])], np.float64)
    return out.reshape(event)


def rhat(draws: Any) -> np.ndarray:
    """ArviZ's rank-normalised split R-hat of every coordinate.

    Args:
        draws: ``(n_chains, n_draws, *event)``.

    Returns:
        ``event``-shaped array (NaN where it is undefined, e.g. a coordinate constant over all draws).
    """
    az = _arviz()
    with np.errstate(divide="ignore", invalid="ignore"):
        return _per_element(draws, lambda a: float(az.rhat(a, method="rank")))


def ess(draws: Any, kind: str = "bulk") -> np.ndarray:
    """ArviZ's effective sample size of every coordinate.

    Args:
        draws: ``(n_chains, n_draws, *event)``.
        kind: ``"bulk"`` (rank-normalised), ``"tail"`` (of the 5% and 95% quantiles), or ``"mean"`` (ESS of the
            plain mean, the one that sets its Monte-Carlo standard error).

    Returns:
        ``event``-shaped array.
    """
    if kind not in ("bulk", "tail", "mean"):
        raise ValueError(f"kind must be 'bulk', 'tail' or 'mean', got {kind!r}")
    az = _arviz()
    with np.errstate(divide="ignore", invalid="ignore"):
        return _per_element(draws, lambda a: float(az.ess(a, method=kind)))


def predictive_diagnostics(model: Model, result: MCMCResult, x_grid: Any) -> dict:
    """R-hat and ESS of the predictive function values ``f(x_grid)`` of the kept draws.

    The paper reports R-hat "on the predictive models": the convergence of the functions the samples
    define, which is what its comparisons use (parameters of a network are not identifiable).

    Args:
        model: the model the draws belong to.
        result: from :func:`metropolis_model` or :func:`nuts_model`.
        x_grid: ``(g,)`` or ``(g, d)`` inputs.

    Returns:
        ``{"rhat_max", "rhat_mean", "ess_bulk_min", "ess_tail_min", "ess_bulk_median", "n_chains",
        "n_draws"}`` as Python floats/ints; aggregates skip grid points where a statistic is undefined (a
        function value constant over all draws), and are NaN if it is undefined everywhere.
    """
    leaves = jax.tree.leaves(result.params)
    n_chains, n_draws = leaves[0].shape[:2]
    flat = jax.tree.map(lambda p: jnp.asarray(p).reshape(n_chains * n_draws, *p.shape[2:]), result.params)
    x_grid = jnp.asarray(x_grid, leaves[0].dtype)
    f = jax.jit(jax.vmap(model.apply, in_axes=(0, None)))(flat, x_grid)
    f = np.asarray(f).reshape(n_chains, n_draws, -1)
    r, eb, et = rhat(f), ess(f, "bulk"), ess(f, "tail")

    def agg(fn: Callable[[np.ndarray], Any], v: np.ndarray) -> float:
        v = v[np.isfinite(v)]
        return float(fn(v)) if v.size else float("nan")

    return {
        "rhat_max": agg(np.max, r),
        "rhat_mean": agg(np.mean, r),
        "ess_bulk_min": agg(np.min, eb),
        "ess_tail_min": agg(np.min, et),
        "ess_bulk_median": agg(np.median, eb),
        "n_chains": int(n_chains),
        "n_draws": int(n_draws),
    }
