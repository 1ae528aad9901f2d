"""Trace one SGHMC restart of a UCI split's final fit up to its divergence (see DIVERGENCE.md beside this).

Runs restart ``--restart`` of ``samplers.sghmc_model``'s final fit with the same starting point and the same
random streams as the sampler (``prior_starts`` of the first half of the key; momentum noise
``fold_in(k_noise, t)``; per-epoch permutations ``fold_in(k_batch, e)``), one restart alone, with the module's
public kernel ``samplers.sghmc.sghmc_step``. Every ``--every`` steps it prints the largest |theta| per layer
and the stability number of the step, ``h = eps^2 lambda_max(M^-1/2 H M^-1/2)`` with ``H`` the full-data
Hessian of U = -log p(D, theta) and ``M^-1`` the sampler's current preconditioner: for a quadratic U the
update ``v <- (1 - C) v - eps^2 M^-1 H theta; theta <- theta + v`` is stable iff ``0 < h < 2 (2 - C)`` (3.98
here). ``--fine-from T``: from step T on, one line per step with ``h`` of the step's own minibatch.

    BOOTENS_DATA_DIR=/work/main/.bootens_cache/uci-data nice -n 19 .venv/bin/python \\
        results/paper/uci-sghmc-sqrt-lr/study/divergence_trace.py --dataset wine --split 1 --noise-var 0.1 --restart 0
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from bootens_core import models, samplers
from bootens_core.data import uci
from bootens_core.perturb import gaussian_loglik
from bootens_core.samplers.sghmc import SGHMCHyper, sghmc_init, sghmc_step

from divergence_probe import cell_fit_key


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="wine")
    p.add_argument("--split", type=int, default=1)
    p.add_argument("--noise-var", type=float, default=0.1)
    p.add_argument("--restart", type=int, default=0)
    p.add_argument("--restarts", type=int, default=10)
    p.add_argument("--eps", type=float, default=math.sqrt(1e-3))
    p.add_argument("--mdecay", type=float, default=0.01)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--burn-in", type=int, default=2000)
    p.add_argument("--steps", type=int, default=42000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--fine-from", type=int, default=-1,
                   help="from this step on (a multiple of --every), one line per step with the minibatch's h")
    args = p.parse_args()
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.dtype(args.dtype)

    data = uci.load(args.dataset, args.split)
    x, y = jnp.asarray(data.x_train, dtype), jnp.asarray(data.y_train, dtype)
    n, b = len(y), min(args.batch, len(y))
    model = models.mlp(x.shape[1], (50,), "relu", weight_var=1.0, bias_var=1.0)
    _, unravel = ravel_pytree(models.zeros(model, dtype))
    nv = jnp.asarray(args.noise_var, dtype)

    def u(theta, xb, yb, scale):
        params = unravel(theta)
        loglik = gaussian_loglik(model.apply(params, xb), yb, nv)
        return -(scale * loglik + models.prior_logpdf(model, params))

    grad_u = jax.grad(u)
    k_init, k_restarts = jax.random.split(cell_fit_key(args.dataset, args.split))
    theta0 = samplers.prior_starts(k_init, model, args.restarts, dtype)[args.restart]
    k_noise, k_batch = jax.random.split(jax.random.split(k_restarts, args.restarts)[args.restart])
    hyper = SGHMCHyper(jnp.asarray(args.eps, dtype), jnp.asarray(args.mdecay, dtype))
    n_batches = n // b

    @jax.jit
    def advance(state, t0, k):
        def body(t, st):
            epoch, j = t // n_batches, t % n_batches
            perm = jax.random.permutation(jax.random.fold_in(k_batch, epoch), n).astype(jnp.int32)
            idx = jax.lax.dynamic_slice_in_dim(perm, j * b, b)
            g = grad_u(st.position, x[idx], y[idx], n / b) if b < n else grad_u(st.position, x, y, 1.0)
            st, _ = sghmc_step(jax.random.fold_in(k_noise, t), st, g, hyper, t < args.burn_in)
            return st
        return jax.lax.fori_loop(t0, t0 + k, body, state)

    @jax.jit
    def minibatch(t):
        perm = jax.random.permutation(jax.random.fold_in(k_batch, t // n_batches), n).astype(jnp.int32)
        return jax.lax.dynamic_slice_in_dim(perm, (t % n_batches) * b, b)

    @jax.jit
    def stability_mb(state, idx):
        """h of the step's own minibatch potential (N/B times the batch's likelihood, plus the prior)."""
        h = jax.hessian(u)(state.position, x[idx], y[idx], n / b)
        d = jnp.sqrt(1 / jnp.sqrt(state.v_hat))
        f = model.apply(unravel(state.position), x[idx])
        return hyper.step_size**2 * jnp.linalg.eigvalsh(d[:, None] * h * d[None, :])[-1], jnp.abs(f).max()

    @jax.jit
    def stability(state):
        h = jax.hessian(u)(state.position, x, y, 1.0)
        d = jnp.sqrt(1 / jnp.sqrt(state.v_hat))
        lam = jnp.linalg.eigvalsh(d[:, None] * h * d[None, :])
        return hyper.step_size**2 * lam[-1], hyper.step_size**2 * lam[0]

    sizes = [int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(models.zeros(model, dtype))]
    names = ["W1", "b1", "W2", "b2"] if len(sizes) == 4 else [f"leaf{i}" for i in range(len(sizes))]
    print(f"{args.dataset} split {args.split}: N {n}, B {b}, sigma^2 {args.noise_var}, eps {args.eps:.4g}, "
          f"C {args.mdecay}, burn-in {args.burn_in}, restart {args.restart}, {args.dtype}; stable iff h < "
          f"{2 * (2 - args.mdecay):.2f}")
    state, t = sghmc_init(theta0), 0
    while t < args.steps:
        fine = 0 <= args.fine_from <= t
        if fine:
            idx = minibatch(t)
            h_mb, fmax = (float(v) for v in stability_mb(state, idx))
            print(f"  step {t:6d} minibatch h {h_mb:9.3g}  max|f| {fmax:9.3g}  max|x| "
                  f"{float(jnp.abs(x[idx]).max()):6.3g}  "
                  f"max|theta| {float(jnp.abs(state.position).max()):9.3g}")
        state = advance(state, t, 1 if fine else args.every)
        t += 1 if fine else args.every
        if fine and t % args.every and np.isfinite(np.asarray(state.position)).all():
            continue
        pos = np.asarray(state.position)
        parts = np.split(pos, np.cumsum(sizes)[:-1])
        hmax, hmin = (float(v) for v in stability(state)) if np.isfinite(pos).all() else (math.nan, math.nan)
        minv = 1 / np.sqrt(np.asarray(state.v_hat, np.float64))
        print(f"step {t:6d} {'burn-in' if t <= args.burn_in else 'frozen '} "
              + " ".join(f"max|{nm}| {np.abs(pp).max():9.3g}" for nm, pp in zip(names, parts))
              + f"  max|v| {np.abs(np.asarray(state.momentum)).max():9.3g}"
              + f"  h_max {hmax:9.3g}  h_min {hmin:9.3g}"
              + f"  M^-1 med {np.median(minv):8.2g} max {minv.max():8.2g}", flush=True)
        if not np.isfinite(pos).all():
            break


if __name__ == "__main__":
    main()
