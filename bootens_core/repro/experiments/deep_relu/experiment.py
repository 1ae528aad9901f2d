"""Figure 3: 200 particles of an 8-hidden-layer ReLU network (m = 18001) at several stages, against a reference.

The paper's setting is kept runnable and measured: its prior N(0, 1) on every weight gives prior functions
with standard deviations of order 1e6 (shown), and its MH proposal N(0, 0.01 I) in 18001 dimensions is
(almost) never accepted, so MH chains stay at their prior draws. The figure uses the deviation prior
``N(0, weight_var / fan_in)`` on the weights (still diagonal Gaussian, so the theory holds) and NUTS as the
reference; agreement is quantified on an x grid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .... import ensemble, samplers, models
from ... import noise, store
from ...config import require_x64
from .config import DeepReluConfig
from ....data import synthetic

__all__ = ["NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run", "agreement", "reference_noise",
           "sample_noise", "rule_statistics", "compare"]

NAME = "deep-relu"
DESCRIPTION = "8x50 ReLU network: 200 particles at stages vs an MCMC reference (faithful MH evidence, NUTS)"
ARTEFACTS = ("Figure 3",)
Config = DeepReluConfig


@dataclasses.dataclass(frozen=True)
class Summary(store.TypedSummary):
    """Figure 3 in numbers: the keys of the run's ``summary.json``.

    The agreement statistics of :func:`agreement` (``mean_abs_diff_mean``, ``sd_ratio_median``,
    ``band_coverage``, ``inside_ref_band``) of the final particles against the NUTS reference, their values at
    the figure's ``stages`` (``*_stages``) and at every recorded step (``agreement_steps``, ``*_along``); the
    reference against itself (``reference_split_*``: first half of the chains against the second) and its noise
    unit (``reference_noise_*``, :func:`reference_noise`), both None when the reference has a single chain; the
    noise of a sample of the ensemble's size drawn from the reference (``sample_noise_*``, :func:`sample_noise`),
    None when the reference holds fewer than twice as many draws;
    the predictive diagnostics (``rhat_*``, ``ess_min``) and sampler statistics of NUTS and of the paper's MH on
    the faithful and on the deviation prior (``nuts_*``, ``mh_faithful_*``, ``mh_deviation_*``); the two
    priors over functions (``prior_*``) and the setting.
    """

    OPTIONAL = ((
        "reference_split_mean_abs_diff_mean", "reference_split_sd_ratio_median", "reference_split_band_coverage",
        "reference_split_inside_ref_band", "reference_noise_mad", "reference_noise_log_sd", "reference_noise_partitions",
    ), ("sample_noise_mad", "sample_noise_log_sd", "sample_noise_n", "sample_noise_repeats"))

    n_params: int
    reference: str
    rhat_max: float
    rhat_mean: float
    ess_min: float
    mean_abs_diff_mean: float
    sd_ratio_median: float
    band_coverage: float
    inside_ref_band: float
    stages: list[int]
    mean_abs_diff_mean_stages: list[float]
    sd_ratio_median_stages: list[float]
    band_coverage_stages: list[float]
    agreement_steps: list[int]
    mean_abs_diff_mean_along: list[float]
    sd_ratio_median_along: list[float]
    nuts_accept_rate: float
    nuts_rhat_max: float
    nuts_rhat_mean: float
    nuts_ess_min: float
    nuts_sampler: str
    nuts_divergences: int
    nuts_mean_num_steps: float
    nuts_draws_total: int
    mh_faithful_accept_rate: float
    mh_faithful_rhat_max: float
    mh_faithful_rhat_mean: float
    mh_faithful_ess_min: float
    mh_faithful_sampler: str
    mh_deviation_accept_rate: float
    mh_deviation_rhat_max: float
    mh_deviation_rhat_mean: float
    mh_deviation_ess_min: float
    mh_deviation_sampler: str
    mh_steps_per_chain: int
    prior_f_sd_median_faithful: float
    prior_f_sd_median: float
    prior_within_fraction_faithful: float
    prior_within_fraction: float
    diverged_particles: int
    n_particles: int
    optimizer: str
    steps: int
    data: str
    prior: str
    prior_faithful: str
    reference_split_mean_abs_diff_mean: float | None = None
    reference_split_sd_ratio_median: float | None = None
    reference_split_band_coverage: float | None = None
    reference_split_inside_ref_band: float | None = None
    reference_noise_mad: float | None = None
    reference_noise_log_sd: float | None = None
    reference_noise_partitions: int | None = None
    sample_noise_mad: float | None = None
    sample_noise_log_sd: float | None = None
    sample_noise_n: int | None = None
    sample_noise_repeats: int | None = None


def run(
    key: jax.Array, cfg: DeepReluConfig, *, use_cache: bool = True, force: bool = False, progress: bool = False
) -> store.Result:
    """Run the deep-ReLU experiment (see the module docstring).

    The result's summary holds the fields of :class:`Summary` (``Summary.of(result)`` reads it typed)."""
    require_x64("deep-relu")
    return store.cached(NAME, key, cfg, lambda: _compute(key, cfg, progress), use_cache=use_cache, force=force)


def agreement(f_q: np.ndarray, f_ref: np.ndarray) -> dict[str, float]:
    """Agreement of two sets of predictive functions ``(k, n_x)`` on the same x grid.

    ``mean_abs_diff_mean``: |mean_q - mean_ref| / sd_ref averaged over x; ``sd_ratio_median``: median over x
    of sd_q / sd_ref; ``band_coverage``: the fraction of the reference's central 95% band covered by the
    ensemble's, averaged over x; ``inside_ref_band``: the fraction of the ensemble's function values inside
    the reference band (0.95 if the two agree).
    """
    f_q = np.asarray(f_q, np.float64)
    f_ref = np.asarray(f_ref, np.float64)
    if f_q.ndim != 2 or f_ref.ndim != 2 or f_q.shape[1] != f_ref.shape[1]:
        raise ValueError(f"need (k, n_x) arrays on the same grid, got {f_q.shape} and {f_ref.shape}")
    m_q, m_r = f_q.mean(0), f_ref.mean(0)
    s_q, s_r = f_q.std(0, ddof=1), f_ref.std(0, ddof=1)
    lo_q, hi_q = np.percentile(f_q, [2.5, 97.5], axis=0)
    lo_r, hi_r = np.percentile(f_ref, [2.5, 97.5], axis=0)
    overlap = np.clip(np.minimum(hi_q, hi_r) - np.maximum(lo_q, lo_r), 0, None)
    return {
        "mean_abs_diff_mean": float(np.mean(np.abs(m_q - m_r) / s_r)),
        "sd_ratio_median": float(np.median(s_q / s_r)),
        "band_coverage": float(np.mean(overlap / (hi_r - lo_r))),
        "inside_ref_band": float(np.mean((f_q >= lo_r) & (f_q <= hi_r))),
    }


def reference_noise(f_chains: np.ndarray, max_partitions: int = 64) -> dict[str, float]:
    """The reference's own noise in the two statistics the verdict judges: the reference against itself.

    ``f_chains`` ``(chains, draws, n_x)``. Every split of the chains into two halves (up to
    ``max_partitions``, each unordered split once) gives one half-vs-half comparison; ``mad`` is the mean of
    their ``mean_abs_diff_mean`` (what two samples of the same law show as a mean difference), ``log_sd`` the
    root mean square of their ``log(sd_ratio_median)``. Each half holds half the draws, so these over-state
    the noise of a comparison with the whole reference: a rule judged in these units errs towards "agrees".
    """
    u = noise.halves(f_chains, rule_statistics, max_partitions, "predictive draws")
    return {"mad": u.mean, "log_sd": u.rms, "partitions": u.repeats}


def sample_noise(f_chains: np.ndarray, n: int, repeats: int = 256, seed: int = 0,
                 each: bool = False) -> dict[str, Any]:
    """The noise of the two statistics the verdict judges for a sample of ``n`` functions: ``n`` of the
    reference's own draws against the rest of them.

    ``f_chains`` ``(chains, draws, n_x)``, at least ``2 n`` draws in all. Each of ``repeats`` subsets (drawn
    without replacement from all the chains' draws, ``numpy.random.default_rng(seed)``) is compared with the
    remaining draws by :func:`agreement`; ``mad`` is the mean of their ``mean_abs_diff_mean`` and ``log_sd`` the
    root mean square of their ``log(sd_ratio_median)``: what an ensemble of ``n`` independent posterior draws
    shows against a reference of the remaining size, so a unit that counts the ensemble's own sampling noise
    as well as the reference's (draws within a chain are correlated: with a bulk ESS below the number of
    draws the subsets vary somewhat less than independent ones). With ``each``, also the per-subset values
    (``mad_each``, ``log_each``).
    """
    u = noise.unit(noise.pooled(f_chains, "predictive draws"), n, rule_statistics, repeats, seed)
    out: dict[str, Any] = {"mad": u.mean, "log_sd": u.rms, "n": u.n, "repeats": u.repeats}
    if each:
        out.update(mad_each=u.first, log_each=u.second)
    return out


def rule_statistics(f_q: np.ndarray, f_ref: np.ndarray) -> tuple[float, float]:
    """The two statistics of Figure 3's agreement rule of ``f_q`` against ``f_ref`` (:func:`agreement`):
    ``mean_abs_diff_mean`` and ``log(sd_ratio_median)``."""
    st = agreement(f_q, f_ref)
    return st["mean_abs_diff_mean"], float(np.log(st["sd_ratio_median"]))


def compare(run_arrays: Mapping[str, Any], f_ref: np.ndarray) -> dict[str, Any]:
    """The particles of a run against reference draws: the :class:`Summary`'s agreement keys.

    Args:
        run_arrays: the run's ``along_steps`` (the recorded optimisation steps), ``f_along``
            ``(steps, particles, n_x)`` (the particles' functions at those steps on the x grid), ``stages``
            (the figure's steps, among ``along_steps``) and ``diverged`` ``(particles,)`` (particles left
            out); a :class:`~bootens_core.repro.store.Result` of :func:`run` holds them.
        f_ref: the reference's predictive draws on the same grid, ``(chains, draws, n_x)``.

    Returns:
        :func:`agreement` of the last recorded step (``mean_abs_diff_mean``, ``sd_ratio_median``,
        ``band_coverage``, ``inside_ref_band``), the first two and ``band_coverage`` at the figure's stages
        (``*_stages``), the first two at every recorded step (``agreement_steps``, ``*_along``), the reference's first half of chains
        against its second (``reference_split_*``) and its half-vs-half noise (``reference_noise_*``,
        :func:`reference_noise`), absent for a single chain, and the noise of a sample of as many functions as
        the particles kept (``sample_noise_*``, :func:`sample_noise`), absent when the reference holds fewer
        than twice as many draws.
    """
    f_ref = np.asarray(f_ref, np.float64)
    f_along = np.asarray(run_arrays["f_along"], np.float64)
    steps = [int(t) for t in np.asarray(run_arrays["along_steps"])]
    stages = [int(t) for t in np.asarray(run_arrays["stages"])]
    ok = ~np.asarray(run_arrays["diverged"], bool)
    if f_ref.ndim != 3 or f_along.ndim != 3 or f_ref.shape[2] != f_along.shape[2]:
        raise ValueError(f"need reference draws (chains, draws, n_x) on the run's grid of {f_along.shape[-1]} "
                         f"points, got {f_ref.shape}")
    if len(steps) != f_along.shape[0] or ok.shape != (f_along.shape[1],) or not set(stages) <= set(steps):
        raise ValueError(f"{len(steps)} recorded steps, stages {stages} and {ok.shape} divergence flags for "
                         f"particle functions of shape {f_along.shape}")
    n_chains, n_x = f_ref.shape[0], f_ref.shape[2]
    flat = f_ref.reshape(-1, n_x)
    along = [agreement(f[ok], flat) for f in f_along]
    at_stage = [along[steps.index(t)] for t in stages]
    out: dict[str, Any] = {
        **along[-1],
        "mean_abs_diff_mean_stages": [a["mean_abs_diff_mean"] for a in at_stage],
        "sd_ratio_median_stages": [a["sd_ratio_median"] for a in at_stage],
        "band_coverage_stages": [a["band_coverage"] for a in at_stage],
        "agreement_steps": steps,
        "mean_abs_diff_mean_along": [a["mean_abs_diff_mean"] for a in along],
        "sd_ratio_median_along": [a["sd_ratio_median"] for a in along],
    }
    half = n_chains // 2
    if half >= 1:
        # The noise floor of these statistics: the reference against itself (first half of the chains vs second).
        floor = agreement(f_ref[:half].reshape(-1, n_x), f_ref[half:].reshape(-1, n_x))
        out.update({f"reference_split_{k}": v for k, v in floor.items()})
        out.update({f"reference_noise_{k}": v for k, v in reference_noise(f_ref).items()})
    n_kept = int(ok.sum())
    if 2 <= n_kept and 2 * n_kept <= len(flat):
        out.update({f"sample_noise_{k}": v for k, v in sample_noise(f_ref, n_kept).items()})
    return out


def _mh(key, model, data, cfg, progress, label):
    res = samplers.metropolis_model(
        key, model, data.x, data.y, noise_var=cfg.noise_var, n_chains=cfg.mh.chains,
        proposal_var=cfg.mh.proposal_var, n_draws=cfg.mh.draws, burn_in=cfg.mh.burn_in, thin=cfg.mh.thin,
        progress=label if progress else False,
    )
    return res


def _compute(key: jax.Array, cfg: DeepReluConfig, progress: bool):
    k_data, k_prior, k_mhf, k_mhd, k_nuts, k_ens = jax.random.split(key, 6)
    data = synthetic.trig_regression(k_data, cfg.n_data, cfg.noise_var)
    hidden = (cfg.width,) * cfg.depth
    faithful = models.mlp(1, hidden, "relu", weight_var=cfg.faithful_weight_var, bias_var=cfg.bias_var)
    model = models.mlp(1, hidden, "relu", weight_var=cfg.weight_var, bias_var=cfg.bias_var, scale_by_fan_in=True)
    x_grid = np.linspace(-cfg.x_grid_half_width, cfg.x_grid_half_width, cfg.x_grid_points)
    xg = jnp.asarray(x_grid)

    # --- The two priors over functions.
    n_prior = 200
    f_prior_faithful = np.asarray(models.predict(faithful, models.prior_sample(k_prior, faithful, n_prior), xg))
    f_prior = np.asarray(models.predict(model, models.prior_sample(k_prior, model, n_prior), xg))

    def within_fraction(f):
        """Share of the prior functions' spread that varies with x (0 = constant functions)."""
        return float(np.std(f - f.mean(1, keepdims=True)) / np.std(f))

    # --- The paper's MH (proposal N(0, 0.01 I)) on the faithful prior and on the deviation prior.
    mh_f = _mh(k_mhf, faithful, data, cfg, progress, "MH, faithful prior")
    mh_d = _mh(k_mhd, model, data, cfg, progress, "MH, deviation prior")
    diag_mh_f = samplers.predictive_diagnostics(faithful, mh_f, x_grid)
    diag_mh_d = samplers.predictive_diagnostics(model, mh_d, x_grid)

    # --- NUTS reference on the deviation prior.
    nuts = samplers.nuts_model(
        k_nuts, model, data.x, data.y, noise_var=cfg.noise_var, n_chains=cfg.nuts.chains, n_warmup=cfg.nuts.warmup,
        n_draws=cfg.nuts.draws, target_accept=cfg.nuts.target_accept, max_tree_depth=cfg.nuts.max_tree_depth,
        progress=progress, chain_method=cfg.nuts.chain_method,
    )
    diag_nuts = samplers.predictive_diagnostics(model, nuts, x_grid)
    f_nuts = np.asarray(
        models.predict(model, jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), nuts.params), xg)
    )
    f_nuts_chains = f_nuts.reshape(cfg.nuts.chains, cfg.nuts.draws, -1)

    # --- Algorithm 1 on the deviation prior.
    opt = ensemble.optimizer(cfg.optimizer, cfg.step_size)
    if cfg.agreement_every < 1:
        raise ValueError(f"agreement_every must be a positive number of steps, got {cfg.agreement_every}")
    along = sorted(set(cfg.stages) | set(range(0, cfg.steps + 1, cfg.agreement_every)))
    res = ensemble.train(
        k_ens, model, data.x, data.y, noise_var=cfg.noise_var, n_particles=cfg.n_particles, opt=opt,
        steps=cfg.steps, snapshot_steps=tuple(along), on_diverged="report",
        progress="Algorithm 1" if progress else False,
    )
    snap_steps = [int(t) for t in np.asarray(res.snapshot_steps)]
    f_snaps = [
        np.asarray(models.predict(model, jax.tree.map(lambda a, i=i: a[i], res.snapshots), xg))
        for i in range(len(snap_steps))
    ]
    stages = np.asarray([t for t in snap_steps if t in set(cfg.stages)])
    f_stages = np.stack([f for t, f in zip(snap_steps, f_snaps, strict=True) if t in set(cfg.stages)])
    run_arrays = {"along_steps": np.asarray(snap_steps), "f_along": np.stack(f_snaps), "stages": stages,
                  "diverged": np.asarray(res.diverged, bool)}
    compared = compare(run_arrays, f_nuts_chains)

    def sampler_summary(prefix, res_, diag):
        return {
            f"{prefix}_accept_rate": float(np.mean(res_.accept_rate)),
            f"{prefix}_rhat_max": diag["rhat_max"],
            f"{prefix}_rhat_mean": diag["rhat_mean"],
            f"{prefix}_ess_min": diag["ess_bulk_min"],
            f"{prefix}_sampler": res_.sampler,
        }

    summary = Summary(**{
        "n_params": models.n_params(model),
        "reference": "NUTS",
        "rhat_max": diag_nuts["rhat_max"],
        "rhat_mean": diag_nuts["rhat_mean"],
        "ess_min": diag_nuts["ess_bulk_min"],
        **compared,
        "stages": stages.tolist(),
        **sampler_summary("nuts", nuts, diag_nuts),
        "nuts_divergences": int(np.sum(nuts.info.get("n_divergent", 0))),
        "nuts_mean_num_steps": float(np.mean(nuts.info.get("mean_num_steps", np.nan))),
        "nuts_draws_total": int(f_nuts.shape[0]),
        **sampler_summary("mh_faithful", mh_f, diag_mh_f),
        **sampler_summary("mh_deviation", mh_d, diag_mh_d),
        "mh_steps_per_chain": int(cfg.mh.burn_in + cfg.mh.draws * cfg.mh.thin),
        "prior_f_sd_median_faithful": float(np.median(f_prior_faithful.std(0))),
        "prior_f_sd_median": float(np.median(f_prior.std(0))),
        "prior_within_fraction_faithful": within_fraction(f_prior_faithful),
        "prior_within_fraction": within_fraction(f_prior),
        "diverged_particles": int(np.sum(res.diverged)),
        "n_particles": cfg.n_particles,
        "optimizer": opt.description,
        "steps": cfg.steps,
        "data": data.description,
        "prior": f"weights N(0, {cfg.weight_var:g}/fan_in), biases N(0, {cfg.bias_var:g})",
        "prior_faithful": f"weights N(0, {cfg.faithful_weight_var:g}), biases N(0, {cfg.bias_var:g})",
    }).as_summary()
    arrays = {
        "x": data.x,
        "y": data.y,
        "x_grid": x_grid,
        "stages": stages,
        "f_stages": f_stages,
        **{k: v for k, v in run_arrays.items() if k != "stages"},
        "f_nuts": f_nuts,
        "f_prior_faithful": f_prior_faithful,
        "f_prior": f_prior,
        "f_mh_faithful": np.asarray(models.predict(
            faithful, jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), mh_f.params), xg)),
        "mh_faithful_log_density": mh_f.log_density,
        "mh_deviation_log_density": mh_d.log_density,
        "loss": np.asarray(res.loss).mean(1),
    }
    return arrays, summary
