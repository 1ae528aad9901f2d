"""Figure 3's converged reference: the deep-ReLU chapter's NUTS reference as a run resumed over days.

The chapter's NUTS reference (:mod:`.experiment`: ``samplers.nuts_model`` on the deviation prior) is run here
with :func:`bootens_core.samplers.run_resumable` instead: the same data, model, prior, likelihood, starting
points and keys (so its chains are the experiment's chains for the same configuration, draw for draw), in
chunks saved to a directory, until the predictive on the chapter's x grid has converged (rank-normalised
split R-hat below :data:`TARGET_RHAT` and bulk ESS at least :data:`TARGET_ESS` at every grid point), a draw
limit or a time budget. Only ``f(x_grid)`` of each draw is kept (float32), never the 18 001 parameters.

``bootens deep-relu-reference --profile paper --out results/paper/deep-relu`` runs it in
``results/paper/deep-relu/nuts-reference/`` (:func:`bootens_core.repro.cli.main`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .... import models, samplers
from ....data import synthetic
from ....samplers import resumable
from ...config import as_dict, require_x64
from .config import DeepReluConfig

__all__ = [
    "DIRNAME",
    "TARGET_ESS",
    "TARGET_RHAT",
    "Problem",
    "ReferenceDiagnostics",
    "diagnostics",
    "identity",
    "problem",
    "run_reference",
    "sampler",
]

#: The run directory's name inside the command's ``--out``.
DIRNAME = "nuts-reference"
#: Convergence targets on the predictive at every grid point (the issue's: R-hat < 1.01, bulk ESS >= 400).
TARGET_RHAT = 1.01
TARGET_ESS = 400.0
# Split R-hat needs at least two draws per half-chain.
_MIN_DRAWS = 4


class Problem(NamedTuple):
    """The reference's target and start, built as :func:`.experiment.run` builds them.

    Attributes:
        model: the 8x50 ReLU network with the deviation prior.
        x, y: the 40 training points.
        x_grid: the chapter's x grid ``(x_grid_points,)``.
        key: the NUTS sampler's key (``samplers.nuts_model``'s ``k_sampler``).
        positions: ``(chains, m)`` starting points, prior draws (``nuts_model``'s).
    """

    model: models.Model
    x: np.ndarray
    y: np.ndarray
    x_grid: np.ndarray
    key: jax.Array
    positions: jax.Array


class ReferenceDiagnostics(NamedTuple):
    """The predictive diagnostics of the draws kept so far (NaN while fewer than 4 draws per chain).

    Attributes:
        chains, draws: chains and kept draws per chain.
        rhat_max: the largest rank-normalised split R-hat of ``f(x)`` over the grid.
        ess_bulk_min, ess_tail_min: the smallest bulk and tail ESS over the grid.
        ess_bulk_per_draw: ``ess_bulk_min / (chains * draws)``.
        divergences: divergent transitions among the kept draws.
        tree_depth_hit_fraction: the share of kept draws whose tree reached the depth limit.
        mean_num_steps: leapfrog steps per kept draw.
        converged: ``rhat_max < target_rhat`` and ``ess_bulk_min >= target_ess``.
    """

    chains: int
    draws: int
    rhat_max: float
    ess_bulk_min: float
    ess_tail_min: float
    ess_bulk_per_draw: float
    divergences: int
    tree_depth_hit_fraction: float
    mean_num_steps: float
    converged: bool


def problem(key: jax.Array, cfg: DeepReluConfig) -> Problem:
    """The data, model, grid, sampler key and starting points of the experiment's NUTS reference for root
    key ``key`` (``jax.random.key(cfg.seed)``): its keys are split as :func:`.experiment.run` and
    ``samplers.nuts_model`` split them."""
    k_data, _k_prior, _k_mhf, _k_mhd, k_nuts, _k_ens = jax.random.split(key, 6)
    data = synthetic.trig_regression(k_data, cfg.n_data, cfg.noise_var)
    model = models.mlp(1, (cfg.width,) * cfg.depth, "relu", weight_var=cfg.weight_var, bias_var=cfg.bias_var,
                       scale_by_fan_in=True)
    x_grid = np.linspace(-cfg.x_grid_half_width, cfg.x_grid_half_width, cfg.x_grid_points)
    k_init, k_sampler = jax.random.split(k_nuts)
    positions = samplers.prior_starts(k_init, model, cfg.nuts.chains)
    return Problem(model, np.asarray(data.x), np.asarray(data.y), x_grid, k_sampler, positions)


def identity(cfg: DeepReluConfig) -> dict[str, Any]:
    """The settings that define the reference's target and chains (a run directory made with others is
    refused): the seed, the data, the network, its prior, the grid and NUTS's settings (not its ``draws``,
    which the run replaces by its own stopping rules, nor its ``chain_method``: the sampler's identity holds
    the method it resolves to, so "auto" and the method it means are the same run)."""
    d = as_dict(cfg)
    keys = ("seed", "n_data", "noise_var", "depth", "width", "bias_var", "weight_var", "x_grid_points",
            "x_grid_half_width")
    nuts = {k: v for k, v in d["nuts"].items() if k not in ("draws", "chain_method")}
    return {"experiment": "deep-relu", **{k: d[k] for k in keys}, "nuts": nuts}


def sampler(prob: Problem, cfg: DeepReluConfig) -> resumable.ResumableNUTS:
    """The resumable NUTS sampler of the reference: the posterior of ``prob.model``
    (``samplers.log_density_fn``, as ``nuts_model``), keeping ``f(x_grid)`` of every draw."""
    log_density, unravel = samplers.log_density_fn(prob.model, jnp.asarray(prob.x), jnp.asarray(prob.y),
                                                   cfg.noise_var)
    grid = jnp.asarray(prob.x_grid, prob.y.dtype)

    def record(theta: jax.Array) -> jax.Array:
        return prob.model.apply(unravel(theta), grid)

    return resumable.resumable_nuts(
        log_density, record, int(prob.positions.shape[1]), n_warmup=cfg.nuts.warmup,
        target_accept=cfg.nuts.target_accept, max_tree_depth=cfg.nuts.max_tree_depth,
        chain_method=cfg.nuts.chain_method,
    )


def diagnostics(run: resumable.RunRecord, target_rhat: float = TARGET_RHAT,
                target_ess: float = TARGET_ESS) -> ReferenceDiagnostics:
    """R-hat and ESS (ArviZ's, :func:`bootens_core.samplers.rhat` and :func:`~bootens_core.samplers.ess`) of
    the kept predictive draws at every grid point, and the sampler's statistics."""
    f = np.asarray(run.record, np.float64)
    chains, draws = f.shape[:2]
    depth = int(run.manifest["identity"]["sampler"]["max_tree_depth"])
    hits = resumable.tree_depth_hits(run.num_steps, depth)
    if draws >= _MIN_DRAWS:
        r, eb, et = samplers.rhat(f), samplers.ess(f, "bulk"), samplers.ess(f, "tail")
        rhat_max = float(np.nanmax(r))
        ess_bulk, ess_tail = float(np.nanmin(eb)), float(np.nanmin(et))
    else:
        rhat_max = ess_bulk = ess_tail = math.nan
    return ReferenceDiagnostics(
        chains=int(chains), draws=int(draws), rhat_max=rhat_max, ess_bulk_min=ess_bulk, ess_tail_min=ess_tail,
        ess_bulk_per_draw=ess_bulk / (chains * draws) if draws else math.nan,
        divergences=int(np.sum(run.diverging)),
        tree_depth_hit_fraction=float(hits.mean()) if draws else math.nan,
        mean_num_steps=float(np.mean(run.num_steps)) if draws else math.nan,
        converged=bool(rhat_max < target_rhat and ess_bulk >= target_ess),
    )


def run_reference(
    key: jax.Array,
    cfg: DeepReluConfig,
    directory: str | os.PathLike[str],
    *,
    chunk_draws: int,
    n_draws: int | None = None,
    time_budget_s: float | None = None,
    target_rhat: float = TARGET_RHAT,
    target_ess: float = TARGET_ESS,
    on_chunk: Callable[[resumable.RunProgress, ReferenceDiagnostics | None], None] | None = None,
    note: Mapping | None = None,
) -> tuple[resumable.RunProgress, ReferenceDiagnostics]:
    """Run, or resume, the reference in ``directory`` until it converges, ``n_draws`` draws per chain are
    kept, or the time budget is spent.

    Args:
        key: the experiment's root key, ``jax.random.key(cfg.seed)``.
        cfg: the experiment's configuration (its ``nuts`` settings: chains, warm-up, tree depth, target
            acceptance, chain method).
        directory: the run directory (see :func:`bootens_core.samplers.run_resumable`).
        chunk_draws: transitions per chunk and chain.
        n_draws: the most draws per chain to keep (None: no limit).
        time_budget_s: start no chunk once this many seconds have passed since the call began, nor one that
            the last chunk's time says would end after them (None: no limit).
        target_rhat, target_ess: the run stops when the kept draws meet both (checked after every chunk of
            draws).
        on_chunk: called after every saved chunk with the progress and, after a chunk of draws, the
            diagnostics so far (None after a warm-up chunk).
        note: stored with every chunk's entry in the manifest (e.g. the code's commit).

    Returns:
        the progress when the call returned (``stopped``: "done", or "stopped" by convergence or the budget)
        and the diagnostics of all the kept draws.
    """
    require_x64("deep-relu")
    start = time.monotonic()
    prob = problem(key, cfg)
    nuts = sampler(prob, cfg)
    latest: list[ReferenceDiagnostics] = []

    def current() -> ReferenceDiagnostics:
        return diagnostics(resumable.read_run(directory), target_rhat, target_ess)

    def keep_going(p: resumable.RunProgress) -> bool:
        if p.draws_done >= _MIN_DRAWS:
            if not latest:
                latest.append(current())
            if latest[-1].converged:
                return False
        if time_budget_s is not None:
            spent = time.monotonic() - start
            if spent >= time_budget_s:
                return False
            if p.last_chunk_s is not None and spent + p.last_chunk_s > time_budget_s:
                return False
        return True

    def after_chunk(p: resumable.RunProgress, chunk: resumable.NUTSChunk) -> None:
        diag = None
        if p.warmup_done >= cfg.nuts.warmup and p.draws_done > 0:
            diag = current()
            latest[:] = [diag]
        if on_chunk is not None:
            on_chunk(p, diag)

    progress = resumable.run_resumable(
        prob.key, directory, nuts, prob.positions, chunk_draws=chunk_draws, n_draws=n_draws,
        identity=identity(cfg), keep_going=keep_going, on_chunk=after_chunk, note=note,
    )
    return progress, latest[-1] if latest else current()
