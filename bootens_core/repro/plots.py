"""The book's figure style, the drawing helpers every chapter shares, and the performance chapter's figures.

Each experiment's figures live beside it (``experiments/<name>/figures.py``), drawn with :func:`styled`
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
    "bench_throughput",
    "profile_calls",
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


_BENCH_COLORS = {"boston": "#1f77b4", "kin8nm": "#2ca02c", "protein": "#d62728"}


@styled
def bench_throughput(docs: dict[str, dict[str, Any]]) -> Figure:
    """The benchmark (``bench.json`` documents by label, one row of panels each): particle-steps/s against
    the number of particles ``k``, the speed-up over the loop of single-particle trainings (JAX solid,
    PyTorch dotted), and the fraction of the device's roofline; colour = dataset shape, marker = depth.
    Error bars: min to max over the timed repeats."""
    if not docs:
        raise ValueError("no benchmark documents to plot")
    fig, axes = plt.subplots(len(docs), 3, figsize=(9.5, 2.7 * len(docs)), squeeze=False)
    for row, (label, doc) in zip(axes, docs.items(), strict=True):
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in doc["rows"]:
            groups.setdefault((r["model"], r["dataset"]), []).append(r)
        for (model, ds), rs in groups.items():
            rs = sorted(rs, key=lambda r: r["k"])
            k = np.array([r["k"] for r in rs])
            color = _BENCH_COLORS.get(ds, "#555555")
            marker = "o" if model.startswith("mlp-1x") else "s"
            rate = np.array([r["particle_steps_per_s"] for r in rs])
            lo = rate - np.array([r["particle_steps_per_s_spread"]["min"] for r in rs])
            hi = np.array([r["particle_steps_per_s_spread"]["max"] for r in rs]) - rate
            row[0].errorbar(k, rate, yerr=[lo, hi], color=color, marker=marker, ms=3.5, capsize=2,
                            label=f"{model} {ds}")
            row[1].plot(k, [r["speedup_vs_jax_loop"] for r in rs], color=color, marker=marker, ms=3.5)
            if all(r["speedup_vs_torch_loop"] is not None for r in rs):
                row[1].plot(k, [r["speedup_vs_torch_loop"] for r in rs], color=color, marker=marker, ms=3.5,
                            ls=":")
            row[2].plot(k, [r["roofline_fraction"] for r in rs], color=color, marker=marker, ms=3.5)
        dev = doc["device"]
        name = dev.get("cpu_model") if dev.get("platform") == "cpu" else dev.get("kind")
        row[0].set_title(f"{label}: {name} ({dev.get('platform')})", loc="left")
        row[0].set_ylabel("particle-steps / s")
        row[1].axhline(1.0, color=COLORS["prior"], lw=0.8)
        row[1].set_ylabel("speed-up vs loop of k=1 trainings")
        row[2].axhline(1.0, color=COLORS["prior"], lw=0.8)
        row[2].set_ylabel("fraction of roofline")
        for ax in row:
            ax.set_xscale("log")
            ax.set_xlabel("particles k")
        row[0].set_yscale("log")
        row[1].set_yscale("log")
    axes[0, 0].legend(frameon=False, fontsize=7, ncol=1)
    from matplotlib.lines import Line2D

    axes[0, 1].legend(handles=[Line2D([], [], color="#555555", ls="-", label="vs JAX loop"),
                               Line2D([], [], color="#555555", ls=":", label="vs PyTorch loop")],
                      frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


@styled
def profile_calls(doc: dict[str, Any]) -> Figure:
    """The profile of the whole (:func:`bootens_core.repro.profiling.measure`): for every stage, its first and second
    call in one process, wall time split into compilation (tracing, lowering, XLA) and the rest; the number
    of XLA compilations is written beside each bar."""
    calls = doc["calls"]
    if not calls:
        raise ValueError("the profile has no calls to plot")
    fig, ax = plt.subplots(figsize=(7.0, 0.42 * len(calls) + 0.9))
    labels = [f"{c['stage']} — call {c['call']} ({c['detail']})" for c in calls]
    pos = np.arange(len(calls))[::-1]
    comp = np.array([c["compile_s"] for c in calls])
    rest = np.array([c["compute_s"] for c in calls])
    ax.barh(pos, comp, color=COLORS["paper"], label="compilation")
    ax.barh(pos, rest, left=comp, color=COLORS["particles"], label="computation (the rest)")
    for y, c in zip(pos, calls, strict=True):
        ax.text(c["wall_s"], y, f"  {c['wall_s']:.1f} s, {c['compiles']} compiles", va="center", fontsize=7)
    ax.set_yticks(pos, labels, fontsize=7)
    ax.set_xlabel("wall time of the call (s)")
    ax.set_xlim(0, 1.35 * max(c["wall_s"] for c in calls))
    ax.legend(frameon=False, fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ classification
