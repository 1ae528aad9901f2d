"""The book's figure style, the drawing helpers every chapter shares, and the UCI and performance figures.

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
    "uci_splits",
    "uci_lbfgs",
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


_UCI_METRICS = {"rmse": ("test_rmse", "test RMSE"), "mnll": ("test_mnll", "test MNLL"),
                "coverage95": ("coverage95", "95% interval coverage")}
_UCI_METHOD_ORDER = ("ensemble-1", "ensemble-4", "mcd-1", "mcd-4", "sghmc-1", "gp")


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


def _uci_cells(result: Result) -> list[dict[str, Any]]:
    """The split-level rows of a UCI result (its ``cells.csv``), numbers parsed."""
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(result.files["cells.csv"])))
    for r in rows:
        r["layers"] = int(r["hidden_layers"])
        r["id"] = r["method"] if r["method"] == "gp" else f"{r['method']}-{r['layers']}"
        for _, (col, _) in _UCI_METRICS.items():
            r[col] = float(r[col])
    return rows


@styled
def uci_splits(result: Result, metrics: tuple[str, ...] = ("rmse", "mnll", "coverage95")) -> Figure:
    """Split-level UCI results: one row per dataset, one column per metric; for each method the value of
    every split (dots), our mean ± std over splits (black) and the paper's mean ± std (orange, a reference).

    A split whose value is far outside the plotted range (a diverged fit) is drawn as a triangle at the
    edge, with its value written beside it.
    """
    from .experiments.uci import paper_reference

    ref = paper_reference()
    cells = _uci_cells(result)
    datasets = list(dict.fromkeys(r["dataset"] for r in cells))
    ids = [m for m in _UCI_METHOD_ORDER if any(r["id"] == m for r in cells)]
    fig, axes = plt.subplots(len(datasets), len(metrics), figsize=(3.0 * len(metrics), 2.2 * len(datasets) + 0.4),
                             squeeze=False)
    rng = np.random.default_rng(0)
    for i, d in enumerate(datasets):
        for j, metric in enumerate(metrics):
            ax = axes[i, j]
            col, label = _UCI_METRICS[metric]
            ours, papers, extra = [], [], []
            for k, m in enumerate(ids):
                vals = np.asarray([r[col] for r in cells if r["dataset"] == d and r["id"] == m])
                meth, layers = (m, 0) if m == "gp" else (m.rsplit("-", 1)[0], int(m.rsplit("-", 1)[1]))
                p = ref.get((d, meth, layers, metric))
                if p is not None:
                    ax.errorbar(k + 0.22, p[0], yerr=p[1], fmt="s", color=COLORS["paper"], ms=4, capsize=2,
                                )
                    papers.append(p)
                ours += list(vals)
                ax.plot(k - 0.12 + 0.12 * rng.uniform(-1, 1, vals.size), vals, "o", ms=3, alpha=0.6,
                        color=COLORS["particles"])
                if vals.size:
                    ax.errorbar(k - 0.12, np.mean(vals), yerr=np.std(vals), fmt="o", color=COLORS["data"], ms=4,
                                capsize=2)
            if metric == "coverage95":
                ax.axhline(0.95, color=COLORS["prior"], ls=":", lw=1)
                extra.append(0.95)
            _clip_outliers(ax, ours, papers, extra)
            # Method ids rotated: six of them side by side overlap in a panel a third of the page wide.
            ax.set_xticks(range(len(ids)), ids, rotation=35, ha="right", rotation_mode="anchor", fontsize=7)
            ax.set_xlim(-0.6, len(ids) - 0.4)
            ax.set_title(f"{d}: {label}")
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], ls="", marker="o", ms=3, alpha=0.6, color=COLORS["particles"], label="ours, one split"),
        Line2D([], [], ls="-", marker="o", ms=4, color=COLORS["data"], label="ours (mean ± std over splits)"),
        Line2D([], [], ls="-", marker="s", ms=4, color=COLORS["paper"], label="paper (mean ± std, published)"),
        Line2D([], [], ls="", marker="^", ms=5, color=COLORS["law"], label="off the axis (value written)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, 0.3 / (2.2 * len(datasets) + 0.4), 1, 1))
    return fig


def _clip_outliers(ax, ours: list[float], paper: list[tuple[float, float]], extra: list[float]) -> None:
    """Fit the y-axis to the readable values and draw the outliers (a diverged split, a non-finite value) as
    red triangles at the edge with their value written beside them.

    An outlier lies more than 50 scales from the median of our finite values and the paper's means, the
    scale being the largest of their median absolute deviation, the paper's stds and 5% of the median.
    """
    ours_a = np.asarray(ours, float)
    centre = np.concatenate([ours_a[np.isfinite(ours_a)], [m for m, _ in paper]])
    if centre.size == 0:
        return
    med = float(np.median(centre))
    scale = max(float(np.median(np.abs(centre - med))), max((sd for _, sd in paper), default=0.0),
                0.05 * abs(med), 1e-12)
    readable = centre[np.abs(centre - med) <= 50 * scale]
    spans = np.concatenate([readable, [m - sd for m, sd in paper], [m + sd for m, sd in paper], extra])
    lo, hi = float(np.min(spans)), float(np.max(spans))
    pad = 0.08 * (hi - lo) if hi > lo else 0.05 * max(abs(hi), 1.0)
    lo, hi = lo - pad, hi + pad
    for line in list(ax.lines):
        x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
        out = ~np.isfinite(y) | (y > hi) | (y < lo)
        if line.get_marker() != "o" or not out.any():
            continue
        for xi, yi in zip(x[out], y[out], strict=True):
            top = not (np.isfinite(yi) and yi < lo)
            edge = hi if top else lo
            ax.plot(xi, edge, "^" if top else "v", color=COLORS["law"], ms=5, clip_on=False)
            ax.annotate(f"{yi:.2g}", (xi, edge), xytext=(3, -8 if top else 2), textcoords="offset points",
                        fontsize=6, color=COLORS["law"])
        line.set_ydata(np.where(out, np.nan, y))
    ax.set_ylim(lo, hi)


@styled
def uci_lbfgs(check: dict[str, Any]) -> Figure:
    """The L-BFGS check on one particle (:func:`bootens_core.repro.experiments.uci.lbfgs_check`): the loss of the
    paper's fixed-step L-BFGS (by hand and through ``ensemble.train``), optax's line-search L-BFGS and scipy's
    L-BFGS-B against iterations (left); the relative difference between optax's fixed-step update and the one
    built from scipy's inverse-Hessian product (right)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(8.2, 2.9))
    best = min(float(np.nanmin(check[k])) for k in ("fixed", "zoom", "scipy"))
    shift = best - 1.0
    for name, style in (("fixed", dict(color=COLORS["particles"], label="fixed step 0.5 (paper)")),
                        ("train", dict(color=COLORS["data"], ls=":", lw=2, label="ensemble.train, same")),
                        ("zoom", dict(color=COLORS["posterior"], label="zoom line search (ours)")),
                        ("scipy", dict(color=COLORS["paper"], ls="--", label="scipy L-BFGS-B"))):
        v = np.asarray(check[name], float)
        ax.plot(np.arange(v.size), v - shift, **style)
    ax.set_yscale("log")
    ax.set_xlabel("L-BFGS iteration")
    ax.set_ylabel(f"loss − {shift:.4g} (log scale)")
    ax.set_title(f"{check['dataset']} split {check['split']}, {check['hidden_layers']} layer(s), "
                 f"{check['n_params']} parameters", fontsize=8)
    ax.legend(frameon=False, fontsize=7)
    err = np.asarray(check["direction_rel_err"], float)
    ax2.semilogy(np.arange(err.size), np.maximum(err, 1e-17), "o-", ms=2.5, color=COLORS["particles"])
    ax2.axhline(np.finfo(np.float64).eps, color=COLORS["prior"], ls=":", lw=1, label="float64 eps")
    ax2.set_xlabel("L-BFGS iteration")
    ax2.set_ylabel("|optax update − scipy H·g| / |scipy|")
    ax2.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ classification
