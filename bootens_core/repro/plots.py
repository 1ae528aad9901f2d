"""Every figure of the book. Notebooks call these and never style anything themselves.

Each function takes a :class:`~bootens_core.repro.store.Result` and returns a closed matplotlib ``Figure``
(a notebook shows it by ending a cell with the call; a script calls ``fig.savefig``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter
from scipy import stats

from .store import Result

__all__ = [
    "STYLE",
    "COLORS",
    "styled",
    "band",
    "linear_stages",
    "linear_particles",
    "linear_kl",
    "toy_relu",
    "toy_relu_kl",
    "deep_relu_stages",
    "deep_relu_agreement",
    "deep_relu_faithful",
    "deep_relu_along",
    "theory_linear",
    "theory_conditions",
    "bench_throughput",
    "profile_calls",
    "uci_splits",
    "uci_lbfgs",
    "classification_bands",
    "classification_latent",
    "classification_reliability",
    "classification_alpha",
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


def _ylim(result: Result) -> tuple[float, float]:
    y = result["y"]
    pad = 1.5 * (y.max() - y.min())
    return float(y.min() - pad), float(y.max() + pad)


@styled
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


@styled
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


@styled
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


def band(ax: Any, xg: np.ndarray, f: np.ndarray, color: str, label: str) -> None:
    """Mean and central 95% band of predictive functions ``f`` ``(k, n_x)``."""
    lo, hi = np.percentile(f, [2.5, 97.5], axis=0)
    ax.fill_between(xg, lo, hi, color=color, alpha=0.18, lw=0)
    ax.plot(xg, f.mean(0), color=color, lw=1.3, label=label)


@styled
def toy_relu(result: Result, n_lines: int = 200) -> Figure:
    """Figure 4: predictive functions (ensemble, MH) and the bivariate weight densities (KDEs, exact)."""
    x, y, xg = result["x"], result["y"], result["x_grid"]
    m, sd = result["exact_mean"], result["exact_sd"]
    axis = result["grid_axis"]
    fig, axes = plt.subplots(1, 5, figsize=(13.5, 2.8))
    for ax, f, title, color in (
        (axes[0], result["f_ensemble"], "ensemble, 200 particles", COLORS["particles"]),
        (axes[1], result["f_mh"], "Metropolis-Hastings, 200 samples", COLORS["paper"]),
    ):
        ax.plot(xg, f[:n_lines].T, color=color, alpha=0.07, lw=0.7)
        ax.plot(xg, m, color="black", lw=1.1, label="exact mean")
        ax.plot(xg, m - 1.96 * sd, color="black", lw=0.8, ls="--", label="exact ± 1.96 sd")
        ax.plot(xg, m + 1.96 * sd, color="black", lw=0.8, ls="--")
        ax.plot(x, y, "o", ms=2.2, color=COLORS["data"])
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


@styled
def toy_relu_kl(result: Result) -> Figure:
    """Figure 4 (last panel): KL(q_t || p) along Algorithm 1, against MH (the paper's) and the exact posterior."""
    s = result.summary
    t = result["kl_steps"]
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    ax.plot(t, result["kl_vs_mh"], color=COLORS["paper"], label="vs MH (the paper's estimate)")
    ax.plot(t, result["kl_vs_exact"], color=COLORS["posterior"], label="vs exact posterior")
    ax.axhline(s["kl_mh_vs_exact"], color=COLORS["paper"], ls=":", lw=1.1, label="MH samples vs exact")
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


@styled
def deep_relu_stages(result: Result, n_lines: int = 200) -> Figure:
    """Figure 3: 200 particles' functions at the optimisation stages, and the NUTS reference."""
    x, y, xg = result["x"], result["y"], result["x_grid"]
    stages, fs = result["stages"], result["f_stages"]
    panels = [(f"step {t}", fs[i][:n_lines], COLORS["particles"]) for i, t in enumerate(stages)]
    panels.append(("NUTS reference", result["f_nuts"][:n_lines], COLORS["paper"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(2.3 * len(panels), 2.5), sharex=True, sharey=True)
    for ax, (title, lines, color) in zip(axes, panels, strict=True):
        ax.plot(xg, lines.T, color=color, alpha=0.06, lw=0.7)
        ax.plot(x, y, "o", ms=2.0, color=COLORS["data"])
        ax.set_title(title)
        ax.set_xlabel("x")
        ax.set_ylim(*_ylim(result))
    axes[0].set_ylabel("f(x)")
    fig.tight_layout()
    return fig


@styled
def deep_relu_agreement(result: Result) -> Figure:
    """Ensemble vs NUTS on the x grid: mean and 95% bands, and the ratio of predictive standard deviations."""
    x, y, xg = result["x"], result["y"], result["x_grid"]
    f_q, f_r = result["f_stages"][-1], result["f_nuts"]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.5, 2.9))
    band(ax0, xg, f_r, COLORS["paper"], "NUTS mean, 95% band")
    band(ax0, xg, f_q, COLORS["particles"], "ensemble mean, 95% band")
    ax0.plot(x, y, "o", ms=2.0, color=COLORS["data"])
    ax0.set_ylim(*_ylim(result))
    ax0.set_xlabel("x")
    ax0.set_ylabel("f(x)")
    ax0.legend(frameon=False, loc="lower right")
    ratio = f_q.std(0, ddof=1) / f_r.std(0, ddof=1)
    ax1.plot(xg, ratio, color=COLORS["particles"])
    ax1.axhline(1, color="black", lw=0.8, ls=":")
    for xi in x:
        ax1.axvline(xi, color=COLORS["data"], lw=0.4, alpha=0.3)
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


@styled
def deep_relu_along(result: Result, limit: float = 2.0) -> Figure:
    """The ensemble's distance from the NUTS reference along the optimisation, in units of the reference's
    own half-vs-half noise: the mean difference and |log sd ratio|; ``limit`` is the rule's threshold
    (``report.DEEP_RELU_T``)."""
    s = result.summary
    steps = np.asarray(s["agreement_steps"])
    mad = np.asarray(s["mean_abs_diff_mean_along"]) / s["reference_noise_mad"]
    lsd = np.abs(np.log(np.asarray(s["sd_ratio_median_along"]))) / s["reference_noise_log_sd"]
    fig, ax = plt.subplots(figsize=(5.2, 2.8))
    ax.plot(steps, mad, "o-", ms=3, color=COLORS["particles"], label="mean |Δmean| / sd")
    ax.plot(steps, lsd, "s-", ms=3, color=COLORS["paper"], label="|log sd ratio|")
    ax.axhline(limit, color="black", ls=":", lw=1, label=f"rule's limit ({limit:g} units)")
    ax.set_yscale("log")
    ax.set_xlabel("optimisation step")
    ax.set_ylabel("in half-vs-half noise units")
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


@styled
def deep_relu_faithful(result: Result, n_lines: int = 50) -> Figure:
    """The paper's setting: prior functions under N(0, 1) weights vs the deviation prior, and MH's log density."""
    xg = result["x_grid"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 2.8))
    axes[0].plot(xg, result["f_prior_faithful"][:n_lines].T, color=COLORS["prior"], alpha=0.4, lw=0.7)
    axes[0].set_title("prior functions, weights N(0, 1)")
    axes[1].plot(xg, result["f_prior"][:n_lines].T, color=COLORS["particles"], alpha=0.4, lw=0.7)
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


@styled
def theory_linear(result: Result) -> Figure:
    """The linear model: the exact first-order KL change per unit step, the particles' score-based estimate,
    and Theorem 1's expression (measured and its exact expectation); right: the same without perturbations."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for ax, name, title in ((axes[0], "linear", "Algorithm 1 (perturbed)"),
                            (axes[1], "unperturbed", "unperturbed ensemble")):
        t = result[f"{name}__steps"]
        ax.plot(t, result[f"{name}__exact_rate"], color="black", lw=1.6, label="exact dKL/dh (closed form)")
        se = result[f"{name}__score_rate_se"]
        ax.errorbar(t, result[f"{name}__score_rate"], yerr=2 * se, fmt="o", ms=2.5, color=COLORS["posterior"],
                    label="particles: E[g·(∇log q − ∇log p)] ± 2 se")
        ax.plot(t, result[f"{name}__exact_t1_rate"], color=COLORS["law"], ls="--",
                label="Theorem 1 expression, expectation")
        ax.plot(t, result[f"{name}__t1_rate"], "x", ms=3, color=COLORS["law"], label="Theorem 1 expression, particles")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_xlim(-0.3, t.max() * 1.2)
        ax.set_xlabel("step")
        ax.set_title(title)
    axes[0].set_ylabel("directional derivative of KL(q_t || p)")
    axes[0].legend(frameon=False, fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


@styled
def theory_conditions(result: Result) -> Figure:
    """For every setting: the two sides of Theorem 1 along Algorithm 1 (top) and Theorem 2's curvature term
    beside the left-hand sides of the paper's and the corrected Theorem 2 (bottom)."""
    names = [n for n in ("linear", "relu", "tanh", "unperturbed") if f"{n}__steps" in result.arrays]
    fig, axes = plt.subplots(2, len(names), figsize=(3.1 * len(names), 5.2), squeeze=False)
    for j, name in enumerate(names):
        t = result[f"{name}__steps"]
        ax = axes[0, j]
        ax.plot(t, result[f"{name}__t1_lhs"], color=COLORS["particles"], label="E[∇log p·∇log p̃]")
        ax.plot(t, result[f"{name}__t1_rhs"], color=COLORS["law"], ls="--", label="−E[tr H log p̃]")
        ax.set_title(name)
        ax2 = axes[1, j]
        ax2.plot(t, result[f"{name}__t2_paper_lhs"], color=COLORS["particles"], label="E‖∇log p̃‖² (paper)")
        ax2.plot(t, result[f"{name}__t2_corrected_lhs"], color=COLORS["posterior"], label="E‖∇log p‖² (corrected)")
        ax2.plot(t, result[f"{name}__t2_corrected_rhs"], color=COLORS["law"], ls="--", label="corrected r.h.s.")
        curv = result[f"{name}__curvature"]
        ax2.plot(t, np.abs(curv), color=COLORS["gd"], ls=":", label="|curvature term|")
        for a in (ax, ax2):
            a.set_xscale("symlog", linthresh=1)
            a.set_yscale("symlog", linthresh=1)
            a.set_xlim(-0.3, t.max() * 1.2)
            a.set_xlabel("step")
    axes[0, 0].set_ylabel("Theorem 1 sides")
    axes[1, 0].set_ylabel("Theorem 2 terms")
    axes[0, 0].legend(frameon=False, fontsize=7)
    axes[1, 0].legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


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

_CLASS_METHODS = {"bootstrap": "Bootstrap ensemble", "plain": "Plain ensemble", "mcd": "MC dropout"}
_CLASS_COLORS = {"bootstrap": COLORS["particles"], "plain": COLORS["gd"], "mcd": COLORS["law"], "nuts": COLORS["paper"]}


def _class_data(ax, result: Result) -> None:
    x, labels = result["x"], result["labels"]
    ax.plot(x, labels, "|", ms=9, mew=1.2, color=COLORS["data"], label="data (class 1 at 1)")
    xg, inside = result["x_grid"], np.abs(result["x_grid"]) <= np.abs(x).max()
    ax.plot(xg[inside], result["p_true"][inside], ls="--", lw=1.0, color=COLORS["prior"],
            label="true p(y=1|x) (data range)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("x")


@styled
def classification_bands(result: Result) -> Figure:
    """The appendix figure: mean and 95% band of p(y = 1 | x) over the classifiers of the bootstrap ensemble,
    the plain ensemble and the NUTS reference (each panel overlays the reference's band edges)."""
    xg = result["x_grid"]
    lo_r, hi_r = np.percentile(result["p_nuts"], [2.5, 97.5], axis=0)
    panels = [("bootstrap", "Bootstrap ensemble (Algorithm 1)"), ("plain", "Plain ensemble (no perturbation)"),
              ("nuts", "NUTS, Bernoulli likelihood")]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.0), sharey=True)
    for ax, (key, title) in zip(axes, panels, strict=True):
        band(ax, xg, result[f"p_{key}"], _CLASS_COLORS[key], "mean, 95% band")
        if key != "nuts":
            ax.plot(xg, lo_r, color=_CLASS_COLORS["nuts"], lw=0.9, ls=":")
            ax.plot(xg, hi_r, color=_CLASS_COLORS["nuts"], lw=0.9, ls=":", label="NUTS band edges")
        _class_data(ax, result)
        ax.set_title(title)
    axes[0].set_ylabel("p(y = 1 | x)")
    axes[0].legend(frameon=False, loc="center left", fontsize=7)
    axes[1].legend(frameon=False, loc="center left", fontsize=7)
    fig.tight_layout()
    return fig


@styled
def classification_latent(result: Result) -> Figure:
    """The label transform: each class's latent targets ``y~`` with ``±2 sigma~`` bars (log-normal moment
    matching of Gamma(y + alpha_eps, 1)), and how much the particles' mean loss still decreases per L-BFGS
    iteration (a log scale shows convergence)."""
    x, ly, lv = result["x"], result["latent_y"], result["latent_var"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 2.8))
    for c, ax in enumerate(axes[:2]):
        ax.errorbar(x, ly[:, c], yerr=2 * np.sqrt(lv[:, c]), fmt="o", ms=2.5, lw=0.7, color=COLORS["data"])
        ax.set_title(f"class {c}: latent targets ± 2σ~")
        ax.set_xlabel("x")
    axes[0].set_ylabel("log-space target")
    for key in ("bootstrap", "plain"):
        loss = result[f"loss_{key}"]
        drop = np.maximum(-np.diff(loss), 1e-12)
        axes[2].plot(np.arange(2, loss.size + 1), drop, color=_CLASS_COLORS[key], label=_CLASS_METHODS[key], lw=0.9)
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("L-BFGS iteration")
    axes[2].set_ylabel("decrease of the mean loss")
    axes[2].legend(frameon=False)
    fig.tight_layout()
    return fig


@styled
def classification_reliability(result: Result, dataset: str, n_bins: int | None = None) -> Figure:
    """Reliability diagrams of one real dataset (test rows of every split pooled): accuracy against mean
    confidence per bin, bar width by bin, the bins' counts underneath; the diagonal is perfect calibration."""
    from ..metrics import ece, reliability

    n_bins = int(n_bins or result.summary.get("ece_bins", 10))
    labels = result[f"{dataset}_labels"]
    fig, axes = plt.subplots(2, 3, figsize=(11, 4.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for j, m in enumerate(_CLASS_METHODS):
        probs = result[f"{dataset}_{m}_probs"]
        r = reliability(probs, labels, n_bins)
        centres = 0.5 * (r.edges[:-1] + r.edges[1:])
        ok = r.count > 0
        ax, axc = axes[0, j], axes[1, j]
        ax.bar(centres[ok], r.accuracy[ok], width=np.diff(r.edges)[ok] * 0.9, color=_CLASS_COLORS[m], alpha=0.75,
               label="accuracy")
        ax.plot(r.confidence[ok], r.accuracy[ok], "o", ms=3, color=COLORS["data"], label="(mean confidence, accuracy)")
        ax.plot([0, 1], [0, 1], ls=":", color="black", lw=0.8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{_CLASS_METHODS[m]}: ECE {ece(probs, labels, n_bins):.3f} (pooled)")
        axc.bar(centres, r.count, width=np.diff(r.edges) * 0.9, color=_CLASS_COLORS[m], alpha=0.75)
        axc.set_yscale("symlog")
        axc.set_xlabel("confidence (max class probability)")
    axes[0, 0].set_ylabel("accuracy in bin")
    axes[1, 0].set_ylabel("rows")
    axes[0, 0].legend(frameon=False, loc="upper left", fontsize=7)
    fig.tight_layout()
    return fig


@styled
def classification_alpha(result: Result) -> Figure:
    """Agreement with NUTS against alpha_eps: |mean difference| and |band-edge difference| averaged over the
    grid, with the reference's own noise floor, and the band at the best alpha_eps."""
    a = result["alpha_study"]
    s = result.summary
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 2.9))
    ax0.plot(a, result["alpha_study_prob_mad"], "o-", color=COLORS["particles"], label="mean probability")
    ax0.plot(a, result["alpha_study_band_mad"], "s-", color=COLORS["law"], label="95% band edges")
    ax0.axhline(s["reference_split_band_mad"], color=COLORS["paper"], ls=":", lw=1,
                label="NUTS vs itself (band edges)")
    ax0.axvline(s["alpha_eps"], color="black", lw=0.7, ls="--", label=f"paper's alpha_eps = {s['alpha_eps']:g}")
    ax0.set_xscale("log")
    ax0.set_xlabel("alpha_eps")
    ax0.set_ylabel("mean |bootstrap − NUTS| over x")
    ax0.legend(frameon=False, fontsize=7)
    xg = result["x_grid"]
    band(ax1, xg, result["p_nuts"], _CLASS_COLORS["nuts"], "NUTS")
    band(ax1, xg, result["p_bootstrap_alpha_best"], _CLASS_COLORS["bootstrap"],
          f"bootstrap, alpha_eps = {s['alpha_eps_best_band_mad']:g}")
    _class_data(ax1, result)
    ax1.set_ylabel("p(y = 1 | x)")
    ax1.legend(frameon=False, loc="center left", fontsize=7)
    fig.tight_layout()
    return fig
