"""Figure 1: the particles at each stage against the exact posterior."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from scipy import stats

from ... import plots
from ...store import Result

__all__ = ["stages"]


@plots.styled
def stages(result: Result) -> Figure:
    """Figure 1: histograms of the particles at each stage against the analytic posterior density."""
    stages, particles = result["stages"], result["particles"]
    mean_p, sd_p = result["posterior"]
    prior_sd = result.summary["prior_sd"]
    lo, hi = min(-3 * prior_sd, particles.min()), max(3 * prior_sd, particles.max())
    grid = np.linspace(lo, hi, 400)
    fig, axes = plt.subplots(1, len(stages), figsize=(2.1 * len(stages), 2.3), sharex=True, sharey=True)
    for i, (ax, t) in enumerate(zip(np.atleast_1d(axes), stages, strict=True)):
        ax.hist(particles[i], bins=30, range=(lo, hi), density=True, color=plots.COLORS["particles"], alpha=0.55,
                label="particles")
        ax.plot(grid, stats.norm.pdf(grid, 0, prior_sd), ls=":", color=plots.COLORS["prior"], label="prior")
        ax.plot(grid, stats.norm.pdf(grid, mean_p, sd_p), color=plots.COLORS["posterior"], label="exact posterior")
        ax.plot(grid, stats.norm.pdf(grid, result["law_mean"][i], result["law_sd"][i]), ls="--", lw=1.1,
                color=plots.COLORS["law"], label="exact law of the particles")
        ax.set_title(f"step {t}")
        ax.set_xlabel("w")
    np.atleast_1d(axes)[0].set_ylabel("density")
    np.atleast_1d(axes)[-1].legend(loc="upper left", frameon=False)
    fig.tight_layout()
    return fig
