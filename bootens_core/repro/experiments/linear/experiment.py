"""Figures 2 and 5, Section 4.1: Bayesian linear regression with 1024 trigonometric features.

Adagrad particles (the paper's setting) against the exact posterior: predictive functions at stages, the KL
curve against the self-distance, the exact KL curve of plain gradient ascent (the particle law stays
Gaussian), and the Section 4.1 check that closed-form perturbed MAPs have the posterior's moments.

``cfg.feature_scale = "sqrt(2/D)"`` runs all of it on the model with the common random-feature scaling
``f(x) = sqrt(2/D) w^T cos(omega x - pi/4)``, against that model's own exact posterior.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from .... import ensemble, models
from ....exact import linear
from ... import store
from ...config import require_x64
from .config import LinearConfig
from ....data import synthetic

__all__ = ["NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run", "trig_model", "gradient_ascent_at"]

NAME = "linear"
DESCRIPTION = "Bayesian linear regression, 1024 trigonometric features: particles vs exact posterior, KL curve"
ARTEFACTS = ("Figure 2", "Figure 5", "Section 4.1")
Config = LinearConfig


@dataclasses.dataclass(frozen=True)
class Summary(store.TypedSummary):
    """Figures 2 and 5 and Section 4.1 in numbers: the keys of the run's ``summary.json``.

    KL curves (``kl_*``) are the data-subspace estimate ``kl_estimator`` of KL(q_t || p) over the particles;
    the self-distance (``self_distance_*``) is the same estimator on populations of exact posterior samples
    (mean and sd over ``n_selfdist_populations``; ``self_distance_expected`` its closed form). ``paper_setting_*``:
    Adagrad at the paper's step and step count; the run that reaches the self-distance (``step_size``,
    ``steps``) is named in ``deviation``. ``gd_*``: plain gradient ascent at h = 1/lambda_max (exact population
    law and the particles' estimate); ``paper_step_gd_*``: plain gradient ascent at the paper's step.
    ``map_*``: Section 4.1's check that closed-form perturbed MAPs have the posterior's moments, with the same
    statistics of exact samples as reference. ``paper_setting_continued_*``: the paper's Adagrad run continued
    (present when the config continues it, else None). Step counts to a level are None when never reached.
    """

    OPTIONAL = (("paper_setting_continued_steps", "paper_setting_continued_steps_to_self_distance_2sd",
                 "paper_setting_continued_steps_to_self_distance_3sd"),)

    kl_initial: float
    kl_final: float
    kl_monotone_fraction: float
    kl_max_rise: float
    kl_max_rise_step: int
    kl_rising_steps: int
    kl_estimator: str
    kl_subspace_dim: int
    deviation: str
    paper_setting_kl_final: float
    paper_setting_kl_final_accumulator_0: float
    paper_setting_kl_monotone_fraction: float
    paper_setting_kl_final_in_self_distance_sd: float
    paper_setting_steps: int
    paper_setting_step_size: float
    steps_to_self_distance_2sd: int | None
    self_distance_mean: float
    self_distance_sd: float
    self_distance_expected: float
    kl_final_in_self_distance_sd: float
    adagrad_residual_median: float
    adagrad_residual_max: float
    off_subspace_var_ratio: float
    optimizer: str
    gd_step_size: float
    gd_steps_to_self_distance: int | None
    gd_empirical_kl_final: float
    gd_exact_kl_final: float
    gd_steps: int
    paper_step_gd_step_size: float
    paper_step_gd_steps: int
    paper_step_gd_spectral_radius: float
    paper_step_gd_kl_final: float
    lambda_max: float
    lambda_min_data: float
    map_n_samples: int
    map_cov_rel_error: float
    map_cov_rel_error_expected: float
    map_cov_rel_error_exact_samples_mean: float
    map_cov_rel_error_exact_samples_sd: float
    map_cov_z: float
    map_subspace_kl: float
    map_subspace_kl_expected: float
    map_subspace_kl_exact_samples_sd: float
    map_subspace_kl_z: float
    map_mean_chi2: float
    map_mean_chi2_dof: int
    map_mean_chi2_pvalue: float
    n_particles: int
    n_features: int
    steps: int
    step_size: float
    feature_scale: str
    feature_scale_value: float
    prior_function_sd: float
    paper_setting_continued_steps: int | None = None
    paper_setting_continued_steps_to_self_distance_2sd: int | None = None
    paper_setting_continued_steps_to_self_distance_3sd: int | None = None


def run(
    key: jax.Array, cfg: LinearConfig, *, use_cache: bool = True, force: bool = False, progress: bool = False
) -> store.Result:
    """Run the linear-regression experiment (see the module docstring).

    The result's summary holds the fields of :class:`Summary` (``Summary.of(result)`` reads it typed)."""
    require_x64("linear")
    return store.cached(NAME, key, cfg, lambda: _compute(key, cfg, progress), use_cache=use_cache, force=force)


def trig_model(omega: np.ndarray, cfg: LinearConfig) -> models.Model:
    """The trigonometric-feature model with frequencies ``omega``, its features scaled by
    ``cfg.feature_scale_value`` (untouched for ``feature_scale = "none"``)."""
    base = models.trig_features(jnp.asarray(omega), cfg.prior_var)
    scale = cfg.feature_scale_value
    if scale == 1.0:
        return base
    return models.linear_in_features(lambda x: scale * base.features(x), base.shapes["w"][0], cfg.prior_var,
                                     name=f"{base.name}, features times {cfg.feature_scale}")


def gradient_ascent_at(post: linear.LinearGaussian, step_size: float, n_steps: int) -> dict:
    """Plain gradient ascent (Algorithm 1 as written) at ``step_size``, from its exact population law.

    Returns the step it used (``step_size``, so that what is reported with these numbers is the step that
    produced them), ``n_steps``, the largest eigenvalue of the posterior precision ``A`` (``lambda_max``),
    the spectral radius ``max |1 - h lambda|`` of the iteration ``w <- w + h (b - A w)`` over all eigenvalues
    of ``A`` (off the data subspace they are ``1 / alpha^2``): above 1 the iteration diverges; and the exact
    ``KL(q_t || p)`` at steps ``0..n_steps`` (``kl``).
    """
    h = float(step_size)
    eig = post.lam if post.D == post.lam.size else np.append(post.lam, 1 / post.prior_var)
    kl = linear.gd_population_kl(post, linear.gd_population(post, h, np.arange(int(n_steps) + 1)))
    return {"step_size": h, "n_steps": int(n_steps), "lambda_max": float(eig.max()),
            "spectral_radius": float(np.max(np.abs(1 - h * eig))), "kl": kl}


def _compute(key: jax.Array, cfg: LinearConfig, progress: bool):
    k_omega, k_data, k_ens, k_self, k_map, k_mapref, k_gd, k_show = jax.random.split(key, 8)
    omega = synthetic.trig_frequencies(k_omega, cfg.n_features, cfg.lengthscale)
    data = synthetic.trig_regression(k_data, cfg.n_data, cfg.noise_var)
    model = trig_model(omega, cfg)
    Phi = np.asarray(model.features(jnp.asarray(data.x)))
    post = linear.posterior(Phi, data.y, cfg.noise_var, cfg.prior_var)
    r, k = post.V.shape[1], cfg.n_particles

    # --- Algorithm 1 with Adagrad: the paper's setting, and the deviation that converges.
    klf = linear.projected_kl_fn(post)

    def adagrad_run(k_run, h, steps, stages, label, acc=cfg.adagrad_initial_accumulator):
        opt = ensemble.optimizer("adagrad", h, initial_accumulator_value=acc)
        res = ensemble.train(
            k_run, model, data.x, data.y, noise_var=cfg.noise_var, n_particles=k, opt=opt, steps=steps,
            snapshot_steps=stages, record=lambda p: klf(p["w"]), progress=label if progress else False,
        )
        return opt, res, np.asarray(res.records)

    k_paper, k_dev = jax.random.split(k_ens)
    _, res_paper, kl_paper = adagrad_run(k_paper, cfg.paper_step_size, cfg.paper_steps, cfg.paper_stages, "Adagrad, paper's h")
    # The paper does not state Adagrad's accumulator start: the same replicates with 0 (PyTorch's default).
    _, _, kl_paper_acc0 = adagrad_run(k_paper, cfg.paper_step_size, cfg.paper_steps, (), "Adagrad, accumulator 0", acc=0.0)
    if cfg.paper_steps_continued > cfg.paper_steps:
        _, _, kl_paper_long = adagrad_run(k_paper, cfg.paper_step_size, cfg.paper_steps_continued, (),
                                          "Adagrad, paper's h, continued")
    opt, res, kl_curve = adagrad_run(k_dev, cfg.step_size, cfg.steps, cfg.stages, "Adagrad, deviation")
    w_star = linear.perturbed_map(post, Phi, np.asarray(res.perturbation.y), np.asarray(res.perturbation.anchor["w"]))
    w_final = np.asarray(res.params["w"])
    residual = np.linalg.norm(w_final - w_star, axis=1) / np.linalg.norm(w_star - np.asarray(res.init_params["w"]), axis=1)
    # Off the data subspace the posterior is the prior: the particles' variance there, relative to alpha^2.
    off = w_final - (w_final @ post.V) @ post.V.T
    off_var_ratio = float(np.sum(np.var(off, axis=0, ddof=1)) / (cfg.prior_var * (post.D - r)))

    # --- Self-distance: the same estimator on populations of exact posterior samples.
    selfd = linear.self_distance(k_self, post, k, cfg.n_selfdist_populations)
    selfd_expected = linear.expected_self_distance(r, k)

    # --- Plain gradient ascent: exact population law, at the largest stable-and-fast step and at the paper's.
    lam_max = float(post.lam.max())
    h_gd = 1.0 / lam_max
    gd_steps = np.unique(np.concatenate([[0], np.round(np.logspace(0, np.log10(cfg.gd_max_steps), 300))])).astype(np.int64)
    gd_kl = linear.gd_population_kl(post, linear.gd_population(post, h_gd, gd_steps))
    paper_h = gradient_ascent_at(post, cfg.paper_step_size, cfg.paper_step_gd_steps)
    gd_emp = ensemble.train(
        k_gd, model, data.x, data.y, noise_var=cfg.noise_var, n_particles=k, opt=ensemble.optimizer("sgd", h_gd),
        steps=cfg.gd_steps, record=lambda p: klf(p["w"]), progress="gradient ascent" if progress else False,
    )
    gd_emp_kl = np.asarray(gd_emp.records)
    gd_exact_same = linear.gd_population_kl(post, linear.gd_population(post, h_gd, np.arange(cfg.gd_steps + 1)))
    reach = _first_below(gd_kl, selfd.mean())
    gd_steps_to_selfdist = int(gd_steps[reach]) if reach is not None else None

    # --- Section 4.1: closed-form perturbed MAP samples have mean w_bar and covariance A^-1.
    km = cfg.n_map_samples
    k_eps, k_anchor = jax.random.split(k_map)
    eps = np.sqrt(cfg.noise_var) * np.asarray(jax.random.normal(k_eps, (km, cfg.n_data), jnp.float64))
    anchors = np.sqrt(cfg.prior_var) * np.asarray(jax.random.normal(k_anchor, (km, post.D), jnp.float64))
    maps = linear.perturbed_map(post, Phi, data.y[None] + eps, anchors)
    cov = post.cov
    map_err = linear.cov_rel_error(maps, cov)
    map_err_expected = linear.expected_cov_rel_error(cov, km)
    # Exact-sampling references: the same statistics on n_map_repeats populations of km posterior samples.
    # The full-dimensional covariance error is dominated by the 960 prior-like directions; the data-subspace
    # KL is what detects a wrong label perturbation (the data act only there).
    ref_errs, ref_sub_kl = [], []
    for kk in jax.random.split(k_mapref, cfg.n_map_repeats):
        exact = linear.sample_posterior(kk, post, km)
        ref_errs.append(linear.cov_rel_error(exact, cov))
        ref_sub_kl.append(linear.projected_kl(post, exact))
    ref_errs, ref_sub_kl = np.array(ref_errs), np.array(ref_sub_kl)
    map_sub_kl = linear.projected_kl(post, maps)
    d = (maps.mean(0) - post.mean) @ post.V
    perp = (maps.mean(0) - post.mean) - d @ post.V.T
    chi2 = km * (np.sum(post.lam * d**2) + np.sum(perp**2) / cfg.prior_var)
    chi2_p = float(stats.chi2.sf(chi2, post.D))

    # --- Predictive functions on a grid: particles at stages, exact posterior samples and band.
    x_grid = np.linspace(-3.0, 3.0, cfg.x_grid_points)
    Phi_grid = np.asarray(model.features(jnp.asarray(x_grid)))
    stage_f = np.einsum("skd,gd->skg", np.asarray(res.snapshots["w"]), Phi_grid)
    paper_stage_f = np.einsum("skd,gd->skg", np.asarray(res_paper.snapshots["w"]), Phi_grid)
    post_samples = linear.sample_posterior(k_show, post, k)
    post_f = post_samples @ Phi_grid.T
    post_mean_f = Phi_grid @ post.mean
    G = Phi_grid @ post.V
    post_var_f = np.sum(G**2 / post.lam, axis=1) + cfg.prior_var * (np.sum(Phi_grid**2, axis=1) - np.sum(G**2, axis=1))

    diffs = np.diff(kl_curve)
    continued = {}
    if cfg.paper_steps_continued > cfg.paper_steps:
        continued["paper_setting_continued_steps"] = cfg.paper_steps_continued
        for n_sd in (2, 3):
            continued[f"paper_setting_continued_steps_to_self_distance_{n_sd}sd"] = _first_below(
                kl_paper_long, selfd.mean() + n_sd * selfd.std(ddof=1))
    summary = Summary(**{
        "kl_initial": float(kl_curve[0]),
        "kl_final": float(kl_curve[-1]),
        "kl_monotone_fraction": float(np.mean(diffs <= 0)),
        "kl_max_rise": float(max(diffs.max(), 0.0)),
        "kl_max_rise_step": int(np.argmax(diffs)) + 1,
        "kl_rising_steps": int(np.sum(diffs > 0)),
        "kl_estimator": linear.KL_ESTIMATOR.format(r=r, k=k, D=post.D),
        "kl_subspace_dim": r,
        "deviation": (
            f"Adagrad with h = {cfg.step_size:g} for {cfg.steps} steps instead of the paper's "
            f"h = {cfg.paper_step_size:g} for {cfg.paper_steps} steps, which leaves the KL at "
            f"{kl_paper[-1]:.3g} (self-distance {selfd.mean():.3g})"
        ),
        "paper_setting_kl_final": float(kl_paper[-1]),
        "paper_setting_kl_final_accumulator_0": float(kl_paper_acc0[-1]),
        "paper_setting_kl_monotone_fraction": float(np.mean(np.diff(kl_paper) <= 0)),
        "paper_setting_kl_final_in_self_distance_sd": float((kl_paper[-1] - selfd.mean()) / selfd.std(ddof=1)),
        "paper_setting_steps": cfg.paper_steps,
        "paper_setting_step_size": cfg.paper_step_size,
        "steps_to_self_distance_2sd": _first_below(kl_curve, selfd.mean() + 2 * selfd.std(ddof=1)),
        "self_distance_mean": float(selfd.mean()),
        "self_distance_sd": float(selfd.std(ddof=1)),
        "self_distance_expected": selfd_expected,
        "kl_final_in_self_distance_sd": float((kl_curve[-1] - selfd.mean()) / selfd.std(ddof=1)),
        "adagrad_residual_median": float(np.median(residual)),
        "adagrad_residual_max": float(residual.max()),
        "off_subspace_var_ratio": off_var_ratio,
        "optimizer": opt.description,
        "gd_step_size": h_gd,
        "gd_steps_to_self_distance": gd_steps_to_selfdist,
        "gd_empirical_kl_final": float(gd_emp_kl[-1]),
        "gd_exact_kl_final": float(gd_exact_same[-1]),
        "gd_steps": cfg.gd_steps,
        "paper_step_gd_step_size": paper_h["step_size"],
        "paper_step_gd_steps": paper_h["n_steps"],
        "paper_step_gd_spectral_radius": paper_h["spectral_radius"],
        "paper_step_gd_kl_final": float(paper_h["kl"][-1]),
        "lambda_max": lam_max,
        "lambda_min_data": float(post.lam.min()),
        "map_n_samples": km,
        "map_cov_rel_error": map_err,
        "map_cov_rel_error_expected": map_err_expected,
        "map_cov_rel_error_exact_samples_mean": float(ref_errs.mean()),
        "map_cov_rel_error_exact_samples_sd": float(ref_errs.std(ddof=1)),
        "map_cov_z": float((map_err - ref_errs.mean()) / ref_errs.std(ddof=1)),
        "map_subspace_kl": float(map_sub_kl),
        "map_subspace_kl_expected": linear.expected_self_distance(r, km),
        "map_subspace_kl_exact_samples_sd": float(ref_sub_kl.std(ddof=1)),
        "map_subspace_kl_z": float((map_sub_kl - linear.expected_self_distance(r, km)) / ref_sub_kl.std(ddof=1)),
        "map_mean_chi2": float(chi2),
        "map_mean_chi2_dof": post.D,
        "map_mean_chi2_pvalue": chi2_p,
        "n_particles": k,
        "n_features": post.D,
        "steps": cfg.steps,
        "step_size": cfg.step_size,
        "feature_scale": cfg.feature_scale,
        "feature_scale_value": cfg.feature_scale_value,
        "prior_function_sd": float(np.sqrt(np.mean(cfg.prior_var * np.sum(Phi_grid**2, axis=1)))),
    }, **continued).as_summary()
    arrays = {
        "x": data.x,
        "y": data.y,
        "x_grid": x_grid,
        "stages": np.asarray(res.snapshot_steps),
        "stage_f": stage_f,
        "paper_stages": np.asarray(res_paper.snapshot_steps),
        "paper_stage_f": paper_stage_f,
        "paper_kl_curve": kl_paper,
        "posterior_f": post_f,
        "posterior_mean_f": post_mean_f,
        "posterior_sd_f": np.sqrt(post_var_f),
        "kl_curve": kl_curve,
        "self_distance": selfd,
        "gd_steps": gd_steps,
        "gd_kl": gd_kl,
        "gd_empirical_kl": gd_emp_kl,
        "gd_exact_kl_same_steps": gd_exact_same,
        "paper_step_gd_kl": paper_h["kl"],
        "residual": residual,
        "map_ref_errors": ref_errs,
    }
    if cfg.paper_steps_continued > cfg.paper_steps:
        arrays["paper_kl_curve_continued"] = kl_paper_long
    return arrays, summary


def _first_below(curve: np.ndarray, level: float) -> int | None:
    hit = np.nonzero(np.asarray(curve) <= level)[0]
    return int(hit[0]) if hit.size else None
