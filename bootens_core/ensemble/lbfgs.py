"""PyTorch's L-BFGS (``torch.optim.LBFGS``) as an optax transformation: the paper's UCI optimizer.

The paper trains its UCI ensembles with "L-BFGS, 32 steps, step size 0.5": ``torch.optim.LBFGS(params,
lr=0.5)`` with its defaults and ``.step(closure)`` called 32 times. :func:`torch_lbfgs` reproduces that
algorithm in JAX. **One** ``update`` call is **one** ``.step(closure)``: an *outer step* of up to
``max_iter`` inner L-BFGS iterations, so 32 updates are the paper's 32 steps (up to 640 iterations).

Example::

    tx = torch_lbfgs(0.5)                                  # torch.optim.LBFGS(params, lr=0.5)
    state = tx.init(params)
    for _ in range(32):
        value, grad = jax.value_and_grad(loss)(params)     # the closure's first evaluation of the step
        updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=loss)
        params = optax.apply_updates(params, updates)

The algorithm of one outer step (names as in PyTorch)
------------------------------------------------------
``g`` is the flat gradient (the parameter pytree raveled with ``jax.flatten_util.ravel_pytree``, leaves in
``jax.tree.leaves`` order), ``f`` the loss, ``x`` the flat parameters.

1. The step's first evaluation (``value``/``grad`` of ``update``) counts one function evaluation
   (``func_evals``; the step's own counter ``current_evals`` starts at 1). If ``max|g| <= tolerance_grad``
   the step returns at once: parameters and the rest of the state unchanged.
2. Up to ``max_iter`` iterations, each incrementing the step's counter and the global ``n_iter``:

   a. *Direction.* On the very first iteration ever (global ``n_iter == 1``) ``d = -g``, the history is
      emptied and ``H_diag = 1``. Otherwise, with the previous iteration's direction ``d``, step ``t`` and
      gradient ``prev_flat_grad`` (possibly from the previous outer step), ``y = g - prev_flat_grad``,
      ``s = t d``; the pair is stored (dropping the oldest once ``history_size`` are held) only if
      ``y.s > 1e-10``, and then ``H_diag = y.s / y.y``. ``d`` is the two-loop recursion: ``q = -g``; from
      newest to oldest pair ``a_i = rho_i s_i.q``, ``q -= a_i y_i``; ``r = H_diag q``; from oldest to newest
      ``b_i = rho_i y_i.r``, ``r += (a_i - b_i) s_i``; ``d = r`` (``rho_i = 1 / y_i.s_i``).
   b. ``prev_flat_grad = g``, ``prev_loss = f``.
   c. *Step length.* ``t = min(1, 1/||g||_1) lr`` on the very first iteration ever, else ``t = lr``.
   d. ``gtd = g.d``; if ``gtd > -tolerance_change`` the step stops here (no move, no evaluation).
   e. *Move.* Fixed step (``line_search_fn=None``): ``x += t d``; unless this is the step's last
      iteration (``n_iter == max_iter``) the loss and gradient are re-evaluated there (one evaluation). In
      the last iteration nothing is evaluated: the next outer step's first evaluation supplies them.
      Strong Wolfe: ``f, g, t`` come from the line search below along ``d`` from ``x`` and ``x += t d``.
   f. Stop the step if, in this order: ``n_iter == max_iter``; ``current_evals >= max_eval``;
      ``max|g| <= tolerance_grad``; ``max|t d| <= tolerance_change``; ``|f - prev_loss| <
      tolerance_change``. (Only the fact of stopping matters: every break leaves the same state.)

   The direction ``d``, step ``t``, the history, ``H_diag``, ``prev_flat_grad``, ``prev_loss``, ``n_iter``
   and ``func_evals`` carry over to the next outer step.

Strong-Wolfe line search (torch's ``_strong_wolfe`` / ``_cubic_interpolate``)
------------------------------------------------------------------------------
``c1 = 1e-4``, ``c2 = 0.9``, its own ``tolerance_change = 1e-9`` (PyTorch does not pass the optimizer's),
``phi(t) = f(x + t d)``, ``d_norm = max|d|``. Evaluate at the initial ``t`` (one evaluation). *Bracketing*
(at most ``max_ls`` further evaluations): with ``(t_prev, f_prev, gtd_prev) = (0, f, gtd)``, stop with the
bracket ``[t_prev, t]`` if ``f_new > f + c1 t gtd`` or (after two extrapolations) ``f_new >= f_prev``; stop
*done* with ``[t]`` if ``|gtd_new| <= -c2 gtd``; stop with ``[t_prev, t]`` if ``gtd_new >= 0``; otherwise
extrapolate ``t`` to the minimiser of the cubic through both points, clamped to ``[t + 0.01 (t - t_prev),
10 t]``, and evaluate. If ``max_ls`` evaluations ran out the bracket is ``[0, t]``. *Zoom* (while not done
and fewer than ``max_ls`` iterations, and while ``|b_1 - b_0| d_norm >= 1e-9``): ``t`` = cubic minimiser in
the bracket (midpoint if the cubic has none); if ``t`` lies within 10% of the bracket's width from an end,
and either the previous trial did too (*insufficient progress*) or ``t`` is at/outside an end, move ``t``
to 10% of the width from the nearer end; evaluate; if the Armijo condition fails or ``f_new`` is not below
the low end, ``t`` replaces the high end; otherwise the strong Wolfe curvature condition ends the search,
or, if ``gtd_new (b_high - b_low) >= 0``, the old low becomes the high end, and ``t`` becomes the low end.
The search returns the low end of the bracket (its loss and gradient are known: no re-evaluation).

``max_ls``: recent PyTorch (PR #161488, merged September 2025; 2.13 checked) caps the search at the
evaluations left in the outer step, ``max_ls = max_eval - current_evals`` (``max_ls=None`` here, the
default); older releases, the paper's era included, always allowed 25 (``max_ls=25`` here), so one search
could overrun ``max_eval`` by up to 25. Even with the cap the search's first evaluation is not counted in
``max_ls``, so a step can end with ``max_eval + 1`` evaluations (as in PyTorch).

Differences from ``optax.lbfgs(learning_rate, linesearch=None)``
-----------------------------------------------------------------
- One ``update`` is a whole outer step of up to ``max_iter`` iterations with its own function
  evaluations (``value_fn`` is differentiated inside with ``jax.value_and_grad``), not one iteration.
- Curvature pairs with ``y.s <= 1e-10`` are skipped; optax stores every pair, even one of negative
  curvature. ``H_diag = y.s / y.y`` comes from the newest *stored* pair; optax scales with the newest pair
  whatever its sign.
- The very first step ever is scaled by ``min(1, 1/||g||_1)`` (the L1 norm); optax's first step by
  ``min(1, 1/||g||_2)``.
- Termination tests: ``tolerance_grad`` (``max|g|``), ``tolerance_change`` (``g.d``, ``max|t d|``, loss
  change) and the ``max_eval`` evaluation budget; optax has none.
- History: ``history_size`` pairs (default 100) kept newest-last in a circular buffer; optax's default
  ``memory_size`` is 10. The state also carries ``d``, ``t``, the previous gradient and loss, the
  global iteration count and the evaluation count across outer steps.
- Strong Wolfe is torch's bracketing + cubic zoom (above), not optax's zoom line search
  (``scale_by_zoom_linesearch``), and it starts from ``t = lr`` (scaled on the first step ever).

JAX specifics
-------------
The state (:class:`TorchLBFGSState`) holds arrays only: the history is two ``(history_size, n)``
buffers with a start slot and a count (``2 history_size n`` floats per particle; the two-loop recursion
reads them all in every iteration, which dominates the time of small models under ``vmap``). All control
flow is ``lax.while_loop``/``lax.cond``, so ``update`` runs under ``jax.jit``, inside ``lax.scan`` and
under ``jax.vmap`` over a leading particle axis (each particle its own state; inner loops of different
lengths per particle are masked correctly; under ``vmap`` every particle pays for the longest loop of the
batch, and ``lax.cond`` evaluates both branches).
Scalars (``t``, ``H_diag``, losses) are kept in the dtype of the raveled parameters, float32 or float64
(torch keeps losses as Python floats, so in float32 the two round a little differently; in float64 they
follow the same arithmetic, up to the summation order of dot products).
The state's ``value``/``grad`` are the loss and gradient at the returned parameters when the step already
evaluated them (strong Wolfe, or a step that stopped early), else ``value = +inf``: a caller may reuse them
as the next step's first evaluation (``bootens_core.ensemble`` does for line-search optimizers); the
returned ``updates`` are ``new_params - params``.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

__all__ = [
    "LINE_SEARCHES",
    "TorchLBFGSState",
    "torch_lbfgs",
]

LINE_SEARCHES: tuple[str | None, ...] = (None, "strong_wolfe")
"""The accepted ``line_search_fn`` values (as in PyTorch)."""

_CURVATURE_MIN = 1e-10  # a pair (y, s) is stored only if y.s exceeds this (torch's constant)
_C1 = 1e-4  # Armijo constant of torch's strong-Wolfe search
_C2 = 0.9  # curvature constant
_LS_TOLERANCE_CHANGE = 1e-9  # the line search's own tolerance (torch does not pass the optimizer's)


class TorchLBFGSState(NamedTuple):
    """State of :func:`torch_lbfgs` (one particle; add a leading axis with ``jax.vmap(tx.init)``).

    ``n`` is the number of raveled parameters, ``m`` the history size.

    Attributes:
        d: ``(n,)`` the last search direction (torch ``state['d']``).
        t: ``()`` the last step length (torch ``state['t']``).
        old_dirs: ``(m, n)`` circular buffer of gradient differences ``y`` (torch ``old_dirs``).
        old_stps: ``(m, n)`` circular buffer of steps ``s = t d`` (torch ``old_stps``).
        ro: ``(m,)`` ``1 / y.s`` of the stored pairs.
        hist_start: ``()`` int32 slot of the oldest stored pair.
        hist_count: ``()`` int32 number of stored pairs (``<= m``).
        h_diag: ``()`` scale of the initial inverse Hessian, ``y.s / y.y`` of the newest pair (1 before).
        prev_flat_grad: ``(n,)`` gradient at the start of the last iteration.
        prev_loss: ``()`` loss at the start of the last iteration.
        n_iter: ``()`` int32 iterations over all outer steps (torch ``state['n_iter']``).
        func_evals: ``()`` int32 function evaluations over all outer steps, each step's first one included
            (torch ``state['func_evals']``).
        value: ``()`` loss at the parameters returned by the last update if the step evaluated it there,
            else ``+inf`` (before the first step too).
        grad: gradient there, with the structure of the parameters (meaningful only where ``value`` is
            finite).
    """

    d: jax.Array
    t: jax.Array
    old_dirs: jax.Array
    old_stps: jax.Array
    ro: jax.Array
    hist_start: jax.Array
    hist_count: jax.Array
    h_diag: jax.Array
    prev_flat_grad: jax.Array
    prev_loss: jax.Array
    n_iter: jax.Array
    func_evals: jax.Array
    value: jax.Array
    grad: Any


def torch_lbfgs(
    learning_rate: float,
    *,
    max_iter: int = 20,
    max_eval: int | None = None,
    tolerance_grad: float = 1e-7,
    tolerance_change: float = 1e-9,
    history_size: int = 100,
    line_search_fn: str | None = None,
    max_ls: int | None = None,
) -> optax.GradientTransformationExtraArgs:
    """``torch.optim.LBFGS`` as an optax transformation; one ``update`` is one ``.step(closure)``.

    Args:
        learning_rate: torch's ``lr``: the fixed step length, or the line search's first trial step.
        max_iter: iterations per outer step (torch default 20).
        max_eval: function evaluations per outer step, its first one included; default
            ``max_iter * 5 // 4`` (25), as in torch.
        tolerance_grad: stop when ``max|g| <= tolerance_grad`` (torch default 1e-7).
        tolerance_change: stop when ``g.d``, ``max|t d|`` or the loss change fall below it (default 1e-9).
        history_size: number of curvature pairs kept (torch default 100).
        line_search_fn: ``None`` for fixed steps of length ``learning_rate``, or ``"strong_wolfe"``.
        max_ls: evaluations one strong-Wolfe search may add after its first: ``None`` (default) for the
            evaluations left in the outer step, ``max_eval - current_evals`` (PyTorch since PR #161488,
            September 2025); ``25`` for older PyTorch releases.

    Returns:
        An ``optax.GradientTransformationExtraArgs``. ``init(params)`` builds a
        :class:`TorchLBFGSState`. ``update(updates, state, params, *, value=None, grad=None,
        value_fn=None)`` takes one outer step from ``params``: ``value`` and ``grad`` are the loss and its
        gradient at ``params`` (``grad`` defaults to ``updates``; ``value`` to ``value_fn(params)``), and
        ``value_fn(params) -> loss`` is the loss, which is differentiated inside for the re-evaluations.
        It returns ``(new_params - params, new_state)``. Keyword arguments that ``value_fn`` takes are passed to
        it (``value_fn(params, **those)``, optax's convention); others are ignored (as in a chain).

    Raises:
        ValueError: for a non-positive or non-finite learning rate, an unknown ``line_search_fn``, or a
            non-positive ``max_iter``/``max_eval``/``history_size``, a negative ``max_ls`` or tolerance.
    """
    lr = _positive_float("learning rate", learning_rate)
    max_iter = _positive_int("max_iter", max_iter)
    max_eval = max_iter * 5 // 4 if max_eval is None else _positive_int("max_eval", max_eval)
    history_size = _positive_int("history_size", history_size)
    tol_grad = _non_negative_float("tolerance_grad", tolerance_grad)
    tol_change = _non_negative_float("tolerance_change", tolerance_change)
    if line_search_fn not in LINE_SEARCHES:
        raise ValueError(f"unknown line_search_fn {line_search_fn!r}: use None or 'strong_wolfe'")
    if max_ls is not None:
        if isinstance(max_ls, bool) or not isinstance(max_ls, numbers.Integral) or max_ls < 0:
            raise ValueError(f"max_ls must be None or a non-negative integer, got {max_ls!r}")
        max_ls = int(max_ls)
    wolfe = line_search_fn == "strong_wolfe"

    def init_fn(params: Any) -> TorchLBFGSState:
        flat, _ = ravel_pytree(params)
        _check_dtype(flat)
        n, dt = flat.shape[0], flat.dtype
        zeros = jnp.zeros((n,), dt)
        return TorchLBFGSState(
            d=zeros,
            t=jnp.zeros((), dt),
            old_dirs=jnp.zeros((history_size, n), dt),
            old_stps=jnp.zeros((history_size, n), dt),
            ro=jnp.zeros((history_size,), dt),
            hist_start=jnp.zeros((), jnp.int32),
            hist_count=jnp.zeros((), jnp.int32),
            h_diag=jnp.ones((), dt),
            prev_flat_grad=zeros,
            prev_loss=jnp.zeros((), dt),
            n_iter=jnp.zeros((), jnp.int32),
            func_evals=jnp.zeros((), jnp.int32),
            value=jnp.full((), jnp.inf, dt),
            grad=jax.tree.map(jnp.zeros_like, params),
        )

    def update_fn(
        updates: Any,
        state: TorchLBFGSState,
        params: Any = None,
        *,
        value: Any = None,
        grad: Any = None,
        value_fn: Callable[[Any], Any] | None = None,
        **extra_args: Any,
    ) -> tuple[Any, TorchLBFGSState]:
        if value_fn is not None:
            # optax's convention: value_fn's keyword arguments come with the update (its data, e.g. per particle).
            takes = inspect.signature(value_fn).parameters
            bound = {k: v for k, v in extra_args.items() if k in takes}
            if bound:
                value_fn = functools.partial(value_fn, **bound)
        if params is None:
            raise ValueError("torch_lbfgs.update needs params (the point the step starts from)")
        if value_fn is None and (wolfe or max_iter > 1 or value is None):
            raise ValueError(
                "torch_lbfgs.update needs value_fn (params -> loss): the inner iterations and the line "
                "search re-evaluate the loss and its gradient"
            )
        x0, unravel = ravel_pytree(params)
        _check_dtype(x0)
        dt = x0.dtype
        g0, _ = ravel_pytree(updates if grad is None else grad)
        if g0.shape != x0.shape:
            raise ValueError(f"the gradient has {g0.shape[0]} entries but the parameters have {x0.shape[0]}")
        g0 = g0.astype(dt)
        f0 = jnp.asarray(value_fn(params) if value is None else value).astype(dt)
        if f0.shape != ():
            raise ValueError(f"value must be a scalar loss, got shape {f0.shape}")

        def evaluate(x: jax.Array) -> tuple[jax.Array, jax.Array]:
            f, g = jax.value_and_grad(lambda z: value_fn(unravel(z)))(x)  # type: ignore[misc]
            return jnp.asarray(f).astype(dt), g.astype(dt)

        step = _outer_step(
            evaluate, lr, max_iter, max_eval, tol_grad, tol_change, history_size, wolfe, max_ls, dt
        )
        x, f, g, fresh, state = step(x0, f0, g0, state)
        new_params = unravel(x)
        out = jax.tree.map(lambda new, old: (new - old).astype(old.dtype), new_params, params)
        state = state._replace(value=jnp.where(fresh, f, jnp.inf).astype(dt), grad=unravel(g))
        return out, state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# ------------------------------------------------------------------------------------------------------
# argument checks


def _positive_float(name: str, v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive finite number, got {v!r}") from None
    if not (f > 0 and math.isfinite(f)):
        raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    return f


def _non_negative_float(name: str, v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a non-negative finite number, got {v!r}") from None
    if not (f >= 0 and math.isfinite(f)):
        raise ValueError(f"{name} must be a non-negative finite number, got {v!r}")
    return f


def _positive_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def _check_dtype(flat: jax.Array) -> None:
    if not jnp.issubdtype(flat.dtype, jnp.floating):
        raise ValueError(f"torch_lbfgs needs real floating-point parameters, got dtype {flat.dtype}")
    if flat.shape[0] == 0:
        raise ValueError("torch_lbfgs needs at least one parameter")


# ------------------------------------------------------------------------------------------------------
# Python's min/max of two numbers (the first unless the second is strictly smaller/larger), so that NaNs
# propagate as in torch's use of the builtins.


def _pymin(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.where(b < a, b, a)


def _pymax(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.where(b > a, b, a)


def _cubic_min(
    x1: jax.Array, f1: jax.Array, g1: jax.Array, x2: jax.Array, f2: jax.Array, g2: jax.Array,
    lo: jax.Array | None = None, hi: jax.Array | None = None,
) -> jax.Array:
    """Minimiser of the cubic through ``(x1, f1, f1')`` and ``(x2, f2, f2')``, clamped to ``[lo, hi]``.

    Without bounds the interval is the one between the points; the midpoint of the bounds when the cubic
    has no real minimiser (``d1^2 < g1 g2``, or NaN).
    """
    if lo is None or hi is None:
        ordered = x1 <= x2
        lo, hi = jnp.where(ordered, x1, x2), jnp.where(ordered, x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1**2 - g1 * g2
    real = d2_square >= 0
    d2 = jnp.sqrt(jnp.where(real, d2_square, 0))
    from_x2 = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    from_x1 = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    min_pos = jnp.where(x1 <= x2, from_x2, from_x1)
    return jnp.where(real, _pymin(_pymax(min_pos, lo), hi), (lo + hi) / 2.0)


# ------------------------------------------------------------------------------------------------------
# the two-loop recursion over the circular history


def _two_loop(
    g: jax.Array, dirs: jax.Array, stps: jax.Array, ro: jax.Array, start: jax.Array, count: jax.Array,
    h_diag: jax.Array,
) -> jax.Array:
    """``-H g`` for the L-BFGS inverse Hessian ``H`` of the stored pairs, in torch's order of operations."""
    m = dirs.shape[0]

    def newest_first(j, carry):
        q, al = carry
        i = count - 1 - j  # logical index, 0 = oldest
        k = (start + i) % m
        a = jnp.dot(stps[k], q) * ro[k]
        return q - a * dirs[k], al.at[i].set(a)

    q, al = lax.fori_loop(0, count, newest_first, (-g, jnp.zeros((m,), g.dtype)))

    def oldest_first(i, r):
        k = (start + i) % m
        b = jnp.dot(dirs[k], r) * ro[k]
        return r + (al[i] - b) * stps[k]

    return lax.fori_loop(0, count, oldest_first, q * h_diag)


# ------------------------------------------------------------------------------------------------------
# torch's strong-Wolfe line search


class _Bracket(NamedTuple):
    t: jax.Array  # (2,) step lengths
    f: jax.Array  # (2,) losses
    g: jax.Array  # (2, n) gradients
    gtd: jax.Array  # (2,) directional derivatives


_EXTRAPOLATING, _ZOOMING, _FINISHED = 0, 1, 2


class _Search(NamedTuple):
    phase: jax.Array  # _EXTRAPOLATING, _ZOOMING or _FINISHED
    first: jax.Array  # the pending trial is the search's first evaluation
    trial: jax.Array  # the step length evaluated next
    ls_iter: jax.Array  # torch's ls_iter: evaluations after the first (bracketing and zoom together)
    evals: jax.Array  # evaluations so far (torch's ls_func_evals)
    t_prev: jax.Array  # bracketing: the previous trial, its loss, gradient and directional derivative
    f_prev: jax.Array
    g_prev: jax.Array
    gtd_prev: jax.Array
    done: jax.Array  # a point satisfying the strong Wolfe conditions was found
    insuf_progress: jax.Array
    low: jax.Array  # slot of the bracket's low end (lower loss)
    bracket: _Bracket


def _pair(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.stack([a, b])


def _select(pred: jax.Array, a: Any, b: Any) -> Any:
    return jax.tree.map(lambda u, v: jnp.where(pred, u, v), a, b)


def _zoom_trial(br: _Bracket, insuf_progress: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The next zoom trial in the bracket and the new insufficient-progress flag (torch's rule)."""
    t = _cubic_min(br.t[0], br.f[0], br.gtd[0], br.t[1], br.f[1], br.gtd[1])
    top, bottom = _pymax(br.t[0], br.t[1]), _pymin(br.t[0], br.t[1])
    eps = 0.1 * (top - bottom)
    near_end = _pymin(top - t, t - bottom) < eps
    move = near_end & (insuf_progress | (t >= top) | (t <= bottom))
    away = jnp.where(jnp.abs(t - top) < jnp.abs(t - bottom), top - eps, bottom + eps)
    return jnp.where(move, away, t), near_end & ~move


def _strong_wolfe(
    evaluate: Callable[[jax.Array], tuple[jax.Array, jax.Array]],
    x: jax.Array,
    t: jax.Array,
    d: jax.Array,
    f: jax.Array,
    g: jax.Array,
    gtd: jax.Array,
    max_ls: jax.Array,
    active: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """torch's ``_strong_wolfe`` along ``d`` from ``x``: ``(t, f(x + t d), g(x + t d), evaluations)``.

    One ``lax.while_loop`` with a single evaluation per iteration runs both of torch's loops: each iteration
    evaluates the pending trial and then does what torch does up to its next evaluation (the bracketing
    tests, the bracket when they stop it or when ``max_ls`` runs out, the zoom's update and its next trial).
    One call site of the loss keeps compilation short, and under ``vmap`` particles in different phases
    share iterations. Nothing runs where ``active`` is false (the result is then meaningless).
    """
    dt = x.dtype
    d_norm = jnp.max(jnp.abs(d))
    zero = jnp.zeros((), dt)
    i32 = jnp.int32
    unset = _Bracket(_pair(zero, zero), _pair(f, f), _pair(g, g), _pair(gtd, gtd))
    start = _Search(
        phase=jnp.asarray(_EXTRAPOLATING, i32), first=jnp.ones((), bool), trial=t, ls_iter=jnp.zeros((), i32),
        evals=jnp.zeros((), i32), t_prev=zero, f_prev=f, g_prev=g, gtd_prev=gtd, done=jnp.zeros((), bool),
        insuf_progress=jnp.zeros((), bool), low=jnp.zeros((), i32), bracket=unset,
    )

    def cond(c: _Search) -> jax.Array:
        return active & (c.phase != _FINISHED)

    def body(c: _Search) -> _Search:
        t = c.trial
        f_new, g_new = evaluate(x + t * d)
        gtd_new = jnp.dot(g_new, d)
        new = (t, f_new, g_new, gtd_new)

        # bracketing: the tests of torch's first loop on this evaluation
        ls_iter_b = c.ls_iter + jnp.where(c.first, 0, 1).astype(i32)
        in_budget = ls_iter_b < max_ls
        no_decrease = (f_new > f + _C1 * t * gtd) | ((ls_iter_b > 1) & (f_new >= c.f_prev))
        curvature = ~no_decrease & (jnp.abs(gtd_new) <= -_C2 * gtd)
        uphill = ~no_decrease & ~curvature & (gtd_new >= 0)
        bracketed = ~in_budget | no_decrease | curvature | uphill
        around = _Bracket(*(_pair(a, b) for a, b in zip((c.t_prev, c.f_prev, c.g_prev, c.gtd_prev), new)))
        at_t = _Bracket(*(_pair(a, a) for a in new))
        from_zero = _Bracket(*(_pair(a, b) for a, b in zip((zero, f, g, gtd), new)))  # max_ls ran out
        br_b = _select(~in_budget, from_zero, _select(curvature, at_t, around))
        lo, hi = t + 0.01 * (t - c.t_prev), t * 10  # extrapolation bounds
        t_next = _cubic_min(c.t_prev, c.f_prev, c.gtd_prev, t, f_new, gtd_new, lo, hi)

        # zoom: torch's update of the bracket with this evaluation
        br, low = c.bracket, c.low
        high = 1 - low
        fail = (f_new > f + _C1 * t * gtd) | (f_new >= br.f[low])
        wolfe = ~fail & (jnp.abs(gtd_new) <= -_C2 * gtd)
        flip = ~fail & ~wolfe & (gtd_new * (br.t[high] - br.t[low]) >= 0)
        # the old low end becomes the high end (flip); then the new point replaces high (fail) or low
        br_z = _Bracket(*(a.at[high].set(jnp.where(flip, a[low], a[high])) for a in br))
        slot = jnp.where(fail, high, low)
        br_z = _Bracket(*(a.at[slot].set(v) for a, v in zip(br_z, new)))
        low_z = jnp.where(fail, jnp.where(br_z.f[0] <= br_z.f[1], 0, 1), low).astype(i32)

        zooming = c.phase == _ZOOMING
        in_zoom = zooming | bracketed  # zooming now: decide whether the zoom goes on, and where
        br = _select(zooming, br_z, br_b)
        low = jnp.where(zooming, low_z, jnp.where(br.f[0] <= br.f[1], 0, 1)).astype(i32)
        done = jnp.where(zooming, wolfe, in_budget & curvature)
        ls_iter = jnp.where(zooming, c.ls_iter + 1, ls_iter_b).astype(i32)
        insuf = zooming & c.insuf_progress
        tiny = jnp.abs(br.t[1] - br.t[0]) * d_norm < _LS_TOLERANCE_CHANGE
        go_on = ~done & (ls_iter < max_ls) & ~tiny
        t_zoom, insuf_zoom = _zoom_trial(br, insuf)
        phase = jnp.where(in_zoom, jnp.where(go_on, _ZOOMING, _FINISHED), _EXTRAPOLATING).astype(i32)
        return _Search(
            phase=phase, first=jnp.zeros((), bool), trial=jnp.where(in_zoom, t_zoom, t_next), ls_iter=ls_iter,
            evals=c.evals + 1, t_prev=t, f_prev=f_new, g_prev=g_new, gtd_prev=gtd_new, done=done,
            insuf_progress=jnp.where(in_zoom & go_on, insuf_zoom, insuf), low=low, bracket=br,
        )

    out = lax.while_loop(cond, body, start)
    br = out.bracket
    return br.t[out.low], br.f[out.low], br.g[out.low], out.evals


# ------------------------------------------------------------------------------------------------------
# one outer step (torch's LBFGS.step)


class _Iteration(NamedTuple):
    x: jax.Array
    f: jax.Array
    g: jax.Array
    opt_cond: jax.Array
    fresh: jax.Array  # (f, g) are the loss and gradient at x
    it: jax.Array  # iterations in this outer step
    current_evals: jax.Array
    stop: jax.Array
    state: TorchLBFGSState


def _outer_step(
    evaluate: Callable[[jax.Array], tuple[jax.Array, jax.Array]],
    lr: float,
    max_iter: int,
    max_eval: int,
    tol_grad: float,
    tol_change: float,
    history_size: int,
    wolfe: bool,
    max_ls: int | None,
    dt: Any,
) -> Callable[..., tuple[jax.Array, jax.Array, jax.Array, jax.Array, TorchLBFGSState]]:
    lr_arr = jnp.asarray(lr, dt)
    m = history_size

    def body(c: _Iteration) -> _Iteration:
        s_ = c.state
        it = c.it + 1
        n_iter = s_.n_iter + 1
        first = n_iter == 1

        # curvature pair from the previous iteration (possibly of the previous outer step)
        y = c.g - s_.prev_flat_grad
        s = s_.d * s_.t
        ys = jnp.dot(y, s)
        store = ~first & (ys > _CURVATURE_MIN)
        full = s_.hist_count == m
        slot = (s_.hist_start + s_.hist_count) % m  # == hist_start when full: overwrite the oldest
        old_dirs = s_.old_dirs.at[slot].set(jnp.where(store, y, s_.old_dirs[slot]))
        old_stps = s_.old_stps.at[slot].set(jnp.where(store, s, s_.old_stps[slot]))
        ro = s_.ro.at[slot].set(jnp.where(store, 1.0 / ys, s_.ro[slot]))
        hist_start = jnp.where(store & full, (s_.hist_start + 1) % m, s_.hist_start)
        hist_count = jnp.where(store & ~full, s_.hist_count + 1, s_.hist_count)
        h_diag = jnp.where(store, ys / jnp.dot(y, y), s_.h_diag)
        # the first iteration ever empties the history
        hist_start = jnp.where(first, 0, hist_start).astype(jnp.int32)
        hist_count = jnp.where(first, 0, hist_count).astype(jnp.int32)
        h_diag = jnp.where(first, jnp.ones((), dt), h_diag)
        d = jnp.where(first, -c.g, _two_loop(c.g, old_dirs, old_stps, ro, hist_start, hist_count, h_diag))

        prev_flat_grad, prev_loss = c.g, c.f
        t = jnp.where(first, _pymin(jnp.ones((), dt), 1.0 / jnp.sum(jnp.abs(c.g))) * lr_arr, lr_arr)
        gtd = jnp.dot(c.g, d)
        go = ~(gtd > -tol_change)  # otherwise: stop before moving

        if wolfe:
            budget = max_eval - c.current_evals if max_ls is None else jnp.asarray(max_ls, jnp.int32)
            # no search (zero iterations) where the step stops before moving, or in a finished lane under vmap
            searching = go & ~c.stop
            t_ls, f_ls, g_ls, ls_evals = _strong_wolfe(evaluate, c.x, t, d, c.f, c.g, gtd, budget, searching)
            t = jnp.where(go, t_ls, t)
            f = jnp.where(go, f_ls, c.f)
            g = jnp.where(go, g_ls, c.g)
            ls_evals = jnp.where(go, ls_evals, 0).astype(jnp.int32)
            x = c.x + t * d
            opt_cond = jnp.where(go, jnp.max(jnp.abs(g)) <= tol_grad, c.opt_cond)
            fresh = jnp.ones((), bool)
        else:
            x = c.x + t * d
            re_evaluate = go & (it != max_iter)  # never re-evaluated after the step's last iteration

            def fresh_eval(_):
                f, g = evaluate(x)
                return f, g, jnp.max(jnp.abs(g)) <= tol_grad, jnp.ones((), jnp.int32)

            def keep(_):
                return c.f, c.g, c.opt_cond, jnp.zeros((), jnp.int32)

            if max_iter > 1:
                f, g, opt_cond, ls_evals = lax.cond(re_evaluate, fresh_eval, keep, None)
            else:  # max_iter == 1: the only iteration is the last; value_fn may be absent
                f, g, opt_cond, ls_evals = keep(None)
            fresh = jnp.where(go, re_evaluate, c.fresh)
        x = jnp.where(go, x, c.x)
        current_evals = c.current_evals + ls_evals
        stop = (
            ~go
            | (it == max_iter)
            | (current_evals >= max_eval)
            | opt_cond
            | (jnp.max(jnp.abs(d * t)) <= tol_change)
            | (jnp.abs(f - prev_loss) < tol_change)
        )
        state = s_._replace(
            d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, hist_start=hist_start,
            hist_count=hist_count, h_diag=h_diag, prev_flat_grad=prev_flat_grad, prev_loss=prev_loss,
            n_iter=n_iter, func_evals=s_.func_evals + ls_evals,
        )
        return _Iteration(x, f, g, opt_cond, fresh, it, current_evals, stop, state)

    def run(x0: jax.Array, f0: jax.Array, g0: jax.Array, state: TorchLBFGSState):
        opt_cond = jnp.max(jnp.abs(g0)) <= tol_grad
        carry = _Iteration(
            x=x0, f=f0, g=g0, opt_cond=opt_cond, fresh=jnp.ones((), bool), it=jnp.zeros((), jnp.int32),
            current_evals=jnp.ones((), jnp.int32), stop=opt_cond,
            state=state._replace(func_evals=state.func_evals + 1),
        )
        out = lax.while_loop(lambda c: ~c.stop, body, carry)
        return out.x, out.f, out.g, out.fresh, out.state

    return run
