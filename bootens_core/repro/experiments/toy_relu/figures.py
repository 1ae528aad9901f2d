"""Figure 4: the predictive functions and weight densities, the KL curves, and the histogram study."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ... import plots
from ...store import Result
from .experiment import STEP_LABELS

__all__ = ["posterior", "kl", "kl_histogram"]


@plots.styled
def posterior(result: Result, n_lines: int = 200) -> Figure:
    """Figure 4: predictive functions (ensemble, MH) and the bivariate weight densities (KDEs, exact)."""
    x, y, xg = result["x"], result["y"], result["x_grid"]
    m, sd = result["exact_mean"], result["exact_sd"]
    axis = result["grid_axis"]
    fig, axes = plt.subplots(1, 5, figsize=(13.5, 2.8))
    for ax, f, title, color in (
        (axes[0], result["f_ensemble"], "ensemble, 200 particles", plots.COLORS["particles"]),
        (axes[1], result["f_mh"], "Metropolis-Hastings, 200 samples", plots.COLORS["paper"]),
    ):
        ax.plot(xg, f[:n_lines].T, color=color, alpha=0.07, lw=0.7)
        ax.plot(xg, m, color="black", lw=1.1, label="exact mean")
        ax.plot(xg, m - 1.96 * sd, color="black", lw=0.8, ls="--", label="exact ± 1.96 sd")
        ax.plot(xg, m + 1.96 * sd, color="black", lw=0.8, ls="--")
        ax.plot(x, y, "o", ms=2.2, color=plots.COLORS["data"])
        ax.set_title(title)
        ax.set_xlabel("x")
    axes[0].set_ylabel("f(x)")
    axes[0].legend(frameon=False, loc="upper center")
    axes[1].sharey(axes[0])
    for ax, logd, title, pts in (
        (axes[2], result["log_ensemble"], "ensemble (KDE)", result["particles"]),
        (axes[3], result["log_mh"], "MH (KDE)", result["mh_w"]),
        (axes[4], result["log_exact"], "exact posterior (grid)", None),
    ):
        dens = np.exp(logd).T  # rows = w2
        # Each panel on its own scale (8 levels up to its peak): the KDEs are much flatter than the truth.
        ax.contourf(axis, axis, dens, levels=np.linspace(0, dens.max(), 9)[1:], cmap="Blues", extend="max")
        if pts is not None:
            ax.plot(pts[:, 0], pts[:, 1], ".", ms=1.5, color="black", alpha=0.5)
        ax.set_title(title)
        ax.set_xlabel("w1")
        ax.set_aspect("equal")
        lim = 3.0
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
    axes[2].set_ylabel("w2")
    fig.tight_layout()
    return fig


@plots.styled
def kl(result: Result) -> Figure:
    """Figure 4 (last panel): KL(q_t || p) along Algorithm 1, against MH (the paper's) and the exact posterior."""
    s = result.summary
    t = result["kl_steps"]
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    ax.plot(t, result["kl_vs_mh"], color=plots.COLORS["paper"], label="vs MH (the paper's estimate)")
    ax.plot(t, result["kl_vs_exact"], color=plots.COLORS["posterior"], label="vs exact posterior")
    ax.axhline(s["kl_mh_vs_exact"], color=plots.COLORS["paper"], ls=":", lw=1.1, label="MH samples vs exact")
    lo = s["kde_self_distance_mean"] - 2 * s["kde_self_distance_sd"]
    hi = s["kde_self_distance_mean"] + 2 * s["kde_self_distance_sd"]
    ax.axhspan(max(lo, 1e-4), hi, color="red", alpha=0.12, lw=0)
    ax.axhline(s["kde_self_distance_mean"], color="red", ls=":", lw=1.1,
               label="200 exact samples vs exact (mean ± 2 sd)")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("KL(KDE(q_t) || p)")
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


def kl_histogram(result: Result, zoom_time: float | None = None) -> Figure:
    """The histogram study: KL(q_t || p) along the optimisation at both steps (mean and 2 SE over the repeats),
    its late part relative to the final value, and the share of particles whose weights share a sign."""

    h = result.summary["histogram"]
    t = result["hist_times"]
    tw = h["overshoot_time"]
    zoom_time = zoom_time or min(2.0, float(t[-1]))
    colours = {"paper_step": plots.COLORS["paper"], "small_step": plots.COLORS["particles"]}
    with plt.rc_context(plots.STYLE):
        fig, axes = plt.subplots(1, 3, figsize=(13.0, 3.1))
        pos = t > 0
        for lab in STEP_LABELS:
            k = result[f"hist_kl_{lab}"]
            r = k.shape[0]
            name = f"h = {h[lab]['step_size']:g}"
            m, se = k.mean(0), k.std(0, ddof=1) / np.sqrt(r)
            axes[0].plot(t[pos], m[pos], color=colours[lab], label=name)
            axes[0].fill_between(t[pos], (m - 2 * se)[pos], (m + 2 * se)[pos], color=colours[lab], alpha=0.2, lw=0)
            d = k - k[:, -1:]
            dm, dse = d.mean(0), d.std(0, ddof=1) / np.sqrt(r)
            z = (t >= t[1]) & (t <= zoom_time)
            axes[1].plot(t[z], dm[z], color=colours[lab], label=name)
            axes[1].fill_between(t[z], (dm - 2 * dse)[z], (dm + 2 * dse)[z], color=colours[lab], alpha=0.2, lw=0)
            s = result[f"same_sign_{lab}"]
            axes[2].plot(t[pos], s.mean(0)[pos], color=colours[lab], label=name)
        q = result.summary["quadrant_mass_exact"]
        axes[2].axhline(q[0] + q[3], color=plots.COLORS["posterior"], ls=":", label="exact posterior")
        for ax in (axes[0], axes[2]):
            ax.set_xscale("log")
            ax.set_xlabel("time = step x h")
        for ax in axes:  # the window the "late" statistics exclude
            ax.axvspan(t[1], tw, color="grey", alpha=0.12, lw=0)
        axes[0].set_ylabel("KL(q_t || p), histogram")
        axes[0].set_title(f"from {result['hist_kl_paper_step'][:, 0].mean():.1f} at step 0")
        axes[1].axhline(0, color="black", lw=0.8)
        axes[1].set_ylim(-0.03, 0.05)
        axes[1].set_xlabel("time = step x h")
        axes[1].set_ylabel("KL(q_t || p) - final KL")
        axes[1].set_title("late part (paired differences)")
        axes[2].set_ylabel("share with sign(w1) = sign(w2)")
        axes[2].set_title(f"from {result['same_sign_paper_step'][:, 0].mean():.2f} at step 0")
        axes[2].set_ylim(0, None)
        axes[0].legend(frameon=False)
        axes[2].legend(frameon=False)
        fig.tight_layout()
    plt.close(fig)
    return fig
