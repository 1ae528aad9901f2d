"""Figure 3: the particles at stages against the MCMC reference, their agreement along training."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter

from ... import plots
from ...store import Result
from .verdicts import noise_units

__all__ = ["stages", "agreement", "along", "faithful"]


@plots.styled
def stages(result: Result, n_lines: int = 200) -> Figure:
    """Figure 3: 200 particles' functions at the optimisation stages, and the NUTS reference (``n_lines`` of
    its draws, evenly spaced over its chains and draws)."""
    stages, fs, f_ref = result["stages"], result["f_stages"], result["f_nuts"]
    panels = [(f"step {t}", fs[i][:n_lines], plots.COLORS["particles"]) for i, t in enumerate(stages)]
    every = np.linspace(0, len(f_ref) - 1, min(n_lines, len(f_ref))).round().astype(int)
    panels.append(("NUTS reference", f_ref[every], plots.COLORS["paper"]))
    return plots.function_panels(result, panels, panel_width=2.3, height=2.5, alpha=0.06, ms=2.0)


@plots.styled
def agreement(result: Result) -> Figure:
    """Ensemble vs NUTS on the x grid: mean and 95% bands, and the ratio of predictive standard deviations."""
    x, y, xg = result["x"], result["y"], result["x_grid"]
    f_q, f_r = result["f_stages"][-1], result["f_nuts"]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.5, 2.9))
    plots.band(ax0, xg, f_r, plots.COLORS["paper"], "NUTS mean, 95% band")
    plots.band(ax0, xg, f_q, plots.COLORS["particles"], "ensemble mean, 95% band")
    ax0.plot(x, y, "o", ms=2.0, color=plots.COLORS["data"])
    ax0.set_ylim(*plots.data_ylim(result))
    ax0.set_xlabel("x")
    ax0.set_ylabel("f(x)")
    ax0.legend(frameon=False, loc="lower right")
    ratio = f_q.std(0, ddof=1) / f_r.std(0, ddof=1)
    ax1.plot(xg, ratio, color=plots.COLORS["particles"])
    ax1.axhline(1, color="black", lw=0.8, ls=":")
    for xi in x:
        ax1.axvline(xi, color=plots.COLORS["data"], lw=0.4, alpha=0.3)
    ax1.set_yscale("log")
    # A log axis spanning less than a decade gets two ticks at most: label ratios readers can place.
    lo, hi = float(np.nanmin(ratio)), float(np.nanmax(ratio))
    ticks = [t for t in (0.25, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0) if lo / 1.3 <= t <= hi * 1.3]
    ax1.set_ylim(min(lo, 1.0) / 1.15, max(hi, 1.0) * 1.15)
    ax1.yaxis.set_major_locator(FixedLocator(ticks or [1.0]))
    ax1.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax1.yaxis.set_minor_formatter(NullFormatter())
    ax1.set_xlabel("x (grey: data)")
    ax1.set_ylabel("sd ensemble / sd NUTS")
    fig.tight_layout()
    return fig


@plots.styled
def along(result: Result, limit: float = 2.0) -> Figure:
    """The ensemble's distance from the NUTS reference along the optimisation in the rule's noise units
    (:func:`.verdicts.noise_units`): the mean difference and |log sd ratio|; ``limit`` is the rule's
    threshold (:data:`.verdicts.T_LIMIT`)."""
    s = result.summary
    steps = np.asarray(s["agreement_steps"])
    um, us, _ = noise_units(s)
    mad = np.asarray(s["mean_abs_diff_mean_along"]) / um
    lsd = np.abs(np.log(np.asarray(s["sd_ratio_median_along"]))) / us
    fig, ax = plt.subplots(figsize=(5.2, 2.8))
    ax.plot(steps, mad, "o-", ms=3, color=plots.COLORS["particles"], label="mean |Δmean| / sd")
    ax.plot(steps, lsd, "s-", ms=3, color=plots.COLORS["paper"], label="|log sd ratio|")
    ax.axhline(limit, color="black", ls=":", lw=1, label=f"rule's limit ({limit:g} units)")
    ax.set_yscale("log")
    ax.set_xlabel("optimisation step")
    ax.set_ylabel("in noise units")
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


@plots.styled
def faithful(result: Result, n_lines: int = 50) -> Figure:
    """The paper's setting: prior functions under N(0, 1) weights vs the deviation prior, and MH's log density."""
    xg = result["x_grid"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 2.8))
    axes[0].plot(xg, result["f_prior_faithful"][:n_lines].T, color=plots.COLORS["prior"], alpha=0.4, lw=0.7)
    axes[0].set_title("prior functions, weights N(0, 1)")
    axes[1].plot(xg, result["f_prior"][:n_lines].T, color=plots.COLORS["particles"], alpha=0.4, lw=0.7)
    axes[1].set_title("prior functions, weights N(0, 2/fan_in)")
    for ax in axes[:2]:
        ax.set_xlabel("x")
        ax.set_ylabel("f(x)")
    ld = result["mh_faithful_log_density"]
    draws = np.arange(ld.shape[1])
    axes[2].plot(draws, ld.T, lw=0.9)
    axes[2].set_yscale("symlog")
    axes[2].set_xlabel("kept draw")
    axes[2].set_ylabel("log p(D, θ)")
    axes[2].set_title("paper's MH (N(0, 0.01 I)), faithful prior")
    fig.tight_layout()
    return fig
