"""The guidance chapter's figures: the worked example, and each measured question in one figure."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ... import plots
from ...store import Result

__all__ = ["worked_example", "particles", "noise_variance", "stopping", "calibration", "stuck"]


def _mean_se(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over splits (axis 0) and its standard error."""
    return v.mean(0), v.std(0, ddof=1) / math.sqrt(v.shape[0])


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


@plots.styled
def particles(result: Result) -> Figure:
    """Test MNLL and 90% coverage of the first ``k`` particles against ``k`` (mean and standard error over
    splits)."""
    ks, by_k = np.asarray(result.summary["ks"]), result["by_k"]
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 2.6))
    for ax, col, label in ((axes[0], 1, "test MNLL"), (axes[1], 2, "coverage of the 90% interval")):
        m, se = _mean_se(by_k[:, :, col])
        ax.errorbar(ks, m, yerr=se, marker="o", ms=3, capsize=2, color=plots.COLORS["particles"])
        ax.set_xscale("log")
        ax.set_xlabel("particles k")
        ax.set_ylabel(label)
    axes[1].axhline(0.9, ls=":", color=plots.COLORS["prior"], label="nominal")
    axes[1].legend(frameon=False)
    axes[0].axvline(result.summary["k_enough"], ls="--", color=plots.COLORS["posterior"],
                    label="fewest particles as good as all")
    axes[0].legend(frameon=False)
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
    """Test MNLL of the particles after each number of steps, and every particle's objective along the run
    (median and 10-90% band over particles, first split)."""
    steps, by_step = np.asarray(result.summary["stop_steps"]), result["by_step"]
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 2.6))
    m, se = _mean_se(by_step[:, :, 1])
    shown = steps > 0
    axes[0].errorbar(steps[shown], m[shown], yerr=se[shown], marker="o", ms=3, capsize=2,
                     color=plots.COLORS["particles"])
    axes[0].axvline(result.summary["stop_step"], ls="--", color=plots.COLORS["posterior"],
                    label="first step as good as the last")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("optimizer steps")
    axes[0].set_ylabel("test MNLL")
    axes[0].legend(frameon=False)
    med, q = result["loss_median"][0], result["loss_q"][0]
    t = np.arange(1, med.size + 1)
    axes[1].fill_between(t, q[0], q[1], color=plots.COLORS["particles"], alpha=0.25,
                         label="10-90% of particles")
    axes[1].plot(t, med, color=plots.COLORS["particles"], label="median particle")
    axes[1].set_xscale("log")
    axes[1].set_yscale("symlog")
    axes[1].set_xlabel("optimizer step")
    axes[1].set_ylabel("objective -log p~")
    axes[1].legend(frameon=False)
    fig.tight_layout()
    return fig


@plots.styled
def calibration(result: Result) -> Figure:
    """Coverage of the central intervals against their nominal level (mean and two standard errors over
    splits), and the histogram of the PIT values pooled over splits."""
    levels = np.asarray(result.summary["levels"])
    m, se = _mean_se(result["coverage"])
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 2.8))
    axes[0].plot([0.4, 1], [0.4, 1], ls=":", color=plots.COLORS["prior"], label="calibrated")
    axes[0].errorbar(levels, m, yerr=2 * se, marker="o", ms=3, capsize=2, color=plots.COLORS["particles"],
                     label="bootstrap ensemble")
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
