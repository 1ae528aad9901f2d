"""Figure 1's run: train the particles and measure them against the exact posterior."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from scipy import stats

from .... import ensemble, models
from ....exact import linear
from ... import store
from ...config import require_x64
from .config import UnivariateConfig
from ....data import synthetic

__all__ = ["NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run"]

NAME = "univariate"
DESCRIPTION = "One-weight linear-Gaussian model: particles from the prior converge to the exact posterior"
ARTEFACTS = ("Figure 1",)
Config = UnivariateConfig


@dataclasses.dataclass(frozen=True)
class Summary(store.TypedSummary):
    """Figure 1's numbers, the keys of the run's ``summary.json``: ``mean_error_sd`` = |mean_q - mean_p| / sd_p
    and ``sd_ratio`` = sd_q / sd_p of the final particles, each with its Monte-Carlo scale (what k exact samples
    would give), the Kolmogorov-Smirnov test of the particles against the exact posterior, the posterior's and
    the particles' mean and sd, and the setting (``contraction_per_step``: |1 - h lambda|, how much closer to
    the posterior one step takes a particle)."""

    mean_error_sd: float
    mean_error_sd_mc_scale: float
    sd_ratio: float
    sd_ratio_mc_scale: float
    ks_pvalue: float
    ks_statistic: float
    posterior_mean: float
    posterior_sd: float
    particles_mean: float
    particles_sd: float
    prior_sd: float
    n_particles: int
    steps: int
    step_size: float
    contraction_per_step: float
    optimizer: str


def run(
    key: jax.Array, cfg: UnivariateConfig, *, use_cache: bool = True, force: bool = False, progress: bool = False
) -> store.Result:
    """Train the particles of Algorithm 1 (plain gradient ascent) and compare them with the posterior.

    The result's summary holds the fields of :class:`Summary` (``Summary.of(result)`` reads it typed).
    """
    require_x64("univariate")
    return store.cached(NAME, key, cfg, lambda: _compute(key, cfg, progress), use_cache=use_cache, force=force)


def _compute(key: jax.Array, cfg: UnivariateConfig, progress: bool):
    k_data, k_ens = jax.random.split(key)
    data = synthetic.univariate(k_data, cfg.n_data, cfg.w_true, cfg.noise_var)
    model = models.scalar_linear(cfg.prior_var)
    opt = ensemble.optimizer("sgd", cfg.step_size)
    res = ensemble.train(
        k_ens, model, data.x, data.y, noise_var=cfg.noise_var, n_particles=cfg.n_particles, opt=opt,
        steps=cfg.steps, snapshot_steps=cfg.stages, progress="univariate" if progress else False,
    )
    post = linear.posterior(data.x[:, None], data.y, cfg.noise_var, cfg.prior_var)
    mean_p = float(post.mean[0])
    sd_p = float(np.sqrt(post.cov[0, 0]))
    stages = np.asarray(res.snapshot_steps)
    particles = np.asarray(res.snapshots["w"])[:, :, 0]  # (stages, k)
    law = linear.gd_population(post, cfg.step_size, stages)
    law_mean = law.mean[:, 0] * post.V[0, 0]  # back from the (1-D) eigenbasis
    law_sd = np.sqrt(law.var[:, 0])

    final = particles[-1]
    k = final.shape[0]
    mean_q, sd_q = float(final.mean()), float(final.std(ddof=1))
    ks = stats.kstest(final, stats.norm(mean_p, sd_p).cdf)
    summary = Summary(
        mean_error_sd=abs(mean_q - mean_p) / sd_p,
        mean_error_sd_mc_scale=1 / np.sqrt(k),
        sd_ratio=sd_q / sd_p,
        sd_ratio_mc_scale=1 / np.sqrt(2 * (k - 1)),
        ks_pvalue=float(ks.pvalue),
        ks_statistic=float(ks.statistic),
        posterior_mean=mean_p,
        posterior_sd=sd_p,
        particles_mean=mean_q,
        particles_sd=sd_q,
        prior_sd=float(np.sqrt(cfg.prior_var)),
        n_particles=k,
        steps=cfg.steps,
        step_size=cfg.step_size,
        contraction_per_step=float(abs(1 - cfg.step_size * post.lam[0])),
        optimizer=opt.description,
    ).as_summary()
    arrays = {
        "x": data.x,
        "y": data.y,
        "stages": stages,
        "particles": particles,
        "law_mean": law_mean,
        "law_sd": law_sd,
        "posterior": np.array([mean_p, sd_p]),
        "loss": res.loss,
    }
    return arrays, summary
