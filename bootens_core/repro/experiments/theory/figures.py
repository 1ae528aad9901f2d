"""The theory chapter's figures: the linear model's KL rate, and the theorems' conditions along training."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ... import plots
from ...store import Result

__all__ = ["linear", "conditions"]


@plots.styled
def linear(result: Result) -> Figure:
    """The linear model: the exact first-order KL change per unit step, the particles' score-based estimate,
    and Theorem 1's expression (measured and its exact expectation); right: the same without perturbations."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for ax, name, title in ((axes[0], "linear", "Algorithm 1 (perturbed)"),
                            (axes[1], "unperturbed", "unperturbed ensemble")):
        t = result[f"{name}__steps"]
        ax.plot(t, result[f"{name}__exact_rate"], color="black", lw=1.6, label="exact dKL/dh (closed form)")
        se = result[f"{name}__score_rate_se"]
        ax.errorbar(t, result[f"{name}__score_rate"], yerr=2 * se, fmt="o", ms=2.5, color=plots.COLORS["posterior"],
                    label="particles: E[g·(∇log q − ∇log p)] ± 2 se")
        ax.plot(t, result[f"{name}__exact_t1_rate"], color=plots.COLORS["law"], ls="--",
                label="Theorem 1 expression, expectation")
        ax.plot(t, result[f"{name}__t1_rate"], "x", ms=3, color=plots.COLORS["law"],
                label="Theorem 1 expression, particles")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_xlim(-0.3, t.max() * 1.2)
        ax.set_xlabel("step")
        ax.set_title(title)
    axes[0].set_ylabel("directional derivative of KL(q_t || p)")
    axes[0].legend(frameon=False, fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


@plots.styled
def conditions(result: Result) -> Figure:
    """For every setting: the two sides of Theorem 1 along Algorithm 1 (top) and Theorem 2's curvature term
    beside the left-hand sides of the paper's and the corrected Theorem 2 (bottom)."""
    names = [n for n in ("linear", "relu", "tanh", "unperturbed") if f"{n}__steps" in result.arrays]
    fig, axes = plt.subplots(2, len(names), figsize=(3.1 * len(names), 5.2), squeeze=False)
    for j, name in enumerate(names):
        t = result[f"{name}__steps"]
        ax = axes[0, j]
        ax.plot(t, result[f"{name}__t1_lhs"], color=plots.COLORS["particles"], label="E[∇log p·∇log p̃]")
        ax.plot(t, result[f"{name}__t1_rhs"], color=plots.COLORS["law"], ls="--", label="−E[tr H log p̃]")
        ax.set_title(name)
        ax2 = axes[1, j]
        ax2.plot(t, result[f"{name}__t2_paper_lhs"], color=plots.COLORS["particles"],
                 label="E‖∇log p̃‖² (paper)")
        ax2.plot(t, result[f"{name}__t2_corrected_lhs"], color=plots.COLORS["posterior"],
                 label="E‖∇log p‖² (corrected)")
        ax2.plot(t, result[f"{name}__t2_corrected_rhs"], color=plots.COLORS["law"], ls="--", label="corrected r.h.s.")
        curv = result[f"{name}__curvature"]
        ax2.plot(t, np.abs(curv), color=plots.COLORS["gd"], ls=":", label="|curvature term|")
        for a in (ax, ax2):
            a.set_xscale("symlog", linthresh=1)
            a.set_yscale("symlog", linthresh=1)
            a.set_xlim(-0.3, t.max() * 1.2)
            a.set_xlabel("step")
    axes[0, 0].set_ylabel("Theorem 1 sides")
    axes[1, 0].set_ylabel("Theorem 2 terms")
    axes[0, 0].legend(frameon=False, fontsize=7)
    axes[1, 0].legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig
