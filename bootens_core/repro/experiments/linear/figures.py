"""Figures 2 and 5: the particles' predictive functions at each stage, single particles, the KL curve."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ... import plots
from ...store import Result

__all__ = ["stages", "particles", "kl"]


@plots.styled
def stages(result: Result, run: str = "deviation", n_lines: int = 200) -> Figure:
    """Figure 2: the particles' predictive functions at stages, beside exact posterior samples.

    ``run="deviation"`` shows the converging run, ``run="paper"`` the paper's 400 Adagrad steps.
    """
    stages = result["stages"] if run == "deviation" else result["paper_stages"]
    fs = result["stage_f"] if run == "deviation" else result["paper_stage_f"]
    panels = [(f"step {t}", fs[i][:n_lines], plots.COLORS["particles"]) for i, t in enumerate(stages)]
    panels.append(("exact posterior", result["posterior_f"][:n_lines], plots.COLORS["posterior"]))
    return plots.function_panels(result, panels, panel_width=2.15, height=2.4, alpha=0.08, ms=2.2)


@plots.styled
def particles(result: Result, n: int = 10, run: str = "deviation") -> Figure:
    """Figure 5 (left panels): ``n`` particles at stages over the exact posterior mean and 95% band."""
    stages = result["stages"] if run == "deviation" else result["paper_stages"]
    fs = result["stage_f"] if run == "deviation" else result["paper_stage_f"]
    x, y, xg = result["x"], result["y"], result["x_grid"]
    m, s = result["posterior_mean_f"], result["posterior_sd_f"]
    fig, axes = plt.subplots(1, len(stages), figsize=(2.15 * len(stages), 2.4), sharex=True, sharey=True)
    for i, (ax, t) in enumerate(zip(axes, stages, strict=True)):
        ax.fill_between(xg, m - 1.96 * s, m + 1.96 * s, color=plots.COLORS["posterior"], alpha=0.18, lw=0,
                        label="posterior 95%")
        ax.plot(xg, m, color="black", lw=1.2, label="posterior mean")
        ax.plot(xg, fs[i][:n].T, color=plots.COLORS["particles"], lw=0.9, alpha=0.8)
        ax.plot(x, y, "o", ms=2.0, color=plots.COLORS["data"])
        ax.set_title(f"step {t}")
        ax.set_xlabel("x")
        ax.set_ylim(*plots.data_ylim(result))
    axes[0].set_ylabel("f(x)")
    axes[0].legend(loc="lower left", frameon=False)
    fig.tight_layout()
    return fig


@plots.styled
def kl(result: Result) -> Figure:
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
    ax0.plot(np.arange(kl.size), kl, color=plots.COLORS["particles"],
             label=f"Adagrad h={s['step_size']:g} (deviation)")
    klp = result["paper_kl_curve"]
    ax0.plot(np.arange(klp.size), klp, color=plots.COLORS["paper"],
             label=f"Adagrad h={s['paper_setting_step_size']:g} (paper)")
    ax0.set_ylabel("KL(q_t || p), data subspace")
    ax0.set_title("Algorithm 1 with Adagrad, 200 particles")
    ax0.legend(frameon=False, loc="upper right")
    steps, gd = result["gd_steps"], result["gd_kl"]
    ax1.plot(steps, gd, color=plots.COLORS["law"], label="exact population law")
    emp = result["gd_empirical_kl"]
    ax1.plot(np.arange(emp.size), emp, color=plots.COLORS["gd"], ls="--", label="200 particles")
    ax1.set_title(f"plain gradient ascent, h = 1/λmax = {s['gd_step_size']:.2g}")
    ax1.legend(frameon=False, loc="lower left")
    ax1.set_ylim(1e-3, 2 * max(float(np.nanmax(gd[np.isfinite(gd)])), float(np.nanmax(kl))))
    fig.tight_layout()
    return fig
