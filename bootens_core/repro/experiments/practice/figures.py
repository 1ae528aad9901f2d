"""The guidance chapter's figures: the worked example, and each measured question in one figure."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from scipy import stats

from ... import plots
from ...store import Result

__all__ = ["worked_example", "particles", "noise_variance", "stopping", "calibration", "stuck"]


@plots.styled
def worked_example(est: Any, x_test: np.ndarray, y_test: np.ndarray, level: float = 0.9) -> Figure:
    """Test labels against the predictive mean with central ``level`` intervals, sorted by the mean."""
    mean = est.predict(x_test)
    lower, upper = est.predict_interval(x_test, level)
    order = np.argsort(mean)
    inside = (y_test >= lower) & (y_test <= upper)
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    i = np.arange(mean.size)
    ax.fill_between(i, lower[order], upper[order], color=plots.COLORS["particles"], alpha=0.25,
                    label=f"{level:.0%} predictive interval")
    ax.plot(i, mean[order], color=plots.COLORS["particles"], label="predictive mean")
    ax.scatter(i[inside[order]], y_test[order][inside[order]], s=9, color=plots.COLORS["data"],
               label="test label")
    ax.scatter(i[~inside[order]], y_test[order][~inside[order]], s=12, marker="x", color=plots.COLORS["law"],
               label="test label outside its interval")
    ax.set_xlabel("test rows, by predictive mean")
    ax.set_ylabel("disease progression")
    ax.legend(loc="upper left", frameon=False, ncol=2)
    fig.tight_layout()
    return fig


def _against_last(ax, x: np.ndarray, table: Any, margin: float, label: str) -> None:
    """Mean difference from the last candidate with its corrected 95% interval as a band, the margin of the
    non-inferiority rule dotted and zero."""
    ax.fill_between(x, table["CI low"], table["CI high"], color=plots.COLORS["particles"], alpha=0.25,
                    label="95% confidence interval")
    ax.plot(x, table["minus the last"], marker="o", ms=3, color=plots.COLORS["particles"], label=label)
    ax.axhline(0, lw=0.7, color="black")
    ax.axhline(margin, ls=":", color=plots.COLORS["law"], label=f"margin {margin:g} nats")


def _coverage(ax, x: np.ndarray, cov: np.ndarray, half: np.ndarray) -> None:
    ax.fill_between(x, cov - half, cov + half, color=plots.COLORS["particles"], alpha=0.25,
                    label="95% confidence interval")
    ax.plot(x, cov, marker="o", ms=3, color=plots.COLORS["particles"])
    ax.axhline(0.9, ls=":", color=plots.COLORS["prior"], label="nominal")
    ax.set_ylabel("coverage of the 90% interval")


@plots.styled
def particles(result: Result) -> Figure:
    """Test MNLL of the first ``k`` particles minus all particles', and the 90% interval's coverage, against
    ``k``: means over splits with their 95% confidence intervals, corrected for splits that share rows
    (``verdicts.particles_curve``)."""
    from .verdicts import particles_curve

    s = result.summary
    t = particles_curve(result)
    ks = t.index.to_numpy()
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 2.8))
    _against_last(axes[0], ks, t, s["mnll_margin"], "mean difference")
    axes[0].axvline(s["k_enough"], ls="--", color=plots.COLORS["posterior"],
                    label="fewest shown within the margin")
    axes[0].set_ylabel("test MNLL minus all particles'")
    axes[0].set_yscale("symlog", linthresh=0.05)
    _coverage(axes[1], ks, t["90% coverage"].to_numpy(), t["± (95%)"].to_numpy())
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("particles k")
        ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


@plots.styled
def noise_variance(result: Result) -> Figure:
    """Held-out MNLL of every candidate ``sigma^2`` on each split (standardised units), the selected ones
    marked."""
    grid, val, sel = result["noise_grid"], result["val_mnll"], result["selected"]
    fig, ax = plt.subplots(figsize=(4.2, 2.8))
    for s in range(val.shape[0]):
        ax.plot(grid, val[s], marker="o", ms=3, lw=1, color=plots.COLORS["particles"], alpha=0.6)
        ax.plot(sel[s], val[s][np.argmin(np.abs(grid - sel[s]))], marker="*", ms=9, color=plots.COLORS["law"])
    ax.set_xscale("log")
    ax.set_xlabel("noise variance sigma^2 (fraction of the labels' variance)")
    ax.set_ylabel("held-out MNLL")
    fig.tight_layout()
    return fig


@plots.styled
def stopping(result: Result) -> Figure:
    """Test MNLL of the particles after each number of steps minus the last step's (95% confidence
    interval, corrected for splits that share rows), the 90% interval's coverage when the run kept it, and
    every particle's objective along the run (median and 10-90% band over particles, first split)."""
    from .verdicts import steps_curve

    s = result.summary
    t = steps_curve(result)
    t = t[t.index > 0]
    steps = t.index.to_numpy()
    has_cov = "90% coverage" in t.columns
    fig, axes = plt.subplots(1, 3 if has_cov else 2, figsize=(11 if has_cov else 7.5, 2.8))
    _against_last(axes[0], steps, t, s["mnll_margin"], "mean difference")
    axes[0].axvline(s["stop_step"], ls="--", color=plots.COLORS["posterior"],
                    label="first shown within the margin")
    axes[0].set_ylabel("test MNLL minus the last step's")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("optimizer steps")
    axes[0].legend(frameon=False, fontsize=7)
    if has_cov:
        _coverage(axes[1], steps, t["90% coverage"].to_numpy(), t["± (95%)"].to_numpy())
        axes[1].set_xscale("log")
        axes[1].set_xlabel("optimizer steps")
        axes[1].legend(frameon=False, fontsize=7)
    med, q = result["loss_median"][0], result["loss_q"][0]
    step = np.arange(1, med.size + 1)
    ax = axes[-1]
    ax.fill_between(step, q[0], q[1], color=plots.COLORS["particles"], alpha=0.25,
                    label="10-90% of particles")
    ax.plot(step, med, color=plots.COLORS["particles"], label="median particle")
    ax.axvline(s["stop_step"], ls="--", color=plots.COLORS["posterior"])
    ax.set_xscale("log")
    ax.set_yscale("symlog")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("objective -log p~ (first split)")
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


@plots.styled
def calibration(result: Result) -> Figure:
    """Coverage of the central intervals against their nominal level (mean over splits and its 95% confidence
    interval, corrected for splits that share rows), and the histogram of the PIT values pooled over
    splits."""
    from .verdicts import calibration_table

    table = calibration_table(result)
    levels = table.index.to_numpy()
    m = table["coverage"].to_numpy()
    half = stats.t.ppf(0.975, result["coverage"].shape[0] - 1) * table["corrected SE"].to_numpy()
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 2.8))
    axes[0].plot([0.4, 1], [0.4, 1], ls=":", color=plots.COLORS["prior"], label="calibrated")
    axes[0].errorbar(levels, m, yerr=half, marker="o", ms=3, capsize=2, color=plots.COLORS["particles"],
                     label="bootstrap ensemble, 95% CI")
    axes[0].set_xlabel("nominal level")
    axes[0].set_ylabel("coverage on test rows")
    axes[0].legend(frameon=False)
    counts, edges = result["pit_counts"], result["pit_edges"]
    axes[1].bar(edges[:-1], counts, width=np.diff(edges), align="edge", color=plots.COLORS["particles"],
                alpha=0.6, edgecolor="white")
    axes[1].axhline(counts.sum() / counts.size, ls=":", color=plots.COLORS["prior"], label="uniform")
    axes[1].set_xlabel("PIT value F(y)")
    axes[1].set_ylabel("test labels")
    axes[1].legend(frameon=False)
    fig.tight_layout()
    return fig


@plots.styled
def stuck(result: Result) -> Figure:
    """Every particle's final objective relative to its ensemble's median, in robust standard deviations,
    per split; the threshold of a stuck particle dashed."""
    final = result["final_loss"]
    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    for s, v in enumerate(final):
        med = np.median(v)
        scale = 1.4826 * np.median(np.abs(v - med)) or 1.0
        z = (v - med) / scale
        jitter = np.linspace(-0.2, 0.2, z.size)
        ax.scatter(np.full(z.size, s) + jitter, z, s=8, color=plots.COLORS["particles"])
    ax.axhline(5, ls="--", color=plots.COLORS["law"], label="stuck above")
    ax.set_xticks(range(len(final)))
    ax.set_xlabel("split")
    ax.set_ylabel("final objective, robust z")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig
