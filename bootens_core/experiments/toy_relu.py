"""Figure 4: the toy network ``f(x) = ReLU(w1 x) + ReLU(w2 x)``: ensemble vs MH vs the exact posterior.

With two weights the posterior is computed exactly on a grid, so beside the paper's reference (random-walk
Metropolis-Hastings) the KL curve is also measured against the truth, and the MH reference itself is graded.
KLs are ``KL(KDE(samples) || p)`` on the grid (the paper's KDE + numerical integration); the KL that 200
exact posterior samples get from the same estimator (the KDE self-distance) is the floor it can reach.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from .. import density, ensemble, mcmc, models, store
from ..config import ToyReluConfig
from ..data import synthetic

__all__ = ["NAME", "DESCRIPTION", "ARTEFACTS", "Config", "run", "QUADRANTS", "RECORD_KEYS", "rhat_null_quantile"]

NAME = "toy-relu"
DESCRIPTION = "Toy ReLU network (2 weights): ensemble vs Metropolis-Hastings vs the exact grid posterior, KL curve"
ARTEFACTS = ("Figure 4",)
Config = ToyReluConfig
QUADRANTS = ("w1>0, w2>0", "w1>0, w2<0", "w1<0, w2>0", "w1<0, w2<0")
# The summary numbers a chapter shows side by side for two runs (e.g. quick profile vs a committed paper run).
RECORD_KEYS = (
    "kl_steps_evaluated", "kl_monotone_fraction", "kl_max_increase", "kl_max_increase_step",
    "kl_monotone_fraction_exact", "kl_max_increase_exact", "kl_min_vs_exact_step", "kl_settled_step",
    "kl_final_vs_mh", "kl_final_vs_exact", "kl_mh_vs_exact", "rhat_max", "ess_min",
)


def run(
    key: jax.Array, cfg: ToyReluConfig, *, use_cache: bool = True, force: bool = False, progress: bool = False
) -> store.Result:
    """Run the toy-ReLU experiment (see the module docstring); summary keys in the README."""
    return store.cached(NAME, key, cfg, lambda: _compute(key, cfg, progress), use_cache=use_cache, force=force)


def _quadrant_mass(w: np.ndarray) -> np.ndarray:
    """Fractions of ``(k, 2)`` weights in each quadrant, in the order of :data:`QUADRANTS`."""
    s1, s2 = w[:, 0] > 0, w[:, 1] > 0
    return np.array([np.mean(s1 & s2), np.mean(s1 & ~s2), np.mean(~s1 & s2), np.mean(~s1 & ~s2)])


def _grid_quadrant_mass(log_p: np.ndarray, g: density.Grid2D) -> np.ndarray:
    """Posterior mass of each quadrant, by Riemann sums on the grid (cells on an axis split evenly)."""
    p = np.exp(log_p)
    wa = np.where(g.a > 0, 1.0, np.where(g.a < 0, 0.0, 0.5))
    wb = np.where(g.b > 0, 1.0, np.where(g.b < 0, 0.0, 0.5))
    total = p.sum()
    return np.array([
        (p * np.outer(wa, wb)).sum(), (p * np.outer(wa, 1 - wb)).sum(),
        (p * np.outer(1 - wa, wb)).sum(), (p * np.outer(1 - wa, 1 - wb)).sum(),
    ]) / total


def _sample_grid(key: jax.Array, log_p: np.ndarray, g: density.Grid2D, n: int) -> np.ndarray:
    """``n`` draws from a grid density: a cell by its probability, then uniform within the cell."""
    k_cell, k_jit = jax.random.split(key)
    p = np.exp(log_p).ravel()
    cells = np.asarray(jax.random.choice(k_cell, p.size, (n,), p=jnp.asarray(p / p.sum())))
    pts = g.points[cells]
    da, db = g.a[1] - g.a[0], g.b[1] - g.b[0]
    jitter = np.asarray(jax.random.uniform(k_jit, (n, 2), jnp.float64, -0.5, 0.5)) * np.array([da, db])
    return pts + jitter


def rhat_null_quantile(key: jax.Array, n_chains: int, n_draws: int, q: float = 0.99, reps: int = 400) -> float:
    """The ``q`` quantile of R-hat for independent N(0, 1) draws of the same shape: the largest value that
    perfectly mixed chains of this size still give with probability ``1 - q`` (R-hat's own sampling noise)."""
    draws = np.asarray(jax.random.normal(key, (n_chains, n_draws, reps), jnp.float64))
    return float(np.quantile(mcmc.rhat(draws), q))


def _compute(key: jax.Array, cfg: ToyReluConfig, progress: bool):
    k_data, k_ens, k_mh, k_self, k_null = jax.random.split(key, 5)
    data = synthetic.toy_relu(k_data, cfg.n_data, cfg.w_true, cfg.noise_var, cfg.x_half_width)
    model = models.toy_relu(cfg.prior_var)
    g = density.grid(cfg.grid_half_width, cfg.grid_points)
    log_exact = density.grid_log_posterior(model, data.x, data.y, cfg.noise_var, g)

    # --- Algorithm 1: plain gradient ascent from the anchors.
    kl_steps = tuple(range(0, cfg.steps + 1, cfg.kl_every)) + ((cfg.steps,) if cfg.steps % cfg.kl_every else ())
    opt = ensemble.optimizer("sgd", cfg.step_size)
    res = ensemble.train(
        k_ens, model, data.x, data.y, noise_var=cfg.noise_var, n_particles=cfg.n_particles, opt=opt,
        steps=cfg.steps, snapshot_steps=kl_steps, progress="Algorithm 1" if progress else False,
    )
    path = np.asarray(res.snapshots["w"])  # (len(kl_steps), k, 2)

    # --- The paper's reference: random-walk MH, 10 restarts from the prior.
    mh = mcmc.metropolis_model(
        k_mh, model, data.x, data.y, noise_var=cfg.noise_var, n_chains=cfg.mh_chains,
        proposal_var=cfg.mh_proposal_var, n_draws=cfg.mh_draws, burn_in=cfg.mh_burn_in, thin=cfg.mh_thin,
        progress=progress,
    )
    mh_w = np.asarray(mh.params["w"]).reshape(-1, 2)
    x_grid = np.linspace(-2.5 * cfg.x_half_width, 2.5 * cfg.x_half_width, cfg.x_grid_points)
    diag = mcmc.predictive_diagnostics(model, mh, x_grid)

    # --- KL curves: KDE of the particles at each step against MH's KDE and against the exact posterior.
    log_mh = density.kde_log_density(mh_w, g)
    kl_vs_mh = np.empty(len(kl_steps))
    kl_vs_exact = np.empty(len(kl_steps))
    for i in tqdm(range(len(kl_steps)), desc="KL (KDE, grid)", disable=not progress):
        log_q = density.kde_log_density(path[i], g)
        kl_vs_mh[i] = density.kl(log_q, log_mh, g)
        kl_vs_exact[i] = density.kl(log_q, log_exact, g)
    kl_mh_vs_exact = density.kl(log_mh, log_exact, g)
    # The floor: the same estimator on exact posterior samples of the same size.
    n_self = 20
    self_kl = np.array([
        density.kl(density.kde_log_density(_sample_grid(kk, log_exact, g, cfg.n_particles), g), log_exact, g)
        for kk in jax.random.split(k_self, n_self)
    ])

    # --- Predictive functions (ensemble, MH) and the exact predictive mean/sd by grid quadrature.
    f_ens = np.asarray(models.predict(model, res.params, jnp.asarray(x_grid)))
    f_mh = np.asarray(models.predict(model, {"w": jnp.asarray(mh_w)}, jnp.asarray(x_grid)))
    pts = g.points
    f_grid = np.maximum(pts[:, :1] * x_grid[None], 0) + np.maximum(pts[:, 1:] * x_grid[None], 0)
    pw = np.exp(log_exact).ravel()
    pw = pw / pw.sum()
    exact_mean = pw @ f_grid
    exact_sd = np.sqrt(np.maximum(pw @ f_grid**2 - exact_mean**2, 0))

    q_exact = _grid_quadrant_mass(log_exact, g)
    q_ens = _quadrant_mass(path[-1])
    q_mh = _quadrant_mass(mh_w)
    # A rise is a change above float round-off (the curves are flat once the particles have converged).
    dk = np.diff(kl_vs_mh)
    dk_exact = np.diff(kl_vs_exact)
    dk = np.where(np.abs(dk) <= 1e-9 * np.abs(kl_vs_mh).max(), 0.0, dk)
    dk_exact = np.where(np.abs(dk_exact) <= 1e-9 * np.abs(kl_vs_exact).max(), 0.0, dk_exact)
    summary = {
        "kl_monotone_fraction": float(np.mean(dk <= 0)),
        "kl_monotone_fraction_exact": float(np.mean(dk_exact <= 0)),
        "kl_max_increase": float(max(dk.max(), 0.0)),
        "kl_max_increase_exact": float(max(dk_exact.max(), 0.0)),
        "kl_max_increase_step": int(kl_steps[int(np.argmax(dk)) + 1]),
        "kl_settled_step": int(kl_steps[int(np.flatnonzero(dk_exact != 0)[-1]) + 1]) if np.any(dk_exact != 0) else 0,
        "kl_initial_vs_mh": float(kl_vs_mh[0]),
        "kl_initial_vs_exact": float(kl_vs_exact[0]),
        "kl_final_vs_mh": float(kl_vs_mh[-1]),
        "kl_final_vs_exact": float(kl_vs_exact[-1]),
        "kl_min_vs_exact": float(kl_vs_exact.min()),
        "kl_min_vs_exact_step": int(kl_steps[int(np.argmin(kl_vs_exact))]),
        "kl_mh_vs_exact": float(kl_mh_vs_exact),
        "kde_self_distance_mean": float(self_kl.mean()),
        "kde_self_distance_sd": float(self_kl.std(ddof=1)),
        "kde_self_distance_populations": n_self,
        "rhat_max": diag["rhat_max"],
        "rhat_mean": diag["rhat_mean"],
        "rhat_iid_q99": rhat_null_quantile(k_null, cfg.mh_chains, cfg.mh_draws),
        "ess_min": diag["ess_bulk_min"],
        "ess_tail_min": diag["ess_tail_min"],
        "mh_accept_rate": float(np.mean(mh.accept_rate)),
        "mh_samples": int(mh_w.shape[0]),
        "mh_sampler": mh.sampler,
        "quadrants": list(QUADRANTS),
        "quadrant_mass_exact": q_exact.tolist(),
        "quadrant_mass_ensemble": q_ens.tolist(),
        "quadrant_mass_mh": q_mh.tolist(),
        "kl_steps_evaluated": len(kl_steps),
        "n_particles": cfg.n_particles,
        "steps": cfg.steps,
        "step_size": cfg.step_size,
        "optimizer": opt.description,
        "diverged_particles": int(np.sum(res.diverged)),
        "data": data.description,
        "kl_estimator": "KL(KDE(samples) || p) by Simpson's rule on a grid; scipy gaussian_kde (Scott's rule); "
        f"both densities renormalised on [-{cfg.grid_half_width:g}, {cfg.grid_half_width:g}]^2",
    }
    arrays = {
        "x": data.x,
        "y": data.y,
        "x_grid": x_grid,
        "grid_axis": g.a,
        "log_exact": log_exact,
        "log_mh": log_mh,
        "log_ensemble": density.kde_log_density(path[-1], g),
        "kl_steps": np.asarray(kl_steps),
        "kl_vs_mh": kl_vs_mh,
        "kl_vs_exact": kl_vs_exact,
        "self_kl": self_kl,
        "particles_init": path[0],
        "particles": path[-1],
        "mh_w": mh_w,
        "f_ensemble": f_ens,
        "f_mh": f_mh,
        "exact_mean": exact_mean,
        "exact_sd": exact_sd,
    }
    return arrays, summary
