"""``bootens_core.ensemble.lbfgs.torch_lbfgs`` against torch.optim.LBFGS's algorithm.

Three references: a plain-numpy transcription of ``torch.optim.LBFGS.step`` written here (lists and loops,
no JAX), compared outer step by outer step on small float64 problems chosen to reach every rule (pairs
skipped for ``y.s <= 1e-10``, tolerance breaks, the ``max_eval`` budget, line searches running out of
evaluations, zoom with the insufficient-progress move); ``torch.optim.LBFGS`` itself where torch is
installed; and the transformation against itself (``vmap`` over particles = one particle at a time).
"""

from __future__ import annotations

import collections
import functools
import importlib
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from bootens_core import ensemble
from bootens_core.ensemble.lbfgs import TorchLBFGSState, torch_lbfgs
from bootens_core.models import mlp
from bootens_core.perturb import perturbed_log_joint

REL = 1e-10  # agreement asked of float64 runs, relative to max(1, max|x|)


# ------------------------------------------------------------------------------------------------------
# The numpy transcription of torch.optim.LBFGS (reference only; independent of bootens_core.ensemble.lbfgs)


def _cubic(x1, f1, g1, x2, f2, g2, bounds=None):
    """Minimiser of the cubic interpolating two points with slopes (torch's ``_cubic_interpolate``)."""
    if bounds is None:
        lo, hi = (x1, x2) if x1 <= x2 else (x2, x1)
    else:
        lo, hi = bounds
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    disc = d1**2 - g1 * g2
    if not disc >= 0:
        return (lo + hi) / 2.0
    d2 = np.sqrt(disc)
    if x1 <= x2:
        m = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        m = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(m, lo), hi)


class RefLBFGS:
    """torch.optim.LBFGS.step transcribed with numpy float64 vectors and Python lists.

    ``step(x, fg)`` takes one outer step from ``x`` with ``fg(x) -> (loss, grad)`` and returns the new
    ``x``. ``events`` counts the rules that fired (to check that a test reaches what it is meant to).
    """

    def __init__(self, lr, max_iter=20, max_eval=None, tolerance_grad=1e-7, tolerance_change=1e-9,
                 history_size=100, line_search_fn=None, max_ls=None):
        self.lr, self.max_iter = lr, max_iter
        self.max_eval = max_iter * 5 // 4 if max_eval is None else max_eval
        self.tol_grad, self.tol_change, self.history_size = tolerance_grad, tolerance_change, history_size
        self.wolfe = line_search_fn == "strong_wolfe"
        self.max_ls = max_ls
        self.func_evals = 0
        self.n_iter = 0
        self.ys_hist, self.ss_hist, self.rho_hist = [], [], []  # y (torch old_dirs), s (old_stps), 1/ys
        self.h_diag = 1.0
        self.d = self.t = self.prev_g = self.prev_f = None
        self.events = collections.Counter()

    def _line_search(self, fg, x, t, d, f, g, gtd, max_ls):
        c1, c2, tol = 1e-4, 0.9, 1e-9
        dnorm = np.max(np.abs(d))
        evals = 0

        def phi(step):
            nonlocal evals
            evals += 1
            fn, gn = fg(x + step * d)
            return fn, gn, np.dot(gn, d)

        fn, gn, gtdn = phi(t)
        tp, fp, gp, gtdp = 0, f, g, gtd
        done = False
        k = 0
        pts = None
        while k < max_ls:
            if fn > f + c1 * t * gtd or (k > 1 and fn >= fp):
                pts = [[tp, fp, gp, gtdp], [t, fn, gn, gtdn]]
                break
            if abs(gtdn) <= -c2 * gtd:
                pts = [[t, fn, gn, gtdn]]
                done = True
                break
            if gtdn >= 0:
                pts = [[tp, fp, gp, gtdp], [t, fn, gn, gtdn]]
                break
            t_new = _cubic(tp, fp, gtdp, t, fn, gtdn, bounds=(t + 0.01 * (t - tp), t * 10))
            tp, fp, gp, gtdp = t, fn, gn, gtdn
            t = t_new
            fn, gn, gtdn = phi(t)
            k += 1
            self.events["ls_extrapolate"] += 1
        if k == max_ls:
            self.events["ls_out_of_evals"] += 1
            pts = [[0, f, g, None], [t, fn, gn, gtdn]]
        lo = 0 if pts[0][1] <= pts[-1][1] else 1
        hi = 1 - lo
        insuf = False
        while not done and k < max_ls:
            if abs(pts[1][0] - pts[0][0]) * dnorm < tol:
                self.events["ls_tiny_bracket"] += 1
                break
            self.events["ls_zoom"] += 1
            t = _cubic(pts[0][0], pts[0][1], pts[0][3], pts[1][0], pts[1][1], pts[1][3])
            top, bot = max(pts[0][0], pts[1][0]), min(pts[0][0], pts[1][0])
            eps = 0.1 * (top - bot)
            if min(top - t, t - bot) < eps:
                if insuf or t >= top or t <= bot:
                    self.events["ls_insufficient_progress_move"] += 1
                    t = top - eps if abs(t - top) < abs(t - bot) else bot + eps
                    insuf = False
                else:
                    insuf = True
            else:
                insuf = False
            fn, gn, gtdn = phi(t)
            k += 1
            if fn > f + c1 * t * gtd or fn >= pts[lo][1]:
                pts[hi] = [t, fn, gn, gtdn]
                lo = 0 if pts[0][1] <= pts[1][1] else 1
                hi = 1 - lo
            else:
                if abs(gtdn) <= -c2 * gtd:
                    done = True
                elif gtdn * (pts[hi][0] - pts[lo][0]) >= 0:
                    self.events["ls_flip"] += 1
                    pts[hi] = list(pts[lo])
                pts[lo] = [t, fn, gn, gtdn]
        t, fn, gn = pts[lo][0], pts[lo][1], pts[lo][2]
        return fn, gn, t, evals

    def step(self, x, fg):
        x = np.array(x, dtype=np.float64)
        f, g = fg(x)
        evals = 1
        self.func_evals += 1
        opt = np.max(np.abs(g)) <= self.tol_grad
        if opt:
            self.events["return_at_start"] += 1
            return x
        inner = 0
        while inner < self.max_iter:
            inner += 1
            self.n_iter += 1
            if self.n_iter == 1:
                d = -g
                self.ys_hist, self.ss_hist, self.rho_hist = [], [], []
                self.h_diag = 1.0
            else:
                y = g - self.prev_g
                s = self.d * self.t
                ys = np.dot(y, s)
                if ys > 1e-10:
                    if len(self.ys_hist) == self.history_size:
                        self.events["history_full"] += 1
                        del self.ys_hist[0], self.ss_hist[0], self.rho_hist[0]
                    self.ys_hist.append(y)
                    self.ss_hist.append(s)
                    self.rho_hist.append(1.0 / ys)
                    self.h_diag = ys / np.dot(y, y)
                else:
                    self.events["pair_skipped"] += 1
                n = len(self.ys_hist)
                alpha = [None] * n
                q = -g
                for i in reversed(range(n)):
                    alpha[i] = np.dot(self.ss_hist[i], q) * self.rho_hist[i]
                    q = q - alpha[i] * self.ys_hist[i]
                r = q * self.h_diag
                for i in range(n):
                    beta = np.dot(self.ys_hist[i], r) * self.rho_hist[i]
                    r = r + (alpha[i] - beta) * self.ss_hist[i]
                d = r
            self.d = d
            self.prev_g, self.prev_f = g, f
            t = min(1.0, 1.0 / np.sum(np.abs(g))) * self.lr if self.n_iter == 1 else self.lr
            self.t = t
            gtd = np.dot(g, d)
            if gtd > -self.tol_change:
                self.events["break_gtd"] += 1
                break
            ls_evals = 0
            if self.wolfe:
                max_ls = self.max_eval - evals if self.max_ls is None else self.max_ls
                f, g, t, ls_evals = self._line_search(fg, x, t, d, f, g, gtd, max_ls)
                self.t = t
                x = x + t * d
                opt = np.max(np.abs(g)) <= self.tol_grad
            else:
                x = x + t * d
                if inner != self.max_iter:
                    f, g = fg(x)
                    opt = np.max(np.abs(g)) <= self.tol_grad
                    ls_evals = 1
            evals += ls_evals
            self.func_evals += ls_evals
            if evals > self.max_eval:
                self.events["evals_over_max_eval"] += 1
            if inner == self.max_iter:
                self.events["break_max_iter"] += 1
                break
            if evals >= self.max_eval:
                self.events["break_max_eval"] += 1
                break
            if opt:
                self.events["break_tolerance_grad"] += 1
                break
            if np.max(np.abs(d * t)) <= self.tol_change:
                self.events["break_small_step"] += 1
                break
            if abs(f - self.prev_f) < self.tol_change:
                self.events["break_small_loss_change"] += 1
                break
        return x


# ------------------------------------------------------------------------------------------------------
# Test problems: a numpy (loss, grad) for the reference and a JAX loss of a parameter pytree


def rosenbrock_np(x):
    a, b = x[:-1], x[1:]
    r = b - a**2
    f = np.sum(100.0 * r**2 + (1.0 - a) ** 2)
    g = np.zeros_like(x)
    g[:-1] += -400.0 * a * r - 2.0 * (1.0 - a)
    g[1:] += 200.0 * r
    return f, g


def rosenbrock_jax(p):
    x = jnp.concatenate([p["head"], p["tail"]])
    a, b = x[:-1], x[1:]
    return jnp.sum(100.0 * (b - a**2) ** 2 + (1.0 - a) ** 2)


def rosenbrock_tree(x):
    return {"head": jnp.asarray(x[:2]), "tail": jnp.asarray(x[2:])}


_RNG = np.random.default_rng(0)
MLP_X = _RNG.normal(size=(16, 2))
MLP_Y = np.sin(2.0 * MLP_X[:, 0]) + 0.5 * MLP_X[:, 1] + 0.1 * _RNG.normal(size=16)
HIDDEN = 6
MLP_SHAPES = [(2, HIDDEN), (HIDDEN,), (HIDDEN,), ()]
MLP_DECAY = 0.1  # well conditioned: rounding differences are not amplified


def _split(x):
    out, i = [], 0
    for shape in MLP_SHAPES:
        k = int(np.prod(shape))
        out.append(x[i: i + k].reshape(shape))
        i += k
    return out


def mlp_np(x, act="tanh"):
    w1, b1, w2, b2 = _split(x)
    z = MLP_X @ w1 + b1
    h = np.tanh(z) if act == "tanh" else np.maximum(z, 0.0)
    res = h @ w2 + b2 - MLP_Y
    n = MLP_Y.shape[0]
    f = np.sum(res**2) / n + 0.5 * MLP_DECAY * np.sum(x**2)
    dres = 2.0 * res / n
    dh = np.outer(dres, w2)
    dz = dh * (1.0 - h**2) if act == "tanh" else dh * (z > 0)
    g = np.concatenate([(MLP_X.T @ dz).ravel(), dz.sum(0), h.T @ dres, [dres.sum()]])
    return f, g + MLP_DECAY * x


def mlp_jax(p, act="tanh"):
    w1, b1, w2, b2 = p
    z = jnp.asarray(MLP_X, w1.dtype) @ w1 + b1
    h = jnp.tanh(z) if act == "tanh" else jax.nn.relu(z)
    res = h @ w2 + b2 - jnp.asarray(MLP_Y, w1.dtype)
    flat, _ = ravel_pytree(p)
    return jnp.sum(res**2) / res.shape[0] + 0.5 * MLP_DECAY * jnp.sum(flat**2)


def mlp_tree(x, dtype=jnp.float64):
    return tuple(jnp.asarray(a, dtype) for a in _split(np.asarray(x)))


def mlp_start(seed=1):
    n = sum(int(np.prod(s)) for s in MLP_SHAPES)
    return 0.7 * np.random.default_rng(seed).normal(size=n)


def wavy_np(x):
    """Non-convex near 0 (negative curvature): early pairs have y.s < 0 and are skipped."""
    return np.sum(np.cos(x)) + 0.1 * np.sum(x**2), -np.sin(x) + 0.2 * x


def wavy_jax(p):
    return jnp.sum(jnp.cos(p)) + 0.1 * jnp.sum(p**2)


_A_FACTOR = np.random.default_rng(3).normal(size=(5, 5))
QUAD_A = _A_FACTOR @ _A_FACTOR.T / 5 + np.eye(5)
QUAD_B = np.arange(1.0, 6.0)


def quad_np(x):
    ax = QUAD_A @ x
    return 0.5 * np.dot(x, ax) - np.dot(QUAD_B, x), ax - QUAD_B


def quad_jax(p):
    return 0.5 * jnp.dot(p, jnp.asarray(QUAD_A) @ p) - jnp.dot(jnp.asarray(QUAD_B), p)


def softplus_np(x):
    """Its strong-Wolfe searches from ``lr = 10`` need the insufficient-progress move of the zoom."""
    return np.sum(np.logaddexp(0.0, 5.0 * x) - x), 5.0 / (1.0 + np.exp(-5.0 * x)) - 1.0


def softplus_jax(p):
    return jnp.sum(jnp.logaddexp(0.0, 5.0 * p) - p)


_SCALE = 1e10  # a steep quadratic: steps get tiny while the loss still changes (the max|t d| break)


def steep_quad_np(x):
    f, g = quad_np(x)
    return _SCALE * f, _SCALE * g


def steep_quad_jax(p):
    return _SCALE * quad_jax(p)


def linear_np(x):
    """Unbounded below: the line search extrapolates until it runs out of evaluations."""
    return -2.0 * x[0], np.array([-2.0])


def linear_jax(p):
    return -2.0 * p[0]


# ------------------------------------------------------------------------------------------------------
# Running the transformation


def make_step(tx, loss):
    def step(params, state):
        value, grad = jax.value_and_grad(loss)(params)
        updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(params, updates), state

    return jax.jit(step)


def compare_with_reference(tx, ref, loss_jax, fg_np, x0, to_tree, steps):
    """Run both for ``steps`` outer steps; return the largest relative parameter difference."""
    params = to_tree(x0)
    state = tx.init(params)
    step = make_step(tx, loss_jax)
    x_ref = np.asarray(x0, dtype=np.float64)
    worst = 0.0
    for k in range(steps):
        params, state = step(params, state)
        x_ref = ref.step(x_ref, fg_np)
        x_jax = np.asarray(ravel_pytree(params)[0])
        err = np.max(np.abs(x_jax - x_ref)) / max(1.0, np.max(np.abs(x_ref)))
        worst = max(worst, err)
        assert err <= REL, f"outer step {k + 1}: relative difference {err:.3e}"
        assert int(state.n_iter) == ref.n_iter, f"outer step {k + 1}: n_iter"
        assert int(state.func_evals) == ref.func_evals, f"outer step {k + 1}: func_evals"
        assert int(state.hist_count) == len(ref.ys_hist), f"outer step {k + 1}: stored pairs"
        if ref.t is not None:
            np.testing.assert_allclose(float(state.t), float(ref.t), rtol=1e-8)
    assert np.all(np.isfinite(x_ref))
    return worst


ROSEN_A = np.array([0.5, 0.2, 0.3, 0.1])
ROSEN_B = np.array([-0.6, 0.5, -0.25, 0.4])
WOLFE = "strong_wolfe"

# Each case: torch_lbfgs kwargs, numpy (loss, grad), JAX loss, start, start -> parameter pytree, outer
# steps, and the reference events it must reach. Problems and step counts are chosen where the
# trajectory is not chaotic (a 1-ulp change of the start moves the result by ~1e-14, not 1e-8), so that
# rounding differences between numpy and XLA stay far below the 1e-10 asked.
CASES = {
    "rosenbrock-fixed-lr0.5": (
        {"learning_rate": 0.5}, rosenbrock_np, rosenbrock_jax, ROSEN_A, rosenbrock_tree, 8,
        ["break_max_iter", "pair_skipped", "break_gtd", "break_small_loss_change"],
    ),
    "rosenbrock-fixed-lr0.1-history-full": (
        {"learning_rate": 0.1}, rosenbrock_np, rosenbrock_jax, ROSEN_B, rosenbrock_tree, 6,
        ["break_max_iter", "history_full"],
    ),
    "rosenbrock-wolfe": (
        {"learning_rate": 1.0, "line_search_fn": WOLFE}, rosenbrock_np, rosenbrock_jax, ROSEN_A,
        rosenbrock_tree, 6, ["ls_extrapolate", "ls_zoom", "break_max_eval", "break_gtd"],
    ),
    "rosenbrock-wolfe-max-eval-6": (
        {"learning_rate": 0.5, "line_search_fn": WOLFE, "max_eval": 6}, rosenbrock_np, rosenbrock_jax,
        ROSEN_B, rosenbrock_tree, 6, ["break_max_eval", "ls_out_of_evals", "ls_zoom"],
    ),
    "rosenbrock-wolfe-max-eval-6-legacy-max-ls-25": (
        {"learning_rate": 0.5, "line_search_fn": WOLFE, "max_eval": 6, "max_ls": 25}, rosenbrock_np,
        rosenbrock_jax, ROSEN_B, rosenbrock_tree, 6, ["break_max_eval", "evals_over_max_eval"],
    ),
    "mlp-tanh-fixed-lr0.5": (
        {"learning_rate": 0.5}, mlp_np, mlp_jax, mlp_start(1), mlp_tree, 8,
        ["break_max_iter", "break_small_loss_change", "pair_skipped"],
    ),
    "mlp-tanh-fixed-lr0.2": (
        {"learning_rate": 0.2}, mlp_np, mlp_jax, mlp_start(1), mlp_tree, 8, ["history_full"],
    ),
    "mlp-tanh-wolfe-lr0.2": (
        {"learning_rate": 0.2, "line_search_fn": WOLFE}, mlp_np, mlp_jax, mlp_start(2), mlp_tree, 8,
        ["ls_extrapolate", "break_small_loss_change"],
    ),
    "mlp-relu-fixed-lr0.5-history-10": (
        {"learning_rate": 0.5, "history_size": 10}, lambda x: mlp_np(x, "relu"), lambda p: mlp_jax(p, "relu"),
        mlp_start(1), mlp_tree, 5, ["history_full"],
    ),
    "wavy-fixed-lr0.5-skips-pairs": (
        {"learning_rate": 0.5}, wavy_np, wavy_jax, np.array([0.3, -0.2, 0.1, 0.5]), jnp.asarray, 6,
        ["pair_skipped", "break_gtd"],
    ),
    "quadratic-wolfe-loss-change-break": (
        {"learning_rate": 1.0, "line_search_fn": WOLFE}, quad_np, quad_jax, np.zeros(5), jnp.asarray, 4,
        ["break_small_loss_change", "break_gtd"],
    ),
    "quadratic-wolfe-tolerance-grad-break": (
        {"learning_rate": 1.0, "line_search_fn": WOLFE, "tolerance_grad": 1e-4}, quad_np, quad_jax,
        np.zeros(5), jnp.asarray, 3, ["break_tolerance_grad", "return_at_start"],
    ),
    "quadratic-fixed-tolerance-grad-break": (
        {"learning_rate": 1.0, "tolerance_grad": 1e-4}, quad_np, quad_jax, np.ones(5), jnp.asarray, 3,
        ["break_tolerance_grad", "return_at_start"],
    ),
    "steep-quadratic-fixed-small-step-break": (
        {"learning_rate": 1.0}, steep_quad_np, steep_quad_jax, np.ones(5), jnp.asarray, 4,
        ["break_small_step", "break_gtd"],
    ),
    "softplus-wolfe-lr10-insufficient-progress": (
        {"learning_rate": 10.0, "line_search_fn": WOLFE}, softplus_np, softplus_jax,
        np.array([-1.2, 1.0, -0.5, 0.8]), jnp.asarray, 4,
        ["ls_insufficient_progress_move", "ls_flip", "break_max_eval"],
    ),
    "linear-wolfe-search-runs-out": (
        {"learning_rate": 1.0, "line_search_fn": WOLFE}, linear_np, linear_jax, np.array([0.5]), jnp.asarray,
        2, ["ls_out_of_evals", "ls_tiny_bracket"],
    ),
    "linear-wolfe-search-runs-out-legacy-max-ls-25": (
        {"learning_rate": 1.0, "line_search_fn": WOLFE, "max_ls": 25}, linear_np, linear_jax, np.array([0.5]),
        jnp.asarray, 2, ["ls_out_of_evals", "evals_over_max_eval"],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_numpy_transcription_of_torch(name):
    kwargs, fg_np, loss_jax, x0, to_tree, steps, must = CASES[name]
    tx = torch_lbfgs(**kwargs)
    ref_kwargs = dict(kwargs)
    ref = RefLBFGS(ref_kwargs.pop("learning_rate"), **ref_kwargs)
    with np.errstate(all="ignore"):
        compare_with_reference(tx, ref, loss_jax, fg_np, x0, to_tree, steps)
    missing = [e for e in must if not ref.events[e]]
    assert not missing, f"{name} did not reach {missing}; events {dict(ref.events)}"


# ------------------------------------------------------------------------------------------------------
# vmap over particles, jit, lax.scan


def _flat(tree):
    return np.asarray(ravel_pytree(tree)[0])


def _run_each_alone(tx, loss, starts, steps):
    """Every particle on its own, one jitted outer step at a time: (steps, k, n) params, (steps, k) counts."""
    step = make_step(tx, loss)
    xs, iters, evals = [], [], []
    for start in starts:
        params, state = start, tx.init(start)
        x_p, it_p, ev_p = [], [], []
        for _ in range(steps):
            params, state = step(params, state)
            x_p.append(_flat(params))
            it_p.append(int(state.n_iter))
            ev_p.append(int(state.func_evals))
        xs.append(x_p)
        iters.append(it_p)
        evals.append(ev_p)
    return np.swapaxes(np.array(xs), 0, 1), np.array(iters).T, np.array(evals).T


def _run_batched(tx, loss, starts, steps):
    """All particles at once: ``jax.jit`` of a ``lax.scan`` over outer steps of ``jax.vmap(update)``."""

    def one(params, state):
        value, grad = jax.value_and_grad(loss)(params)
        updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(params, updates), state

    @jax.jit
    def run(params, state):
        def body(carry, _):
            params, state = jax.vmap(one)(*carry)
            return (params, state), (params, state.n_iter, state.func_evals)

        return jax.lax.scan(body, (params, state), None, length=steps)[1]

    params = jax.tree.map(lambda *leaves: jnp.stack(leaves), *starts)
    traj, iters, evals = run(params, jax.vmap(tx.init)(params))
    flat = np.asarray(jax.vmap(jax.vmap(lambda tree: ravel_pytree(tree)[0]))(traj))  # (steps, k, n)
    return flat, np.asarray(iters), np.asarray(evals)


QUAD_MIN = np.linalg.solve(QUAD_A, QUAD_B)

VMAP_CASES = {
    # particles that stop at different inner iterations: one sits at the minimum (returns at once)
    "rosenbrock-wolfe": (
        {"learning_rate": 0.5, "line_search_fn": WOLFE}, rosenbrock_jax,
        [rosenbrock_tree(x) for x in (ROSEN_A, np.ones(4), ROSEN_B, np.array([0.9, 0.8, 0.7, 0.5]))], 5,
    ),
    "quadratic-fixed-tolerance-breaks": (
        {"learning_rate": 1.0, "tolerance_grad": 1e-4}, quad_jax,
        [jnp.asarray(x) for x in (np.ones(5), QUAD_MIN, np.zeros(5), -2.0 * np.ones(5))], 3,
    ),
    "mlp-fixed-lr0.5": ({"learning_rate": 0.5}, mlp_jax, [mlp_tree(mlp_start(s)) for s in (1, 2, 3)], 6),
}


@pytest.mark.parametrize("name", list(VMAP_CASES))
def test_vmap_over_particles_equals_each_particle_alone(name):
    kwargs, loss, starts, steps = VMAP_CASES[name]
    tx = torch_lbfgs(**kwargs)
    x_alone, it_alone, ev_alone = _run_each_alone(tx, loss, starts, steps)
    x_batch, it_batch, ev_batch = _run_batched(tx, loss, starts, steps)
    np.testing.assert_array_equal(it_batch, it_alone)
    np.testing.assert_array_equal(ev_batch, ev_alone)
    scale = np.maximum(1.0, np.max(np.abs(x_alone), axis=-1, keepdims=True))
    # The batched and the single programs round differently (how, depends on XLA's code generation), and the
    # iterations amplify rounding: the yardstick is how far each particle alone moves when its start moves by
    # one unit in the last place. The batched particles must stay within 10 times that (and 1e-12 at least).
    ulp_starts = [jax.tree_util.tree_map(lambda a: a * (1 + 2.0**-52), s) for s in starts]
    x_ulp, _, _ = _run_each_alone(tx, loss, ulp_starts, steps)
    sensitivity = np.max(np.abs(x_ulp - x_alone) / scale)
    assert sensitivity < 1e-9  # the trajectories are stable enough for the comparison to mean something
    assert np.max(np.abs(x_batch - x_alone) / scale) <= max(10 * sensitivity, 1e-12)
    # the particles really took inner loops of different lengths
    assert len({tuple(col) for col in it_alone.T}) == len(starts)


def test_state_is_arrays_with_a_leading_particle_axis_under_vmap():
    tx = torch_lbfgs(0.5, history_size=7)
    params = {"w": jnp.zeros((3, 2, 4)), "b": jnp.zeros((3,))}  # 3 particles of 9 parameters
    state = jax.vmap(tx.init)(params)
    assert isinstance(state, TorchLBFGSState)
    assert state.old_dirs.shape == (3, 7, 9) and state.old_stps.shape == (3, 7, 9)
    assert state.d.shape == (3, 9) and state.ro.shape == (3, 7)
    assert state.n_iter.shape == (3,) and state.func_evals.shape == (3,)
    assert jax.tree.structure(state.grad) == jax.tree.structure(params)
    assert bool(jnp.all(jnp.isinf(state.value)))


# ------------------------------------------------------------------------------------------------------
# float32


def _reference_mlp_final(lr, line_search_fn, steps=32):
    """The float64 numpy reference's MLP parameters after ``steps`` outer steps from ``mlp_start(1)``."""
    ref = RefLBFGS(lr, line_search_fn=line_search_fn)
    x = mlp_start(1)
    for _ in range(steps):
        x = ref.step(x, mlp_np)
    return x


@pytest.mark.parametrize("line_search_fn", [None, WOLFE])
def test_float32_runs_and_stays_finite(line_search_fn):
    """32 outer steps in float32 (state scalars in float32 too): finite, and the float64 optimum's loss."""
    tx = torch_lbfgs(0.5, line_search_fn=line_search_fn)
    start = mlp_tree(mlp_start(1), jnp.float32)

    @jax.jit
    def run(params):
        def body(carry, _):
            params, state = carry
            value, grad = jax.value_and_grad(mlp_jax)(params)
            updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=mlp_jax)
            return (optax.apply_updates(params, updates), state), value

        return jax.lax.scan(body, (params, tx.init(params)), None, length=32)

    (params, state), losses = run(start)
    for leaf in (*jax.tree.leaves(params), state.d, state.t, state.h_diag, state.old_dirs, state.prev_loss):
        assert leaf.dtype == jnp.float32
        assert bool(jnp.all(jnp.isfinite(leaf)))
    assert state.n_iter.dtype == jnp.int32
    final = float(mlp_jax(params))
    best64 = mlp_np(_reference_mlp_final(0.5, line_search_fn))[0]
    assert float(losses[0]) > 2 * final
    assert abs(final - best64) <= 1e-4 * abs(best64)


# ------------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"learning_rate": 0.0}, "learning rate"),
        ({"learning_rate": -0.5}, "learning rate"),
        ({"learning_rate": float("nan")}, "learning rate"),
        ({"learning_rate": 0.5, "line_search_fn": "backtracking"}, "line_search_fn"),
        ({"learning_rate": 0.5, "max_iter": 0}, "max_iter"),
        ({"learning_rate": 0.5, "max_eval": 0}, "max_eval"),
        ({"learning_rate": 0.5, "history_size": 0}, "history_size"),
        ({"learning_rate": 0.5, "tolerance_grad": -1.0}, "tolerance_grad"),
        ({"learning_rate": 0.5, "tolerance_change": float("inf")}, "tolerance_change"),
        ({"learning_rate": 0.5, "line_search_fn": WOLFE, "max_ls": -1}, "max_ls"),
    ],
)
def test_bad_arguments_raise_one_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        torch_lbfgs(**kwargs)


def test_update_needs_value_fn_and_params():
    tx = torch_lbfgs(0.5)
    params = jnp.ones(3)
    state = tx.init(params)
    with pytest.raises(ValueError, match="value_fn"):
        tx.update(params, state, params, value=1.0, grad=params)
    with pytest.raises(ValueError, match="params"):
        tx.update(params, state, None, value=1.0, grad=params, value_fn=jnp.sum)
    with pytest.raises(ValueError, match="floating"):
        tx.init(jnp.ones(3, jnp.int32))


def test_single_iteration_steps_need_no_value_fn():
    """``max_iter=1`` with fixed steps never re-evaluates (torch skips the last iteration's evaluation)."""
    tx = torch_lbfgs(0.5, max_iter=1)
    ref = RefLBFGS(0.5, max_iter=1)
    params, x_ref = jnp.ones(5), np.ones(5)
    state = tx.init(params)

    @jax.jit
    def step(params, state):
        value, grad = jax.value_and_grad(quad_jax)(params)
        updates, state = tx.update(grad, state, params, value=value, grad=grad)
        return optax.apply_updates(params, updates), state

    for _ in range(6):
        params, state = step(params, state)
        x_ref = ref.step(x_ref, quad_np)
        np.testing.assert_allclose(np.asarray(params), x_ref, rtol=1e-12, atol=1e-12)
    assert int(state.n_iter) == ref.n_iter == 6 and int(state.func_evals) == ref.func_evals == 6


# ------------------------------------------------------------------------------------------------------
# pluggable into bootens_core.ensemble (one update per ensemble step; line-search values reused)


def _particle(i, leaf):
    return leaf[i]


def test_ensemble_train_takes_torch_lbfgs():
    """``ensemble.train`` with ``Optimizer(torch_lbfgs(...), needs_value=True)``: each particle's path is that
    of the transformation run alone on its perturbed loss. With strong Wolfe the state's ``value``/``grad``
    (the line search's last evaluation) are reused as the next step's first evaluation."""
    model = mlp(1, (5,), "tanh")
    x = np.linspace(-2.0, 2.0, 12)
    noise_var = 0.1
    tx = torch_lbfgs(0.5, max_iter=5, line_search_fn=WOLFE)
    opt = ensemble.Optimizer(tx, True, "torch L-BFGS, strong Wolfe")
    res = ensemble.train(jax.random.key(0), model, x, np.sin(x), noise_var=noise_var, n_particles=3, opt=opt,
                         steps=4)
    xj = jnp.asarray(x)

    @jax.jit
    def step(params, state, pert):
        def loss(p):
            return -perturbed_log_joint(model, p, xj, pert, noise_var)

        value, grad = jax.value_and_grad(loss)(params)
        updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(params, updates), state

    for i in range(3):
        pick = functools.partial(_particle, i)
        params = jax.tree.map(pick, res.init_params)
        state = tx.init(params)
        for _ in range(4):
            params, state = step(params, state, jax.tree.map(pick, res.perturbation))
        assert np.isfinite(float(state.value))  # the cached evaluation the ensemble reused
        got, want = _flat(jax.tree.map(pick, res.params)), _flat(params)
        assert np.max(np.abs(got - want)) <= 1e-9 * max(1.0, np.max(np.abs(want)))


# ------------------------------------------------------------------------------------------------------
# against torch.optim.LBFGS itself


def _torch_mlp_loss(torch, params):
    w1, b1, w2, b2 = params
    xt, yt = torch.tensor(MLP_X), torch.tensor(MLP_Y)
    z = xt @ w1 + b1
    res = torch.tanh(z) @ w2 + b2 - yt
    flat = torch.cat([p.reshape(-1) for p in params])
    return torch.sum(res**2) / res.shape[0] + 0.5 * MLP_DECAY * torch.sum(flat**2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0.5},
        {"lr": 0.2},
        {"lr": 1.0, "line_search_fn": WOLFE},
        {"lr": 1.0, "line_search_fn": WOLFE, "max_eval": 8},
    ],
    ids=["fixed-lr0.5", "fixed-lr0.2", "wolfe-lr1", "wolfe-lr1-max-eval-8"],
)
def test_matches_torch_optim_lbfgs(kwargs):
    torch = pytest.importorskip("torch")
    source = inspect.getsource(importlib.import_module("torch.optim.lbfgs"))
    # PyTorch >= 2.10 caps the line search at the step's remaining evaluations; older releases at 25.
    max_ls = None if "max_ls=max_eval - current_evals" in source else 25

    start = mlp_start(1)
    t_params = [torch.tensor(a.copy(), dtype=torch.float64, requires_grad=True) for a in _split(start)]
    kw = dict(kwargs)
    lr = kw.pop("lr")
    opt = torch.optim.LBFGS(t_params, lr=lr, **kw)

    def closure():
        opt.zero_grad()
        loss = _torch_mlp_loss(torch, t_params)
        loss.backward()
        return loss

    tx = torch_lbfgs(lr, max_ls=max_ls, **kw)
    params = mlp_tree(start)
    state = tx.init(params)
    step = make_step(tx, mlp_jax)
    worst = 0.0
    for k in range(32):
        opt.step(closure)
        params, state = step(params, state)
        want = torch.cat([p.detach().reshape(-1) for p in t_params]).numpy()
        err = np.max(np.abs(_flat(params) - want)) / max(1.0, np.max(np.abs(want)))
        worst = max(worst, err)
        assert err <= REL, f"outer step {k + 1}: relative difference {err:.3e}"
        t_state = opt.state[t_params[0]]
        assert int(state.n_iter) == t_state["n_iter"] and int(state.func_evals) == t_state["func_evals"]
    t_state = opt.state[t_params[0]]
    assert int(state.hist_count) == len(t_state["old_dirs"])
    np.testing.assert_allclose(float(state.t), float(t_state["t"]), rtol=1e-8)
    np.testing.assert_allclose(float(state.h_diag), float(t_state["H_diag"]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state.d), t_state["d"].numpy(), rtol=1e-6, atol=1e-12)
