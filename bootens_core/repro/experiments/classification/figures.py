"""The classification chapter's figures: predictive bands, latent functions, reliability, the alpha study."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ... import plots
from ...store import Result
from .verdicts import noise_units
from .experiment import METHOD_LABELS

__all__ = ["bands", "latent", "reliability", "alpha"]




_COLORS = {"bootstrap": plots.COLORS["particles"], "plain": plots.COLORS["gd"], "mcd": plots.COLORS["law"],
           "deep": plots.COLORS["posterior"], "nuts": plots.COLORS["paper"]}


def _data(ax, result: Result) -> None:
    x, labels = result["x"], result["labels"]
    ax.plot(x, labels, "|", ms=9, mew=1.2, color=plots.COLORS["data"], label="data (class 1 at 1)")
    xg, inside = result["x_grid"], np.abs(result["x_grid"]) <= np.abs(x).max()
    ax.plot(xg[inside], result["p_true"][inside], ls="--", lw=1.0, color=plots.COLORS["prior"],
            label="true p(y=1|x) (data range)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("x")


@plots.styled
def bands(result: Result) -> Figure:
    """The appendix figure: mean and 95% band of p(y = 1 | x) over the classifiers of the bootstrap ensemble,
    the plain ensemble and the NUTS reference (each panel overlays the reference's band edges)."""
    xg = result["x_grid"]
    lo_r, hi_r = np.percentile(result["p_nuts"], [2.5, 97.5], axis=0)
    panels = [("bootstrap", "Bootstrap ensemble (Algorithm 1)"), ("plain", "Plain ensemble (no perturbation)"),
              ("nuts", "NUTS, Bernoulli likelihood")]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.0), sharey=True)
    for ax, (key, title) in zip(axes, panels, strict=True):
        plots.band(ax, xg, result[f"p_{key}"], _COLORS[key], "mean, 95% band")
        if key != "nuts":
            ax.plot(xg, lo_r, color=_COLORS["nuts"], lw=0.9, ls=":")
            ax.plot(xg, hi_r, color=_COLORS["nuts"], lw=0.9, ls=":", label="NUTS band edges")
        _data(ax, result)
        ax.set_title(title)
    axes[0].set_ylabel("p(y = 1 | x)")
    axes[0].legend(frameon=False, loc="center left", fontsize=7)
    axes[1].legend(frameon=False, loc="center left", fontsize=7)
    fig.tight_layout()
    return fig


@plots.styled
def latent(result: Result) -> Figure:
    """The label transform: each class's latent targets ``y~`` with ``±2 sigma~`` bars (log-normal moment
    matching of Gamma(y + alpha_eps, 1)), and how much the particles' mean loss still decreases per L-BFGS
    iteration (a log scale shows convergence)."""
    x, ly, lv = result["x"], result["latent_y"], result["latent_var"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 2.8))
    for c, ax in enumerate(axes[:2]):
        ax.errorbar(x, ly[:, c], yerr=2 * np.sqrt(lv[:, c]), fmt="o", ms=2.5, lw=0.7, color=plots.COLORS["data"])
        ax.set_title(f"class {c}: latent targets ± 2σ~")
        ax.set_xlabel("x")
    axes[0].set_ylabel("log-space target")
    for key in ("bootstrap", "plain"):
        loss = result[f"loss_{key}"]
        drop = np.maximum(-np.diff(loss), 1e-12)
        axes[2].plot(np.arange(2, loss.size + 1), drop, color=_COLORS[key], label=METHOD_LABELS[key], lw=0.9)
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("L-BFGS iteration")
    axes[2].set_ylabel("decrease of the mean loss")
    axes[2].legend(frameon=False)
    fig.tight_layout()
    return fig


@plots.styled
def reliability(result: Result, dataset: str, n_bins: int | None = None) -> Figure:
    """Reliability diagrams of one real dataset (test rows of every split pooled): accuracy against mean
    confidence per bin, bar width by bin, the bins' counts underneath; the diagonal is perfect calibration."""
    from ....metrics import ece, reliability

    n_bins = int(n_bins or result.summary.get("ece_bins", 10))
    labels = result[f"{dataset}_labels"]
    fig, axes = plt.subplots(2, len(METHOD_LABELS), figsize=(3.6 * len(METHOD_LABELS), 4.2), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1]})
    for j, m in enumerate(METHOD_LABELS):
        probs = result[f"{dataset}_{m}_probs"]
        r = reliability(probs, labels, n_bins)
        centres = 0.5 * (r.edges[:-1] + r.edges[1:])
        ok = r.count > 0
        ax, axc = axes[0, j], axes[1, j]
        ax.bar(centres[ok], r.accuracy[ok], width=np.diff(r.edges)[ok] * 0.9, color=_COLORS[m], alpha=0.75,
               label="accuracy")
        ax.plot(r.confidence[ok], r.accuracy[ok], "o", ms=3, color=plots.COLORS["data"],
                label="(mean confidence, accuracy)")
        ax.plot([0, 1], [0, 1], ls=":", color="black", lw=0.8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{METHOD_LABELS[m]}: ECE {ece(probs, labels, n_bins):.3f} (pooled)")
        axc.bar(centres, r.count, width=np.diff(r.edges) * 0.9, color=_COLORS[m], alpha=0.75)
        axc.set_yscale("symlog")
        axc.set_xlabel("confidence (max class probability)")
    axes[0, 0].set_ylabel("accuracy in bin")
    axes[1, 0].set_ylabel("rows")
    axes[0, 0].legend(frameon=False, loc="upper left", fontsize=7)
    fig.tight_layout()
    return fig


@plots.styled
def alpha(result: Result, limit: float = 2.0) -> Figure:
    """Agreement with NUTS against alpha_eps, in the rule's terms: the mean gap |Δ mean p| and |log band-width
    ratio|, each in the rule's noise units (:func:`.verdicts.noise_units`), with the rule's ``limit`` (the
    bootstrap agrees where both are below it); and the band at the alpha_eps whose band edges are closest to
    NUTS's."""
    a = result["alpha_study"]
    um, uw, _ = noise_units(result.summary)
    s = result.summary
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 2.9))
    gap = result["alpha_study_prob_mad"] / um
    width = np.abs(np.log(result["alpha_study_width_ratio"])) / uw
    ax0.plot(a, gap, "o-", color=plots.COLORS["particles"], label="mean gap")
    ax0.plot(a, width, "s-", color=plots.COLORS["law"], label="|log band-width ratio|")
    ax0.axhline(limit, color=plots.COLORS["paper"], ls=":", lw=1, label=f"the rule's limit ({limit:g} units)")
    ax0.axvline(s["alpha_eps"], color="black", lw=0.7, ls="--", label=f"paper's alpha_eps = {s['alpha_eps']:g}")
    ax0.set_xscale("log")
    ax0.set_yscale("log")
    ax0.set_xlabel("alpha_eps")
    ax0.set_ylabel("bootstrap vs NUTS (noise units)")
    ax0.legend(frameon=False, fontsize=7)
    xg = result["x_grid"]
    plots.band(ax1, xg, result["p_nuts"], _COLORS["nuts"], "NUTS")
    plots.band(ax1, xg, result["p_bootstrap_alpha_best"], _COLORS["bootstrap"],
               f"bootstrap, alpha_eps = {s['alpha_eps_best_band_mad']:g}")
    _data(ax1, result)
    ax1.set_ylabel("p(y = 1 | x)")
    ax1.legend(frameon=False, loc="center left", fontsize=7)
    fig.tight_layout()
    return fig
