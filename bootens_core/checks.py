"""Validation of what a user hands the library, shared by the ensemble, the samplers and the baselines: one
clear ``ValueError`` naming the problem (shapes, NaN/Inf, variances, a model's outputs), and the error raised
when particles or chains diverge.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .models import Model, template

__all__ = ["DivergedParticlesError", "check_finite", "check_data", "check_observed", "model_outputs"]


class DivergedParticlesError(RuntimeError):
    """Raised when particles end with NaN/Inf parameters; ``.diverged`` is the boolean mask."""

    def __init__(self, message: str, diverged: np.ndarray, first_step: int | None):
        super().__init__(message)
        self.diverged = diverged
        self.first_step = first_step


def check_finite(name: str, arr: np.ndarray) -> None:
    """Raise ``ValueError`` naming ``name`` if ``arr`` is not numeric or holds NaN/Inf (with the first rows)."""
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    bad = ~np.isfinite(arr)
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])
        raise ValueError(
            f"{name} contains {int(bad.sum())} NaN/Inf value(s) (rows {rows[:5].tolist()}"
            f"{'...' if rows.size > 5 else ''}); remove or impute them first"
        )


def check_data(x: Any, y: Any, noise_var: Any = None, *, outputs: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Validate training data: matching lengths, finite values, positive noise variance.

    Labels are a vector ``(n,)``, or with ``outputs = C`` a matrix ``(n, C)`` (one column per output of a
    multi-output model, e.g. the class latents of :mod:`bootens_core.classification`). ``noise_var`` is a
    scalar, one variance per row ``(n,)``, or one per label (the labels' shape).

    Returns ``(x, y)`` as arrays; raises ``ValueError`` naming the problem otherwise.
    """
    x_np, y_np = np.asarray(x), np.asarray(y)
    if outputs is None and y_np.ndim != 1:
        raise ValueError(f"labels y must be a vector of shape (n,), got shape {y_np.shape}")
    if outputs is not None and (y_np.ndim != 2 or y_np.shape[1] != int(outputs)):
        raise ValueError(
            f"labels y must have shape (n, {int(outputs)}) (one column per model output), got shape {y_np.shape}"
        )
    if x_np.ndim not in (1, 2):
        raise ValueError(f"inputs x must have shape (n,) or (n, d), got shape {x_np.shape}")
    if x_np.shape[0] != y_np.shape[0]:
        raise ValueError(f"x has {x_np.shape[0]} rows but y has {y_np.shape[0]} labels")
    if y_np.shape[0] == 0:
        raise ValueError("no training data (n = 0)")
    check_finite("x", x_np)
    check_finite("y", y_np)
    if noise_var is not None:
        nv = np.asarray(noise_var, dtype=float)
        if nv.shape not in ((), (y_np.shape[0],), y_np.shape):
            allowed = f"({y_np.shape[0]},)" + (f" or {y_np.shape}" if y_np.ndim == 2 else "")
            raise ValueError(f"noise_var must be a scalar or have shape {allowed}, got {nv.shape}")
        if nv.ndim == 1 and y_np.ndim == 2:
            nv = nv[:, None]
        if not np.all(np.isfinite(nv) & (nv > 0)):
            raise ValueError("noise_var must be positive and finite")
    return jnp.asarray(x_np), jnp.asarray(y_np)


def check_observed(observed: Any, n: int) -> np.ndarray:
    """Validate a row mask: ``n`` booleans (padding rows ``False``), at least one ``True``. Returns it as a
    boolean array; raises ``ValueError`` naming the problem otherwise."""
    mask = np.asarray(observed)
    if mask.shape != (int(n),):
        raise ValueError(f"observed must have one entry per row, shape ({int(n)},), got shape {mask.shape}")
    if mask.dtype != bool:
        if not np.issubdtype(mask.dtype, np.number) or not np.all(np.isin(mask, (0, 1))):
            raise ValueError(f"observed must hold booleans (True: an observed row, False: padding), got dtype "
                             f"{mask.dtype}")
        mask = mask.astype(bool)
    if not mask.any():
        raise ValueError("observed marks no row as observed: at least one row must be")
    return mask


def model_outputs(model: Model, x: Any) -> int | None:
    """``None`` for a model with one output per input (``apply -> (n,)``), else its number of outputs
    (``apply -> (n, C)``), found from shapes alone (``jax.eval_shape``) at inputs shaped like ``x``."""
    try:
        out = jax.eval_shape(model.apply, template(model, jnp.float32),
                             jax.ShapeDtypeStruct(np.shape(x), jnp.float32))
    except (TypeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"the model {model.name!r} cannot take inputs x of shape {np.shape(x)} (does x have as "
                         f"many columns as the model has inputs?): {first}") from None
    return None if len(out.shape) == 1 else int(out.shape[1])
