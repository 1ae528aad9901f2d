"""Theorems 1-2 and Lemma 1 measured along Algorithm 1 (plain gradient ascent), in four settings.

``linear`` (trigonometric features, exact Gaussian population law), ``relu`` and ``tanh`` (small MLPs,
exact Hessian traces), and ``unperturbed`` (the linear model, every particle climbing ``log p``). At recorded
steps the particles and their own perturbations give both sides of Theorem 1, the paper's and the corrected
forms of Theorem 2, and the curvature term; for the linear settings the first-order KL change is also
estimated from the particles' score (``E[g . (grad log q - grad log p)]``) and compared with the exact rate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from .... import ensemble, models
from ....exact import linear, theory
from ... import store
from ...config import require_x64
from .config import TheoryConfig
from ....data import synthetic

__all__ = ["NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run", "SETTINGS", "record_steps"]

NAME = "theory"
DESCRIPTION = "Theorems 1-2 and Lemma 1 measured on particles: linear, ReLU, tanh and unperturbed ensembles"
ARTEFACTS = ("Theorem 1", "Theorem 2", "Lemma 1")
Config = TheoryConfig
SETTINGS = ("linear", "relu", "tanh", "unperturbed")


@dataclasses.dataclass(frozen=True)
class Summary(store.TypedSummary):
    """Theorems 1-2 and Lemma 1 in numbers: the keys of the run's ``summary.json``.

    One dict per setting of :data:`SETTINGS` (``linear``, ``relu``, ``tanh``, ``unperturbed``): the shares of
    recorded steps where each condition holds, the first step where it fails (None when it never does), the
    curvature term and, for the linear settings, the measured against the exact KL rate; ``lemma1``: one row
    per setting and time (start, end) of the Lemma 1 check, with the extremes of its z-scores.
    """

    linear: dict[str, Any]
    relu: dict[str, Any]
    tanh: dict[str, Any]
    unperturbed: dict[str, Any]
    lemma1: list[dict[str, Any]]
    lemma1_z_corrected_abs_max: float
    lemma1_z_paper_abs_min: float
    lemma1_z_paper_abs_max: float
    settings: list[str]


    def setting(self, name: str) -> dict[str, Any]:
        """The numbers of setting ``name`` (one of :data:`SETTINGS`)."""
        if name not in SETTINGS:
            raise ValueError(f"unknown setting {name!r}: choose one of {', '.join(SETTINGS)}")
        return getattr(self, name)


def run(
    key: jax.Array, cfg: TheoryConfig, *, use_cache: bool = True, force: bool = False, progress: bool = False
) -> store.Result:
    """Run the theory experiment (see the module docstring).

    The result's summary holds the fields of :class:`Summary` (``Summary.of(result)`` reads it typed)."""
    require_x64("theory")
    return store.cached(NAME, key, cfg, lambda: _compute(key, cfg, progress), use_cache=use_cache, force=force)


def record_steps(steps: int, n: int) -> np.ndarray:
    """About ``n`` distinct steps in ``[0, steps]``, log-spaced, always with 0, 1 and ``steps``."""
    if steps < 1:
        return np.array([0])
    grid = np.unique(np.round(np.geomspace(1, steps, max(n - 1, 2))).astype(int))
    return np.unique(np.concatenate([[0], grid, [steps]]))


def _measure(key, model, x, y, noise_var, res, stages, n_probes, desc, progress, score=False):
    """Theorem 1/2 quantities (and the score-based KL rate) of the snapshots of one run."""
    rows: dict[str, list] = {}
    keys = jax.random.split(key, len(stages))
    for i in tqdm(range(len(stages)), desc=desc, disable=not progress):
        params = jax.tree.map(lambda a, i=i: a[i], res.snapshots)
        terms = theory.particle_terms(keys[i], model, params, x, y, res.perturbation, noise_var, n_probes=n_probes)
        t1 = theory.theorem1(terms)
        t2 = theory.theorem2(terms)
        row = {f"t1_{k}": v for k, v in t1.items()}
        row.update({f"t2_{k}": v for k, v in t2.items()})
        row["curvature"] = float(np.mean(terms.curvature))
        row["curvature_se"] = float(np.std(terms.curvature, ddof=1) / np.sqrt(terms.curvature.size))
        if score:
            flat = np.asarray(jax.vmap(lambda p: models.ravel(p)[0])(params))
            try:
                # The score is fitted on the same particles; the jackknife se accounts for that.
                rate, rate_se = theory.kl_rate_score(
                    terms.grad_logp, terms.grad_logp_tilde, theory.gaussian_score, particles=flat)
            except ValueError:  # collapsed particles (unperturbed): singular sample covariance, no score
                rate, rate_se = float("nan"), float("nan")
            row["score_rate"], row["score_rate_se"] = rate, rate_se
        for k, v in row.items():
            rows.setdefault(k, []).append(float(v))
    return {k: np.asarray(v) for k, v in rows.items()}


def _first_fail(steps: np.ndarray, holds: np.ndarray) -> int | None:
    """The first recorded step at which a condition fails (None if it never does)."""
    bad = np.flatnonzero(~np.asarray(holds, bool))
    return int(steps[bad[0]]) if bad.size else None


def _setting_summary(m: dict[str, np.ndarray]) -> dict[str, float]:
    out = {
        "theorem1_first_fail_step": _first_fail(m["steps"], m["t1_holds"]),
        "theorem2_paper_first_fail_step": _first_fail(m["steps"], m["t2_paper_holds"]),
        "theorem2_corrected_first_fail_step": _first_fail(m["steps"], m["t2_corrected_holds"]),
        "frac_steps_condition_holds": float(np.mean(m["t1_holds"])),
        "frac_steps_theorem2_paper_holds": float(np.mean(m["t2_paper_holds"])),
        "frac_steps_theorem2_corrected_holds": float(np.mean(m["t2_corrected_holds"])),
        "theorem1_rate_final": float(m["t1_rate"][-1]),
        "curvature_abs_max": float(np.max(np.abs(m["curvature"]))),
        "curvature_rel_max": float(np.max(np.abs(m["curvature"]) / np.maximum(np.abs(m["t2_paper_lhs"]), 1e-300))),
    }
    if "score_rate" in m:
        ok = np.isfinite(m["score_rate"])
        out["frac_steps_kl_decreasing_measured"] = float(np.mean(m["score_rate"][ok] <= 0)) if ok.any() else None
        out["steps_without_score"] = int(np.sum(~ok))
    return out


# Relative rounding allowance of a closed-form rate that sums terms up to its largest magnitude (float64).
_ROUNDING = 1e-12


def _linear_setting(key, cfg, progress, perturbed):
    k_omega, k_data, k_ens, k_terms, k_lemma = jax.random.split(key, 5)
    omega = synthetic.trig_frequencies(k_omega, cfg.lin_features, cfg.lin_lengthscale)
    data = synthetic.trig_regression(k_data, cfg.lin_data, cfg.noise_var)
    model = models.trig_features(jnp.asarray(omega), cfg.prior_var)
    Phi = np.asarray(model.features(jnp.asarray(data.x)))
    post = linear.posterior(Phi, data.y, cfg.noise_var, cfg.prior_var)
    h = cfg.lin_step_fraction / float(np.max(post.lam))
    stages = record_steps(cfg.lin_steps, cfg.n_records)
    res = ensemble.train(
        k_ens, model, data.x, data.y, noise_var=cfg.noise_var, n_particles=cfg.lin_particles,
        opt=ensemble.optimizer("sgd", h), steps=cfg.lin_steps, snapshot_steps=stages,
        perturb_labels=perturbed, perturb_prior=perturbed,
        progress=("linear" if perturbed else "unperturbed") if progress else False,
    )
    label = "linear" if perturbed else "unperturbed"
    m = _measure(k_terms, model, data.x, data.y, cfg.noise_var, res, stages, cfg.n_probes, f"theory: {label}",
                 progress, score=True)
    exact = theory.linear_rates(post, h, stages, perturbed=perturbed)
    m.update({
        "steps": stages, "exact_rate": np.asarray(exact.rate_exact), "exact_kl": np.asarray(exact.kl),
        "exact_t1_rate": np.asarray(exact.rate_theorem1), "exact_gap": np.asarray(exact.gap),
    })
    s = _setting_summary(m)
    ok = np.isfinite(m["score_rate"])
    err = np.abs(m["score_rate"] - m["exact_rate"])[ok]
    z = err / np.maximum(m["score_rate_se"][ok], 1e-300)
    s.update({
        "max_abs_err_vs_exact_kl_rate": float(err.max()),
        "max_z_vs_exact_kl_rate": float(z.max()),
        "max_rel_err_vs_exact_kl_rate": float(np.max(err / np.maximum(np.abs(m["exact_rate"][ok]), 1e-12))),
        "exact_rate_abs_max": float(np.max(np.abs(m["exact_rate"]))),
        "theorem1_max_abs_err_vs_exact_kl_rate": float(np.max(np.abs(m["t1_rate"] - m["exact_rate"]))),
        "theorem1_max_z_vs_exact_kl_rate": float(np.max(
            np.abs(m["t1_rate"] - m["exact_rate"]) / np.maximum(m["t1_rate_se"], 1e-300))),
        "theorem1_max_abs_err_vs_its_expectation": float(np.max(np.abs(m["t1_rate"] - m["exact_t1_rate"]))),
        "theorem1_max_z_vs_its_expectation": float(np.max(
            np.abs(m["t1_rate"] - m["exact_t1_rate"]) / np.maximum(m["t1_rate_se"], 1e-300))),
        # decreasing up to float64 rounding: near convergence the exact rate is 0 to within a few ulps of the
        # sums it is made of, whose terms are as large as its largest magnitude
        "frac_steps_kl_decreasing_exact": float(np.mean(
            m["exact_rate"] <= _ROUNDING * np.max(np.abs(m["exact_rate"])))),
        "exact_kl_initial": float(m["exact_kl"][0]),
        "exact_kl_final": float(m["exact_kl"][-1]),
        "trace_A": float(np.sum(post.lam) + (post.V.shape[0] - post.lam.size) / cfg.prior_var),
        "step_size": h,
        "n_particles": cfg.lin_particles,
        "n_params": cfg.lin_features,
    })
    # Lemma 1 on one particle at the start and at the end.
    lem = [
        theory.lemma1_check(kk, model, jax.tree.map(lambda a, i=i: a[i, 0], res.snapshots), data.x, data.y,
                            cfg.noise_var, cfg.lemma_perturbations)
        for kk, i in zip(jax.random.split(k_lemma, 2), (0, len(stages) - 1), strict=True)
    ]
    return m, s, lem


def _net_setting(key, cfg, progress, activation):
    k_data, k_ens, k_terms, k_lemma, k_hutch = jax.random.split(key, 5)
    data = synthetic.trig_regression(k_data, cfg.net_data, cfg.noise_var)
    model = models.mlp(1, cfg.net_hidden, activation, weight_var=cfg.net_weight_var, bias_var=cfg.prior_var,
                       scale_by_fan_in=True)
    stages = record_steps(cfg.net_steps, cfg.n_records)
    res = ensemble.train(
        k_ens, model, data.x, data.y, noise_var=cfg.noise_var, n_particles=cfg.net_particles,
        opt=ensemble.optimizer("sgd", cfg.net_step_size), steps=cfg.net_steps, snapshot_steps=stages,
        progress=activation if progress else False,
    )
    m = _measure(k_terms, model, data.x, data.y, cfg.noise_var, res, stages, cfg.n_probes, f"theory: {activation}",
                 progress)
    m["steps"] = stages
    s = _setting_summary(m)
    s.update({"n_params": models.n_params(model), "n_particles": cfg.net_particles, "step_size": cfg.net_step_size,
              "loss_final": float(np.mean(res.loss[-1]))})
    # Hutchinson beside the exact trace on the final particles: the estimator used when m is large.
    final = jax.tree.map(lambda a: a[-1], res.snapshots)
    exact = theory.particle_terms(k_hutch, model, final, data.x, data.y, res.perturbation, cfg.noise_var,
                                  method="exact")
    hutch = theory.particle_terms(k_hutch, model, final, data.x, data.y, res.perturbation, cfg.noise_var,
                                  method="hutchinson", n_probes=cfg.n_probes)
    z = (hutch.trace - exact.trace) / np.maximum(hutch.trace_se, 1e-300)
    s.update({
        "hutchinson_trace_z_abs_max": float(np.max(np.abs(z))),
        "hutchinson_trace_rel_se_median": float(np.median(hutch.trace_se / np.abs(exact.trace))),
        "hutchinson_probes": cfg.n_probes,
    })
    lem = [
        theory.lemma1_check(kk, model, jax.tree.map(lambda a, i=i: a[i, 0], res.snapshots), data.x, data.y,
                            cfg.noise_var, cfg.lemma_perturbations)
        for kk, i in zip(jax.random.split(k_lemma, 2), (0, len(stages) - 1), strict=True)
    ]
    return m, s, lem


def _compute(key: jax.Array, cfg: TheoryConfig, progress: bool):
    k_lin, k_relu, k_tanh = jax.random.split(key, 3)
    results = {
        "linear": _linear_setting(k_lin, cfg, progress, perturbed=True),
        "relu": _net_setting(k_relu, cfg, progress, "relu"),
        "tanh": _net_setting(k_tanh, cfg, progress, "tanh"),
        # The same problem and key as ``linear``, without perturbations.
        "unperturbed": _linear_setting(k_lin, cfg, progress, perturbed=False),
    }
    per_setting: dict[str, dict] = {}
    arrays: dict[str, np.ndarray] = {}
    lemma_rows = []
    for name, (m, s, lem) in results.items():
        per_setting[name] = s
        for k, v in m.items():
            arrays[f"{name}__{k}"] = np.asarray(v)
        for when, chk in zip(("start", "end"), lem, strict=True):
            lemma_rows.append({"setting": name, "when": when, **{k: float(v) for k, v in chk._asdict().items()}})
    summary = Summary(
        **per_setting, lemma1=lemma_rows,
        lemma1_z_corrected_abs_max=max(abs(r["z_corrected"]) for r in lemma_rows),
        lemma1_z_paper_abs_min=min(abs(r["z_paper"]) for r in lemma_rows),
        lemma1_z_paper_abs_max=max(abs(r["z_paper"]) for r in lemma_rows),
        settings=list(SETTINGS),
    )
    return arrays, summary.as_summary()
