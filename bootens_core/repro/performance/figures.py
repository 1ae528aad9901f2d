"""The performance chapter's figures: the benchmark's throughput, speed-up and roofline fraction against the
number of particles (:func:`throughput`), and where the time of each profiled call goes (:func:`calls`)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..plots import COLORS, styled

__all__ = ["throughput", "calls"]

_SHAPE_COLORS = {"boston": "#1f77b4", "kin8nm": "#2ca02c", "protein": "#d62728"}


@styled
def throughput(docs: dict[str, dict[str, Any]]) -> Figure:
    """The benchmark (``bench.json`` documents by label, one row of panels each): particle-steps/s against
    the number of particles ``k`` (dashed: the roof, where the document has XLA's FLOPs per step), the speed-up over the loop of single-particle trainings (JAX solid,
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
            color = _SHAPE_COLORS.get(ds, "#555555")
            marker = "o" if model.startswith("mlp-1x") else "s"
            rate = np.array([r["particle_steps_per_s"] for r in rs])
            lo = rate - np.array([r["particle_steps_per_s_spread"]["min"] for r in rs])
            hi = np.array([r["particle_steps_per_s_spread"]["max"] for r in rs]) - rate
            row[0].errorbar(k, rate, yerr=[lo, hi], color=color, marker=marker, ms=3.5, capsize=2,
                            label=f"{model} {ds}")
            if all(r.get("xla_flops_per_particle_step") for r in rs):  # the roof, in particle-steps/s
                row[0].plot(k, [r["roofline_flops_per_s"] / r["xla_flops_per_particle_step"] for r in rs],
                            color=color, ls="--", lw=0.9)
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
    handles, _ = axes[0, 0].get_legend_handles_labels()
    axes[0, 0].legend(handles=[*handles, Line2D([], [], color="#555555", ls="--", label="roof")], frameon=False,
                      fontsize=7, ncol=1)
    axes[0, 1].legend(handles=[Line2D([], [], color="#555555", ls="-", label="vs JAX loop"),
                               Line2D([], [], color="#555555", ls=":", label="vs PyTorch loop")],
                      frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


@styled
def calls(doc: dict[str, Any]) -> Figure:
    """The profile of the whole (:func:`.profiling.measure`): for every stage, its first and second
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
