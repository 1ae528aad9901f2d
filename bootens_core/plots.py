"""Every figure of the book. Notebooks call these and never style anything themselves.

Each function takes a :class:`~bootens_core.store.Result` and returns a closed matplotlib ``Figure``
(a notebook shows it by ending a cell with the call; a script calls ``fig.savefig``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from scipy import stats

from .store import Result

__all__ = ["STYLE", "COLORS", "univariate", "linear_stages", "linear_particles", "linear_kl"]

STYLE: dict[str, Any] = {
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "lines.linewidth": 1.4,
}

COLORS = {
    "prior": "#7f7f7f",
    "particles": "#1f77b4",
    "posterior": "#2ca02c",
    "law": "#d62728",
    "paper": "#ff7f0e",
    "gd": "#9467bd",
    "data": "#111111",
}


def _styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with plt.rc_context(STYLE):
            fig = fn(*args, **kwargs)
        # Closed, so that pyplot's inline backend does not show it a second time: a notebook cell displays
        # the returned figure once, and a script saves it with fig.savefig.
        plt.close(fig)
        return fig

    return wrapper


@_styled
def univariate(result: Result) -> Figure:
    """Figure 1: histograms of the particles at each stage against the analytic posterior density."""
    stages, particles = result["stages"], result["particles"]
    mean_p, sd_p = result["posterior"]
    prior_sd = result.summary["prior_sd"]
    lo, hi = min(-3 * prior_sd, particles.min()), max(3 * prior_sd, particles.max())
    grid = np.linspace(lo, hi, 400)
    fig, axes = plt.subplots(1, len(stages), figsize=(2.1 * len(stages), 2.3), sharex=True, sharey=True)
    for i, (ax, t) in enumerate(zip(np.atleast_1d(axes), stages, strict=True)):
        ax.hist(particles[i], bins=30, range=(lo, hi), density=True, color=COLORS["particles"], alpha=0.55,
                label="particles")
        ax.plot(grid, stats.norm.pdf(grid, 0, prior_sd), ls=":", color=COLORS["prior"], label="prior")
        ax.plot(grid, stats.norm.pdf(grid, mean_p, sd_p), color=COLORS["posterior"], label="exact posterior")
        ax.plot(grid, stats.norm.pdf(grid, result["law_mean"][i], result["law_sd"][i]), ls="--", lw=1.1,
                color=COLORS["law"], label="exact law of the particles")
        ax.set_title(f"step {t}")
        ax.set_xlabel("w")
    np.atleast_1d(axes)[0].set_ylabel("density")
    np.atleast_1d(axes)[-1].legend(loc="upper left", frameon=False)
    fig.tight_layout()
    return fig


def _ylim(result: Result) -> tuple[float, float]:
    y = result["y"]
    pad = 1.5 * (y.max() - y.min())
    return float(y.min() - pad), float(y.max() + pad)


@_styled
def linear_stages(result: Result, run: str = "deviation", n_lines: int = 200) -> Figure:
    """Figure 2: the particles' predictive functions at stages, beside exact posterior samples.

    ``run="deviation"`` shows the converging run, ``run="paper"`` the paper's 400 Adagrad steps.
    """
    stages = result["stages"] if run == "deviation" else result["paper_stages"]
    fs = result["stage_f"] if run == "deviation" else result["paper_stage_f"]
    x, y, xg = result["x"], result["y"], result["x_grid"]
    n_panels = len(stages) + 1
    fig, axes = plt.subplots(1, n_panels, figsize=(2.15 * n_panels, 2.4), sharex=True, sharey=True)
    panels = [(f"step {t}", fs[i][:n_lines], COLORS["particles"]) for i, t in enumerate(stages)]
    panels.append(("exact posterior", result["posterior_f"][:n_lines], COLORS["posterior"]))
    for ax, (title, lines, color) in zip(axes, panels, strict=True):
        ax.plot(xg, lines.T, color=color, alpha=0.08, lw=0.7)
        ax.plot(x, y, "o", ms=2.2, color=COLORS["data"])
        ax.set_title(title)
        ax.set_xlabel("x")
        ax.set_ylim(*_ylim(result))
    axes[0].set_ylabel("f(x)")
    fig.tight_layout()
    return fig


@_styled
def linear_particles(result: Result, n: int = 10, run: str = "deviation") -> Figure:
    """Figure 5 (left panels): ``n`` particles at stages over the exact posterior mean and 95% band."""
    stages = result["stages"] if run == "deviation" else result["paper_stages"]
    fs = result["stage_f"] if run == "deviation" else result["paper_stage_f"]
    x, y, xg = result["x"], result["y"], result["x_grid"]
    m, s = result["posterior_mean_f"], result["posterior_sd_f"]
    fig, axes = plt.subplots(1, len(stages), figsize=(2.15 * len(stages), 2.4), sharex=True, sharey=True)
    for i, (ax, t) in enumerate(zip(axes, stages, strict=True)):
        ax.fill_between(xg, m - 1.96 * s, m + 1.96 * s, color=COLORS["posterior"], alpha=0.18, lw=0,
                        label="posterior 95%")
        ax.plot(xg, m, color="black", lw=1.2, label="posterior mean")
        ax.plot(xg, fs[i][:n].T, color=COLORS["particles"], lw=0.9, alpha=0.8)
        ax.plot(x, y, "o", ms=2.0, color=COLORS["data"])
        ax.set_title(f"step {t}")
        ax.set_xlabel("x")
        ax.set_ylim(*_ylim(result))
    axes[0].set_ylabel("f(x)")
    axes[0].legend(loc="lower left", frameon=False)
    fig.tight_layout()
    return fig


@_styled
def linear_kl(result: Result) -> Figure:
    """Figure 5 (right panel) and more: KL(q_t || p) along the optimisation against the self-distance.

    Left: the 200-particle estimate for the paper's Adagrad setting and for the deviation that converges.
    Right: plain gradient ascent at h = 1/lambda_max: its exact population law (closed form) and the
    200-particle estimate of the same run.
    """
    s = result.summary
    sd_mean, sd_sd = s["self_distance_mean"], s["self_distance_sd"]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.5, 3.2))
    for ax in (ax0, ax1):
        ax.axhspan(sd_mean - 2 * sd_sd, sd_mean + 2 * sd_sd, color="red", alpha=0.12, lw=0)
        ax.axhline(sd_mean, color="red", ls=":", lw=1.2, label="self-distance (mean ± 2 sd)")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_yscale("log")
        ax.set_xlabel("step")
    kl = result["kl_curve"]
    ax0.plot(np.arange(kl.size), kl, color=COLORS["particles"],
             label=f"Adagrad h={s['step_size']:g} (deviation)")
    klp = result["paper_kl_curve"]
    ax0.plot(np.arange(klp.size), klp, color=COLORS["paper"],
             label=f"Adagrad h={s['paper_setting_step_size']:g} (paper)")
    ax0.set_ylabel("KL(q_t || p), data subspace")
    ax0.set_title("Algorithm 1 with Adagrad, 200 particles")
    ax0.legend(frameon=False, loc="upper right")
    steps, gd = result["gd_steps"], result["gd_kl"]
    ax1.plot(steps, gd, color=COLORS["law"], label="exact population law")
    emp = result["gd_empirical_kl"]
    ax1.plot(np.arange(emp.size), emp, color=COLORS["gd"], ls="--", label="200 particles")
    ax1.set_title(f"plain gradient ascent, h = 1/λmax = {s['gd_step_size']:.2g}")
    ax1.legend(frameon=False, loc="lower left")
    ax1.set_ylim(1e-3, 2 * max(float(np.nanmax(gd[np.isfinite(gd)])), float(np.nanmax(kl))))
    fig.tight_layout()
    return fig
