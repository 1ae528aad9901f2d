"""Tables 1-3's figures: every split's numbers beside the paper's, the PIT histograms, and the L-BFGS check."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ... import plots
from ...store import Result
from . import experiment

__all__ = ["splits", "lbfgs", "pit"]


_METRICS = {"rmse": ("test_rmse", "test RMSE"), "mnll": ("test_mnll", "test MNLL"),
            "coverage95": ("coverage95", "95% interval coverage")}


_METHOD_ORDER = ("ensemble-1", "ensemble-4", "mcd-1", "mcd-4", "sghmc-1", "gp", "plain-1", "plain-4", "deep-1")


def _cells(result: Result) -> list[dict[str, Any]]:
    """The split-level rows of a UCI result (its ``cells.csv``), numbers parsed."""
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(result.files["cells.csv"])))
    for r in rows:
        r["layers"] = int(r["hidden_layers"])
        r["id"] = r["method"] if r["method"] == "gp" else f"{r['method']}-{r['layers']}"
        for _, (col, _) in _METRICS.items():
            r[col] = float(r[col])
    return rows


@plots.styled
def splits(result: Result, metrics: tuple[str, ...] = ("rmse", "mnll", "coverage95")) -> Figure:
    """Split-level UCI results: one row per dataset, one column per metric; for each method the value of
    every split (dots), our mean ± std over splits (black) and the paper's mean ± std (orange, a reference).

    A split whose value is far outside the plotted range (a diverged fit) is drawn as a triangle at the
    edge, with its value written beside it.
    """

    ref = experiment.paper_reference()
    cells = _cells(result)
    datasets = list(dict.fromkeys(r["dataset"] for r in cells))
    ids = [m for m in _METHOD_ORDER if any(r["id"] == m for r in cells)]
    fig, axes = plt.subplots(len(datasets), len(metrics), figsize=(3.0 * len(metrics), 2.2 * len(datasets) + 0.4),
                             squeeze=False)
    rng = np.random.default_rng(0)
    for i, d in enumerate(datasets):
        for j, metric in enumerate(metrics):
            ax = axes[i, j]
            col, label = _METRICS[metric]
            ours, papers, extra = [], [], []
            for k, m in enumerate(ids):
                vals = np.asarray([r[col] for r in cells if r["dataset"] == d and r["id"] == m])
                meth, layers = (m, 0) if m == "gp" else (m.rsplit("-", 1)[0], int(m.rsplit("-", 1)[1]))
                p = ref.get((d, meth, layers, metric))
                if p is not None:
                    ax.errorbar(k + 0.22, p[0], yerr=p[1], fmt="s", color=plots.COLORS["paper"], ms=4, capsize=2,
                                )
                    papers.append(p)
                ours += list(vals)
                ax.plot(k - 0.12 + 0.12 * rng.uniform(-1, 1, vals.size), vals, "o", ms=3, alpha=0.6,
                        color=plots.COLORS["particles"])
                if vals.size:
                    ax.errorbar(k - 0.12, np.mean(vals), yerr=np.std(vals), fmt="o", color=plots.COLORS["data"], ms=4,
                                capsize=2)
            if metric == "coverage95":
                ax.axhline(0.95, color=plots.COLORS["prior"], ls=":", lw=1)
                extra.append(0.95)
            _clip_outliers(ax, ours, papers, extra)
            # Method ids rotated: six of them side by side overlap in a panel a third of the page wide.
            ax.set_xticks(range(len(ids)), ids, rotation=35, ha="right", rotation_mode="anchor", fontsize=7)
            ax.set_xlim(-0.6, len(ids) - 0.4)
            ax.set_title(f"{d}: {label}")
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], ls="", marker="o", ms=3, alpha=0.6, color=plots.COLORS["particles"], label="ours, one split"),
        Line2D([], [], ls="-", marker="o", ms=4, color=plots.COLORS["data"], label="ours (mean ± std over splits)"),
        Line2D([], [], ls="-", marker="s", ms=4, color=plots.COLORS["paper"], label="paper (mean ± std, published)"),
        Line2D([], [], ls="", marker="^", ms=5, color=plots.COLORS["law"], label="off the axis (value written)"),
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
            ax.plot(xi, edge, "^" if top else "v", color=plots.COLORS["law"], ms=5, clip_on=False)
            ax.annotate(f"{yi:.2g}", (xi, edge), xytext=(3, -8 if top else 2), textcoords="offset points",
                        fontsize=6, color=plots.COLORS["law"])
        line.set_ydata(np.where(out, np.nan, y))
    ax.set_ylim(lo, hi)


@plots.styled
def lbfgs(check: dict[str, Any]) -> Figure:
    """The L-BFGS check on one particle (:func:`bootens_core.repro.experiments.uci.lbfgs_check`): the loss of the
    paper's fixed-step L-BFGS (by hand and through ``ensemble.train``), optax's line-search L-BFGS and scipy's
    L-BFGS-B against iterations (left); the relative difference between optax's fixed-step update and the one
    built from scipy's inverse-Hessian product (right)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(8.2, 2.9))
    best = min(float(np.nanmin(check[k])) for k in ("fixed", "zoom", "scipy"))
    shift = best - 1.0
    for name, style in (("fixed", dict(color=plots.COLORS["particles"], label="fixed step 0.5 (paper)")),
                        ("train", dict(color=plots.COLORS["data"], ls=":", lw=2, label="ensemble.train, same")),
                        ("zoom", dict(color=plots.COLORS["posterior"], label="zoom line search (ours)")),
                        ("scipy", dict(color=plots.COLORS["paper"], ls="--", label="scipy L-BFGS-B"))):
        v = np.asarray(check[name], float)
        ax.plot(np.arange(v.size), v - shift, **style)
    ax.set_yscale("log")
    ax.set_xlabel("L-BFGS iteration")
    ax.set_ylabel(f"loss − {shift:.4g} (log scale)")
    ax.set_title(f"{check['dataset']} split {check['split']}, {check['hidden_layers']} layer(s), "
                 f"{check['n_params']} parameters", fontsize=8)
    ax.legend(frameon=False, fontsize=7)
    err = np.asarray(check["direction_rel_err"], float)
    ax2.semilogy(np.arange(err.size), np.maximum(err, 1e-17), "o-", ms=2.5, color=plots.COLORS["particles"])
    ax2.axhline(np.finfo(np.float64).eps, color=plots.COLORS["prior"], ls=":", lw=1, label="float64 eps")
    ax2.set_xlabel("L-BFGS iteration")
    ax2.set_ylabel("|optax update − scipy H·g| / |scipy|")
    ax2.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


@plots.styled
def pit(records: Sequence[Mapping[str, Any]]) -> Figure:
    """PIT histograms of every method's test predictive, pooled over the splits (cells with the calibration
    fields only): one row per dataset, one panel per method. A calibrated predictive gives a flat histogram
    (the dotted line, with the band of ±2 binomial standard deviations); a U shape is overconfidence, a hump
    underconfidence, a slope a biased mean."""
    groups: dict[tuple[str, str], np.ndarray] = {}
    for r in records:
        if r.get("pit_counts") in (None, "", []):
            continue
        key = (str(r["dataset"]), experiment.method_id(r))
        groups[key] = groups.get(key, 0) + np.asarray(r["pit_counts"], float)
    datasets = list(dict.fromkeys(d for d, _ in groups))
    ids = [m for m in _METHOD_ORDER if any(m == mid for _, mid in groups)]
    fig, axes = plt.subplots(len(datasets), len(ids), figsize=(1.55 * len(ids) + 0.4, 1.5 * len(datasets) + 0.5),
                             squeeze=False, sharex=True)
    for i, d in enumerate(datasets):
        for j, m in enumerate(ids):
            ax = axes[i, j]
            counts = groups.get((d, m))
            if counts is None:
                ax.set_axis_off()
                continue
            bins = counts.size
            share = counts / counts.sum()
            ax.bar((np.arange(bins) + 0.5) / bins, share, width=1 / bins, color=plots.COLORS["particles"],
                   edgecolor="white", lw=0.5)
            band = 2 * np.sqrt((1 / bins) * (1 - 1 / bins) / counts.sum())
            ax.axhspan(1 / bins - band, 1 / bins + band, color=plots.COLORS["prior"], alpha=0.2, lw=0)
            ax.axhline(1 / bins, color=plots.COLORS["prior"], ls=":", lw=1)
            ax.set_xlim(0, 1)
            ax.set_yticks([])
            ax.set_title(f"{d}: {m}" if j == 0 else m, fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("PIT", fontsize=7)
    fig.tight_layout()
    return fig
