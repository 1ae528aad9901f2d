"""Figure 3's converged reference: the deep-ReLU chapter's NUTS reference as a run resumed over days.

The chapter's NUTS reference (:mod:`.experiment`: ``samplers.nuts_model`` on the deviation prior) is run here
with :func:`bootens_core.samplers.run_resumable` instead: the same data, model, prior, likelihood, starting
points and keys (so its chains are the experiment's chains for the same configuration, draw for draw), in
chunks saved to a directory, until the predictive on the chapter's x grid has converged (rank-normalised
split R-hat below :data:`TARGET_RHAT` and bulk ESS at least :data:`TARGET_ESS` at every grid point), a draw
limit or a time budget. Only ``f(x_grid)`` of each draw is kept (float32), never the 18 001 parameters.

``bootens deep-relu-reference --profile paper --out results/paper/deep-relu`` runs it in
``results/paper/deep-relu/nuts-reference/`` (:func:`bootens_core.repro.cli.main`). :func:`read` reads a run
back for a configuration (refusing one of other data, network, prior or grid), and :func:`against` judges a
run of the experiment against it: the chapter's data, network, prior and particles are the same at every
profile (the profiles differ in the samplers' settings only, NUTS's and MH's), so a converged reference run
once serves them all.
"""

from __future__ import annotations

import dataclasses
import json
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
from ...store import Result
from .config import DeepReluConfig
from .experiment import Summary, compare

__all__ = [
    "DIRNAME",
    "TARGET_ESS",
    "TARGET_RHAT",
    "Problem",
    "Reference",
    "ReferenceDiagnostics",
    "against",
    "diagnostics",
    "identity",
    "problem",
    "read",
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


class Reference(NamedTuple):
    """A reference run read back for a configuration (:func:`read`).

    Attributes:
        f: the kept predictive draws on the configuration's x grid, ``(chains, draws, n_x)`` (float64 of the
            stored float32).
        diagnostics: their :func:`diagnostics` (``converged`` by :data:`TARGET_RHAT` and :data:`TARGET_ESS`).
        accept_rate: the mean acceptance probability of the kept draws.
        config: the configuration with the run's NUTS settings (chains, warm-up, tree depth, target
            acceptance; ``draws``: the kept draws per chain), the one whose :func:`identity` the run holds.
        commits: the code's commits named by the run's chunks (warm-up and kept draws), in order of first use.
    """

    f: np.ndarray
    diagnostics: ReferenceDiagnostics
    accept_rate: float
    config: DeepReluConfig
    commits: tuple[str, ...]


def read(directory: str | os.PathLike[str], cfg: DeepReluConfig) -> Reference:
    """The reference run in ``directory`` (every chunk checked against its manifest's sha256), as a reference
    for ``cfg``: the run must hold ``cfg``'s seed, data, network, prior and x grid (the settings
    :func:`identity` names, except NUTS's own), and its key must be the one :func:`problem` derives from the
    seed for the run's NUTS settings; a run of other settings is a ValueError naming the settings that
    differ. The experiment's code itself is not in the identity: the chunks name the commit that made them
    (:attr:`Reference.commits`)."""
    run = resumable.read_run(directory)
    ident = run.manifest["identity"]
    saved = ident.get("caller", {})
    nuts = saved.get("nuts", {})
    try:
        ref_cfg = dataclasses.replace(cfg, nuts=dataclasses.replace(
            cfg.nuts, chains=int(nuts["chains"]), warmup=int(nuts["warmup"]),
            max_tree_depth=int(nuts["max_tree_depth"]), target_accept=float(nuts["target_accept"]),
            draws=int(run.record.shape[1])))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{directory}: not a deep-ReLU reference run (its identity has no NUTS settings: "
                         f"{exc})") from None
    want = json.loads(json.dumps(identity(ref_cfg)))
    diff = sorted(k for k in set(want) | set(saved) if k != "nuts" and want.get(k) != saved.get(k))
    if diff:
        shown = "; ".join(f"{k}: {saved.get(k, '<absent>')!r} there, {want.get(k, '<absent>')!r} here"
                          for k in diff)
        raise ValueError(f"{directory} holds a reference of other settings ({shown}): it cannot judge this "
                         "configuration's run")
    key = problem(jax.random.key(cfg.seed), ref_cfg).key
    if np.asarray(jax.random.key_data(key)).astype(np.uint64).ravel().tolist() != ident.get("key"):
        raise ValueError(f"{directory}: the run's NUTS key is not the one seed {cfg.seed} gives: it is not "
                         "this experiment's reference")
    if run.record.shape[1] < _MIN_DRAWS:
        raise ValueError(f"{directory}: {run.record.shape[1]} kept draws per chain; a reference needs at least "
                         f"{_MIN_DRAWS}")
    commits = tuple(dict.fromkeys(str(c.get("note", {}).get("git_commit", "unknown"))
                                  for c in (*run.manifest.get("warmup", []), *run.manifest["chunks"])))
    return Reference(
        f=np.asarray(run.record, np.float64), diagnostics=diagnostics(run),
        accept_rate=float(np.mean(run.accept_prob)), config=ref_cfg, commits=commits,
    )


def against(result: Result, ref: Reference) -> Result:
    """The experiment's run ``result`` judged against the reference ``ref``: the same run, its NUTS draws
    (``f_nuts``) those of the reference and its summary's reference keys the reference's (predictive R-hat and
    bulk ESS, NUTS's statistics, the agreement of the particles at every recorded step with it and its own
    half-vs-half noise: :func:`.experiment.compare`); the MH, prior and ensemble keys stay the run's. The
    figures and :mod:`.verdicts` read it as they read the run."""
    if result.name != "deep-relu":
        raise ValueError(f"need a run of the deep-ReLU experiment, got one of {result.name!r}")
    lacking = [k for k in ("f_along", "along_steps", "stages", "diverged", "x_grid") if k not in result.arrays]
    if lacking:
        raise ValueError(f"the run lacks {', '.join(lacking)} (made by older code, which kept the particles at "
                         "the figure's stages only): run it again")
    n_x = np.shape(result["x_grid"])[0]
    if ref.f.shape[2] != n_x or not np.allclose(
            result["x_grid"], np.linspace(-ref.config.x_grid_half_width, ref.config.x_grid_half_width, n_x)):
        raise ValueError(f"the reference's grid ({ref.f.shape[2]} points on ±{ref.config.x_grid_half_width:g}) "
                         "is not the run's")
    d, nuts = ref.diagnostics, ref.config.nuts
    f = ref.f.reshape(-1, n_x)
    # The mean predictive R-hat over the grid (the run's nuts_rhat_mean); ref.diagnostics has its maximum.
    rhat_mean = float(np.nanmean(samplers.rhat(ref.f)))
    # The run's own reference's noise keys go: compare gives the reference's (or none, for a short one).
    own = {k: v for k, v in Summary.of(result.summary).as_summary().items()
           if not k.startswith(("reference_split_", "reference_noise_", "sample_noise_"))}
    summary = own | compare(result.arrays, ref.f) | {
        "reference": "NUTS",
        "rhat_max": d.rhat_max, "rhat_mean": rhat_mean, "ess_min": d.ess_bulk_min,
        "nuts_rhat_max": d.rhat_max, "nuts_rhat_mean": rhat_mean, "nuts_ess_min": d.ess_bulk_min,
        "nuts_accept_rate": ref.accept_rate, "nuts_divergences": d.divergences,
        "nuts_mean_num_steps": d.mean_num_steps, "nuts_draws_total": int(f.shape[0]),
        "nuts_sampler": (f"NUTS (NumPyro, resumable), target accept {nuts.target_accept:g}, max tree depth "
                         f"{nuts.max_tree_depth}, {d.chains} chains, warm-up {nuts.warmup}, {d.draws} draws"),
    }
    return dataclasses.replace(result, arrays={**result.arrays, "f_nuts": f},
                               summary=Summary.of(summary).as_summary())
