"""The book's figure style and the drawing helpers every chapter shares.

Each experiment's figures live beside it (``experiments/<name>/figures.py``; the performance chapter's in
``performance/figures.py``), drawn with :func:`styled`
(the style :data:`STYLE`, colours :data:`COLORS`). Notebooks call figure functions and never style anything
themselves. A figure function takes a :class:`~bootens_core.repro.store.Result` (or the documents it
draws) and returns a closed matplotlib ``Figure`` (a notebook shows it by ending a cell with the call; a script
calls ``fig.savefig``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .store import Result

__all__ = [
    "STYLE",
    "COLORS",
    "styled",
    "band",
    "data_ylim",
    "function_panels",
]

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


def styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Draw ``fn``'s figure in the book's style (:data:`STYLE`) and return it closed."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with plt.rc_context(STYLE):
            fig = fn(*args, **kwargs)
        # Closed, so that pyplot's inline backend does not show it a second time: a notebook cell displays
        # the returned figure once, and a script saves it with fig.savefig.
        plt.close(fig)
        return fig

    return wrapper


def data_ylim(result: Result) -> tuple[float, float]:
    """Vertical limits around the data points ``result["y"]``: their range padded by 1.5 times itself."""
    y = result["y"]
    pad = 1.5 * (y.max() - y.min())
    return float(y.min() - pad), float(y.max() + pad)


def function_panels(result: Result, panels: list[tuple[str, np.ndarray, str]], *, panel_width: float,
                    height: float, alpha: float, ms: float) -> Figure:
    """One panel per ``(title, functions, colour)``: the functions ``(k, n_x)`` on ``result["x_grid"]`` as thin
    lines over the data points, shared axes, vertical limits :func:`data_ylim` (call it inside :func:`styled`)."""
    x, y, xg = result["x"], result["y"], result["x_grid"]
    fig, axes = plt.subplots(1, len(panels), figsize=(panel_width * len(panels), height), sharex=True, sharey=True)
    for ax, (title, lines, color) in zip(axes, panels, strict=True):
        ax.plot(xg, lines.T, color=color, alpha=alpha, lw=0.7)
        ax.plot(x, y, "o", ms=ms, color=COLORS["data"])
        ax.set_title(title)
        ax.set_xlabel("x")
        ax.set_ylim(*data_ylim(result))
    axes[0].set_ylabel("f(x)")
    fig.tight_layout()
    return fig


def band(ax: Any, xg: np.ndarray, f: np.ndarray, color: str, label: str) -> None:
    """Mean and central 95% band of predictive functions ``f`` ``(k, n_x)``."""
    lo, hi = np.percentile(f, [2.5, 97.5], axis=0)
    ax.fill_between(xg, lo, hi, color=color, alpha=0.18, lw=0)
    ax.plot(xg, f.mean(0), color=color, lw=1.3, label=label)
