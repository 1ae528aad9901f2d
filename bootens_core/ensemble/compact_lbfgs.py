"""optax's L-BFGS with its direction in compact form: two reads of the history instead of a loop over it.

``optax.scale_by_lbfgs`` multiplies the gradient by the inverse-Hessian approximation with the two-loop
recursion (Nocedal and Wright, Algorithm 7.4): ``2m`` sequential steps, each reading one stored pair.
Under the ensembles' ``jax.vmap`` over particles the ring-buffer index is a per-particle value, so every
step gathers its pair from the whole history and the update scatters into it; XLA's cost analysis of the
recursion alone counts 8 times the bytes of the history per iteration (``bootens bench --case
uci-dataset``: 1.07 GB at Boston's shape, 200 particles of the 4-layer network, memory 10), and on an
accelerator it is some forty small programs.

:func:`scale_by_compact_lbfgs` computes the same product from the compact representation of the L-BFGS
matrix (Byrd, Nocedal and Schnabel 1994, eq. 3.13; Nocedal and Wright eq. 7.24):

    H g = gamma g + S p + Y q,    r = R^-1 S^T g,   q = -gamma r,
                                  p = R^-T ((D + gamma Y^T Y) r - gamma Y^T g),

with ``S``, ``Y`` the stored differences of parameters and gradients (rows, oldest to newest), ``R`` the
upper triangle of ``S^T Y`` in that order and ``D`` its diagonal. Every product with the history is a
matrix product: one pass reads ``S`` and ``Y`` for ``S^T g``, ``Y^T g`` and the new column of ``S^T Y``
and ``Y^T Y`` (kept in the state, ``m x m``), a second forms ``S p + Y q``; the solves are ``m x m``.
The pair order is never materialised on the history: the ring buffer stays, and only the ``m x m``
matrices are permuted.

Same rules as optax's (``optax.lbfgs`` with ``scale_init_precond=True``): a pair with ``s^T y = 0``
(every slot before the memory is full) is skipped, a pair of negative curvature is kept, ``gamma = s^T y
/ y^T y`` of the newest pair, and ``min(1, 1 / |g|)`` at the first iteration. The two are one algorithm
in exact arithmetic; in floating point they round differently (tests: against optax's recursion and a
float64 dense BFGS product). The products with the history run at full float32 precision whatever
``jax_default_matmul_precision`` says.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.scipy.linalg import solve_triangular

__all__ = ["CompactLBFGSState", "compact_lbfgs", "scale_by_compact_lbfgs"]

_HIGHEST = jax.lax.Precision.HIGHEST


class CompactLBFGSState(NamedTuple):
    """State of :func:`scale_by_compact_lbfgs`.

    ``count``: iterations so far; ``params``, ``updates``: the previous ones; ``s_memory``,
    ``y_memory``: per leaf, the last ``m`` differences of parameters and of gradients in a ring buffer
    (slot ``(count - 1) mod m`` the newest, shape ``(m, *leaf.shape)``); ``sy``: ``sy[i, j] = s_i . y_j``
    for every slot ``i`` and the slot ``j`` of a pair no older than ``i`` (the rest is stale and never
    read); ``yy``: ``y_i . y_j``.
    """

    count: jax.Array
    params: Any
    updates: Any
    s_memory: Any
    y_memory: Any
    sy: jax.Array
    yy: jax.Array


def _rows(tree: Any, memory: int) -> list[jax.Array]:
    return [a.reshape(memory, -1) for a in jax.tree.leaves(tree)]


def _flat(tree: Any) -> list[jax.Array]:
    return [a.reshape(-1) for a in jax.tree.leaves(tree)]


def scale_by_compact_lbfgs(memory_size: int = 10) -> optax.GradientTransformation:
    """``optax.scale_by_lbfgs(memory_size)`` with the direction in compact form (module text): the same
    inverse-Hessian approximation times the gradient, up to float rounding, in two passes over the history.

    Raises ``ValueError`` for a memory size that is not a positive integer.
    """
    if isinstance(memory_size, bool) or not isinstance(memory_size, int) or memory_size < 1:
        raise ValueError(f"memory_size must be a positive integer, got {memory_size!r}")
    m = int(memory_size)

    def init_fn(params: Any) -> CompactLBFGSState:
        memory = jax.tree.map(lambda a: jnp.zeros((m, *jnp.shape(a)), jnp.asarray(a).dtype), params)
        dtype = jnp.result_type(*jax.tree.leaves(params))
        return CompactLBFGSState(
            count=jnp.asarray(0, jnp.int32), params=optax.tree.zeros_like(params),
            updates=optax.tree.zeros_like(params), s_memory=memory, y_memory=memory,
            sy=jnp.zeros((m, m), dtype), yy=jnp.zeros((m, m), dtype),
        )

    def update_fn(updates: Any, state: CompactLBFGSState,
                  params: Any = None) -> tuple[Any, CompactLBFGSState]:
        if params is None:
            raise ValueError("scale_by_compact_lbfgs needs the parameters: update(updates, state, params)")
        count = state.count
        first = count == 0
        newest = (count - 1) % m  # the slot of the pair made now (m - 1 at the first iteration, all zeros)
        s = jax.tree.map(lambda p, q: jnp.where(first, jnp.zeros_like(p), p - q), params, state.params)
        y = jax.tree.map(lambda u, v: jnp.where(first, jnp.zeros_like(u), u - v), updates, state.updates)
        s_mem = jax.tree.map(lambda mem, new: mem.at[newest].set(new), state.s_memory, s)
        y_mem = jax.tree.map(lambda mem, new: mem.at[newest].set(new), state.y_memory, y)

        # Pass 1 over the history: [S; Y] (g, y_new) -> S^T g, Y^T g, S^T y_new, Y^T y_new.
        dtype = state.sy.dtype
        s_g = s_ynew = y_g = y_ynew = jnp.zeros(m, dtype)
        for s_rows, y_rows, g, y_new in zip(_rows(s_mem, m), _rows(y_mem, m), _flat(updates), _flat(y),
                                            strict=True):
            both = jnp.stack([g, y_new], axis=1)  # (n, 2): the history is read once per pass, not copied
            sp = jnp.matmul(s_rows, both, precision=_HIGHEST).astype(dtype)
            yp = jnp.matmul(y_rows, both, precision=_HIGHEST).astype(dtype)
            s_g, s_ynew = s_g + sp[:, 0], s_ynew + sp[:, 1]
            y_g, y_ynew = y_g + yp[:, 0], y_ynew + yp[:, 1]
        sy = state.sy.at[:, newest].set(s_ynew)
        yy = state.yy.at[:, newest].set(y_ynew).at[newest, :].set(y_ynew)

        # gamma: optax's scale of the identity, from the newest pair (min(1, 1/|g|) at the first iteration).
        curv, y_sq = s_ynew[newest], y_ynew[newest]
        g_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in _flat(jax.lax.stop_gradient(updates))))
        gamma = jnp.where(first, jnp.minimum(1.0, 1.0 / g_norm), jnp.where(y_sq > 0, curv / y_sq, 1.0))
        gamma = gamma.astype(dtype)

        # The m x m algebra in pair order (oldest first); a pair with s^T y = 0 is skipped (optax's weight 0).
        order = (count + jnp.arange(m)) % m
        diag = jnp.diagonal(sy)[order]
        keep = diag != 0
        both = keep[:, None] & keep[None, :]
        skipped = jnp.diag(jnp.where(keep, 0, 1).astype(dtype))  # 1 on the diagonal: an identity row
        r_mat = jnp.where(both, jnp.triu(sy[order][:, order]), 0) + skipped
        d = jnp.where(keep, diag, 1)
        yy_o = jnp.where(both, yy[order][:, order], 0)
        u, w = jnp.where(keep, s_g[order], 0), jnp.where(keep, y_g[order], 0)
        r = solve_triangular(r_mat, u, lower=False)
        p = solve_triangular(r_mat, d * r + gamma * jnp.matmul(yy_o, r, precision=_HIGHEST) - gamma * w,
                             lower=False, trans="T")
        coef_s = jnp.zeros(m, dtype).at[order].set(jnp.where(keep, p, 0))
        coef_y = jnp.zeros(m, dtype).at[order].set(jnp.where(keep, -gamma * r, 0))

        # Pass 2: gamma g + S p + Y q.
        def direction(g: jax.Array, s_leaf: jax.Array, y_leaf: jax.Array) -> jax.Array:
            flat = (gamma * g.reshape(-1) + jnp.matmul(coef_s, s_leaf.reshape(m, -1), precision=_HIGHEST)
                    + jnp.matmul(coef_y, y_leaf.reshape(m, -1), precision=_HIGHEST))
            return flat.reshape(g.shape).astype(g.dtype)

        precond = jax.tree.map(direction, updates, s_mem, y_mem)
        new_state = CompactLBFGSState(count=optax.safe_increment(count), params=params, updates=updates,
                                      s_memory=s_mem, y_memory=y_mem, sy=sy, yy=yy)
        return precond, new_state

    return optax.GradientTransformation(init_fn, update_fn)


def compact_lbfgs(
    learning_rate: float | None = None,
    memory_size: int = 10,
    linesearch: optax.GradientTransformation | None = None,
) -> optax.GradientTransformationExtraArgs:
    """``optax.lbfgs(learning_rate, memory_size, linesearch=linesearch)`` with :func:`scale_by_compact_lbfgs`
    in place of ``optax.scale_by_lbfgs``: the direction, scaled by ``-learning_rate`` (``-1`` for ``None``),
    then ``linesearch`` (``None``: none, a fixed step)."""
    scaling = optax.scale(-1.0) if learning_rate is None else optax.scale_by_learning_rate(learning_rate)
    return optax.chain(scale_by_compact_lbfgs(memory_size), scaling,
                       optax.identity() if linesearch is None else linesearch)
