"""optax's zoom line search for a whole ensemble at once: the same steps per particle, fewer evaluations.

The ensembles' L-BFGS (``optimizer("lbfgs", lr, linesearch="zoom")``) runs optax's zoom line search (strong
Wolfe) for every particle under ``jax.vmap``. optax writes one search step as ``lax.cond(interval found,
zoom into the interval, search for an interval)``, each branch evaluating the loss and gradient once, inside
a ``lax.while_loop`` that runs until the search is done. Under ``vmap`` the predicate is per particle, so the
``cond`` becomes a ``select``: every loop iteration evaluates *both* branches for *every* particle, and the
loop runs as long as the slowest particle's search. On the paper's UCI networks most searches accept the
first trial step (1.03 search steps per particle on average, Boston-sized data, 50 or 200 particles), yet
one step of 50 particles cost 4.8 gradient evaluations of the whole ensemble.

:func:`batched_zoom_linesearch` is optax's transformation (same state, same search: optax's own
``zoom_linesearch`` step functions are called) with a batching rule of its own (``jax.custom_batching``).
Under ``vmap`` each loop iteration

- runs a branch only if some particle still searching needs it, with the branch's predicate made the same
  for all (a real ``cond``), and keeps each particle's result from the branch its own predicate names;
- steps the first trial of every particle at once, and after it gathers the particles still searching --
  typically a few -- in groups of at most ``compact``, steps them, and scatters them back.

Each particle takes the search steps it takes under optax's rule, so the particles are the same up to float
rounding (XLA fuses the smaller programs differently: after hundreds of L-BFGS iterations a last-digit
difference can grow, as with any change of CPU). Called on one particle (no ``vmap``) it *is* optax's search.

The loss is ``value_fn(params, **kwargs)`` with the keyword arguments passed to ``update`` (optax's
convention): a ``value_fn`` that closes over per-particle arrays cannot be batched by the rule, so pass
them as keyword arguments (``update(..., value_fn=loss, pert=pert, x=x)``).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.custom_batching import custom_vmap
from optax._src.linesearch import ZoomLinesearchInfo, ZoomLinesearchState, zoom_linesearch

__all__ = ["batched_zoom_linesearch"]


def _where(mask: jax.Array, a: Any, b: Any) -> Any:
    """Per particle (leading axis): ``a`` where ``mask``, else ``b``."""
    return jax.tree.map(lambda u, v: jnp.where(mask.reshape(mask.shape + (1,) * (u.ndim - 1)), u, v), a, b)


def batched_zoom_linesearch(
    max_linesearch_steps: int = 20,
    initial_guess_strategy: str = "one",
    compact: int | None = None,
) -> optax.GradientTransformationExtraArgs:
    """``optax.scale_by_zoom_linesearch(max_linesearch_steps, initial_guess_strategy=...)`` (optax's other
    defaults) that, under ``jax.vmap`` over particles, evaluates only the branch each search step needs and,
    after the first trial only the particles still searching (see the module's text).

    ``max_linesearch_steps=20`` and ``"one"`` are the line search of ``optax.lbfgs``. ``compact``: the size of
    the groups the particles still searching are stepped in; ``None``: a sixteenth of the particles, at least
    1; the number of particles: no groups (each branch over all, as optax's but only where needed). The state
    is optax's :class:`optax.ScaleByZoomLinesearchState`.

    Measured (``bootens bench --case linesearch``, one core of a 2-core CPU, the UCI profiles' L-BFGS on
    Boston's shape, float32; ``results/paper/bench/cpu-2core/linesearch.json``): 15.4 ms per iteration with
    optax's search under ``vmap``, 5.5 ms with this one at 50 particles of the 1-layer network; 117 and 29 ms
    at 200; 4 layers: 204 and 49 ms at 50, 1095 and 276 ms at 200.
    """
    steps = int(max_linesearch_steps)
    if steps < 1:
        raise ValueError(f"max_linesearch_steps must be a positive integer, got {max_linesearch_steps!r}")
    if initial_guess_strategy not in ("one", "keep"):
        raise ValueError(f"initial_guess_strategy must be 'one' or 'keep', got {initial_guess_strategy!r}")
    if compact is not None and (isinstance(compact, bool) or not isinstance(compact, int) or compact < 1):
        raise ValueError(f"compact must be a positive integer or None, got {compact!r}")
    reference = optax.scale_by_zoom_linesearch(steps, initial_guess_strategy=initial_guess_strategy)
    init_ls, step_ls, cond_ls = zoom_linesearch(max_linesearch_steps=steps)

    def update_fn(updates, state, params, *, value, grad, value_fn, **extra_args):
        names = inspect.signature(value_fn).parameters
        unused = sorted(k for k in extra_args if k not in names)
        if unused:
            raise TypeError(f"batched_zoom_linesearch.update: value_fn takes no {', '.join(unused)}")
        value_and_grad = jax.value_and_grad(value_fn)

        def start(upd, par, val, gr, prev):
            return init_ls(upd, par, value=val, grad=gr, prev_stepsize=prev,
                           initial_guess_strategy=initial_guess_strategy)

        def search_step(s, kw):
            return step_ls(s, value_and_grad_fn=value_and_grad, fn_kwargs=kw)

        @custom_vmap
        def search(upd, par, val, gr, prev, kw):
            return jax.lax.while_loop(cond_ls, lambda s: search_step(s, kw), start(upd, par, val, gr, prev))

        @search.def_vmap
        def _batched(axis_size, in_batched, upd, par, val, gr, prev, kw):
            axes = jax.tree.map(lambda b: 0 if b else None, tuple(in_batched))
            s0 = jax.vmap(start, in_axes=axes[:5], axis_size=axis_size)(upd, par, val, gr, prev)
            kw_axes = axes[5]
            k = axis_size
            size = max(1, math.ceil(k / 16)) if compact is None else min(int(compact), k)
            # The search state of every particle, with the branch predicate shared (a real cond inside).
            shared = ZoomLinesearchState(**{f: 0 for f in ZoomLinesearchState._fields})._replace(interval_found=None)

            def branch(s, kw, kw_ax, found):
                run = jax.vmap(search_step, in_axes=(shared, kw_ax))
                return run(s._replace(interval_found=jnp.asarray(found)), kw)

            def rows_step(s, kw, kw_ax, live):
                found = s.interval_found
                zoomed = jax.lax.cond(jnp.any(live & found), lambda: branch(s, kw, kw_ax, True), lambda: s)
                searched = jax.lax.cond(jnp.any(live & ~found), lambda: branch(s, kw, kw_ax, False), lambda: s)
                return _where(live, _where(found, zoomed, searched), s)

            def in_groups(s, live):
                # Every live particle once, up to `size` at a time: gathered, stepped, scattered back.
                def group(carry):
                    s, pending = carry
                    idx = jnp.nonzero(pending, size=size, fill_value=0)[0]
                    valid = jnp.arange(size) < jnp.sum(pending)
                    take = lambda a: a[idx]  # noqa: E731
                    kw_rows = jax.tree.map(lambda a, b: take(a) if b else a, kw, in_batched[5])
                    rows = rows_step(jax.tree.map(take, s), kw_rows, kw_axes, valid)
                    where = jnp.where(valid, idx, k)  # padding rows go out of bounds: dropped
                    s = jax.tree.map(lambda a, r: a.at[where].set(r, mode="drop"), s, rows)
                    return s, pending.at[where].set(False, mode="drop")

                return jax.lax.while_loop(lambda c: jnp.any(c[1]), group, (s, live))[0]

            def body(s):
                live = ~(s.done | s.failed)
                if size >= k:
                    return rows_step(s, kw, kw_axes, live)
                # The first trial step of a search (no interval found yet) of many particles: one program over
                # all of them; otherwise the few still searching, in groups (so only three copies of the
                # search's step are compiled: the first trial for all, and each branch for a group).
                first = (jnp.sum(live) > size) & ~jnp.any(live & s.interval_found)
                return jax.lax.cond(first, lambda s: _where(live, branch(s, kw, kw_axes, False), s),
                                    lambda s: in_groups(s, live), s)

            out = jax.lax.while_loop(lambda s: jnp.any(~(s.done | s.failed)), body, s0)
            return out, jax.tree.map(lambda _: True, out)

        final = search(updates, params, value, grad, state.learning_rate, extra_args)
        new_state = optax.ScaleByZoomLinesearchState(
            learning_rate=final.stepsize, value=final.value, grad=final.grad,
            info=ZoomLinesearchInfo(final.count, final.decrease_error, final.curvature_error),
        )
        return optax.tree.scale(final.stepsize, updates), optax.tree.cast_like(new_state, other_tree=state)

    return optax.GradientTransformationExtraArgs(reference.init, update_fn)
