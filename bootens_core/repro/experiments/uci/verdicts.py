"""Tables 1-3's verdicts and tables: each cell against the paper's, the methods against each other, and the
results others published on the same splits."""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from ... import config, harness, report
from . import experiment
from .config import UCIConfig

__all__ = [
    "PENDING", "TABLE1", "TABLES23", "table", "marks", "DEVIATION_MARKS", "ARTEFACT_MARKS", "size",
    "evaluate",
    "by_column", "by_family", "paper_prior", "coverage", "runs", "lbfgs_variants",
    "noise_selection", "sghmc_study", "SCALE_FIELDS", "paper_scale", "lbfgs_summary", "paired", "ranking",
    "claim", "published", "gaussian_mnll", "mnll_excess", "published_sources",
    "repeats", "calibration", "LEVELS", "deep_lr", "grid_sensitivity",
]


# The paper's method columns (Tables 1-3) as (method, hidden layers) -> label.
_LABELS = {
    ("ensemble", 1): "Ensemble 1-layer", ("ensemble", 4): "Ensemble 4-layer", ("mcd", 1): "MCD 1-layer",
    ("mcd", 4): "MCD 4-layer", ("sghmc", 1): "SGHMC 1-layer", ("gp", 0): "GP",
    # Beyond the paper's columns: the baselines a practitioner would use instead.
    ("plain", 1): "Plain ensemble 1-layer", ("plain", 4): "Plain ensemble 4-layer", ("deep", 1): "Deep ensemble",
}


# Table 1 of the paper shows these four columns; Tables 2-3 show all six.
TABLE1 = (("ensemble", 1), ("ensemble", 4), ("mcd", 4), ("sghmc", 1))
TABLES23 = (("ensemble", 1), ("ensemble", 4), ("mcd", 1), ("mcd", 4), ("sghmc", 1), ("gp", 0))
# Methods whose issue has not landed yet: shown as "pending", never as a number.
PENDING: tuple[str, ...] = ()


def _ours(r: Mapping[str, Any]) -> str:
    """Our entry of a summary row: mean ± SE (SD, splits), 3 significant digits for the mean, 2 for SE and SD."""
    if not np.isfinite(r["mean"]):
        return f"diverged ({r['n_splits']})"
    if not np.isfinite(r.get("se", float("nan"))):
        return f"{report.sig(r['mean'])} ({r['n_splits']})"
    return f"{report.sig(r['mean'])} ± {report.sig(r['se'], 2)} (SD {report.sig(r['sd'], 2)}, {r['n_splits']})"


def _difference(r: Mapping[str, Any]) -> str:
    """Ours minus the paper's with its 95% interval and the equivalence margin, e.g.
    ``-0.12 [-0.45, 0.21] (margin 0.97)``; ``—`` where no interval exists."""
    lo, hi = r.get("ci95", (float("nan"), float("nan")))
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "—"
    return (f"{report.sig(r['diff'], 2)} [{report.sig(lo, 2)}, {report.sig(hi, 2)}] "
            f"(margin {report.sig(r['equivalence_margin'], 2)})")


def marks(
    summary: dict[str, Any],
    metric: str,
    cfg: UCIConfig | None = None,
    tf32: Mapping[tuple[str, str, int], int] | None = None,
) -> dict[tuple[str, str, int], str]:
    """What every entry of one table (``metric``) was made with beyond the paper's setting: (dataset, method,
    hidden layers) -> the marks, ``; ``-separated, of the named deviations (:data:`DEVIATION_MARKS`) and known
    artefacts (:data:`ARTEFACT_MARKS`) that apply, the restarts SGHMC dropped as diverged (with ``cfg``, whose
    ``sghmc.draws`` a restart keeps) and the splits made with TF32 products (``tf32``: column -> how many of
    its splits, :func:`~bootens_core.repro.experiments.uci.coverage.tf32_counts`)."""
    out: dict[tuple[str, str, int], str] = {}
    for r in summary["rows"]:
        if r["metric"] != metric:
            continue
        ds, meth, layers = r["dataset"], r["method"], int(r["hidden_layers"])
        found = [text for (m, lay, d, met), text in (*DEVIATION_MARKS.items(), *ARTEFACT_MARKS.items())
                 if m == meth and lay in (None, layers) and d in (None, ds) and met in (None, metric)]
        if meth == "sghmc" and cfg is not None:
            dropped = int(r["diverged_particles"]) // cfg.sghmc.draws
            of = int(r["n_splits"]) * cfg.sghmc.restarts
            found.append(f"{dropped} of {of} restarts dropped (diverged)")
        n_tf32 = (tf32 or {}).get((ds, meth, layers), 0)
        if n_tf32:
            found.append(f"TF32 products on {n_tf32} of {int(r['n_splits'])} splits")
        out[(ds, meth, layers)] = "; ".join(found)
    return out


# Named deviations of the paper-scale records (the chapter's table of deviations), as (method, hidden layers
# or None for all, dataset or None, metric or None) -> the mark a table entry carries.
DEVIATION_MARKS: dict[tuple[str, int | None, str | None, str | None], str] = {
    ("ensemble", None, None, None): "zoom line search",
    ("gp", None, "protein", None): "SGPR for SVGP",
}
# Known artefacts: a difference that comes from a library setting, not the method.
ARTEFACT_MARKS: dict[tuple[str, int | None, str | None, str | None], str] = {
    ("gp", None, "naval", "mnll"): "noise at GPflow's lower bound",
}


def table(
    summary: dict[str, Any], metric: str, columns: tuple[tuple[str, int], ...] = TABLES23,
    marks: Mapping[tuple[str, str, int], str] | None = None,
) -> pd.DataFrame:
    """One of the paper's UCI tables for ``metric`` (``rmse``, ``mnll`` or ``coverage95``), ours beside theirs.

    One row per dataset (with its size n) and method column of the paper (``columns``, in that order), so that
    the table stays a few entries wide whatever the number of methods: ``ours`` (mean ± SE over the splits
    run, with the SD over splits and their number: ``3.04 ± 0.21 (SD 0.67, 10)``; 3 significant digits),
    ``paper`` (the published mean ± its SE, with the published SD and the paper's number of splits: a
    reference, nothing computed but the SE), ``ours − paper`` (the difference, its 95% interval and the
    equivalence margin), ``verdict`` (the equivalence rule of
    :func:`bootens_core.repro.experiments.uci.compare_with_paper`, with the two-sided p-value of the
    difference) and ``made with`` (``marks``, e.g. of :func:`marks`: deviations, artefacts, TF32 cells). A
    method whose issue has not landed shows "pending"; one not run in this profile shows "not run".
    """
    rows = {(r["dataset"], r["method"], int(r["hidden_layers"])): r for r in summary["rows"] if r["metric"] == metric}
    from ....data.uci import PAPER_SPLITS

    ref = experiment.paper_reference()
    datasets = list(dict.fromkeys(summary["datasets"]))
    index, ours, paper, diff, verdict, made = [], [], [], [], [], []
    for d in datasets:
        for meth, layers in columns:
            index.append((f"{d} (n={size(d)})", _LABELS[(meth, layers)]))
            r = rows.get((d, meth, layers))
            p = ref.get((d, meth, layers, metric))
            if p:
                n_p = PAPER_SPLITS[d]
                paper.append(f"{p[0]:.2f} ± {report.sig(max(p[1], 0.005) / np.sqrt(n_p), 2)} (SD {p[1]:.2f}, {n_p})")
            else:
                paper.append("—")
            made.append((marks or {}).get((d, meth, layers), ""))
            if r is not None:
                ours.append(_ours(r))
                diff.append(_difference(r) if r.get("paper_mean") is not None else "—")
                v = r.get("equivalence", r["verdict"])
                if np.isfinite(r.get("p", float("nan"))):
                    v += f" (p {r['p']:.3g})"
                verdict.append(v + (f", {r['diverged_particles']} diverged" if r["diverged_particles"] else ""))
            else:
                ours.append("pending" if meth in PENDING else "not run")
                diff.append("")
                verdict.append("")
    return pd.DataFrame(
        {"ours": ours, "paper": paper, "ours − paper [95% CI]": diff, "verdict": verdict, "made with": made},
        index=pd.MultiIndex.from_tuples(index, names=["dataset", "method"]),
    )


@functools.cache
def size(dataset: str) -> int:
    """The number of rows of a UCI dataset, as the paper's tables give it."""
    text = resources.files("bootens_core.data").joinpath("paper_uci_tables.csv").read_text()
    sizes = {r["dataset"]: int(r["size"]) for r in csv.DictReader(io.StringIO(text))}
    if dataset not in sizes:
        raise KeyError(f"unknown UCI dataset {dataset!r}: known are {', '.join(sorted(sizes))}")
    return sizes[dataset]


def evaluate(summary: dict[str, Any]) -> dict[str, report.Text]:
    """Counts of the comparison with the paper's Tables 2-3 (RMSE and MNLL entries the paper has; coverage is
    ours only), by the equivalence rule of :func:`bootens_core.repro.experiments.uci.compare_with_paper`.

    ``counts``: the entries that exist, how many of them are testable (neither failed, nor with too few
    splits, nor untestable) and each verdict's count with its denominator; ``differ_holm`` names the entries
    whose difference from the paper is significant at a family-wise 5% (Holm over the testable ones), with the
    side of the paper's mean they fall on ("none"); ``computed`` says only what no rounding can change
    (entries compared and failed); ``equivalent``: "E of T testable".
    """
    rows = [r for r in summary["rows"] if r["metric"] in ("rmse", "mnll") and r["paper_mean"] is not None]
    count = {v: sum(r["equivalence"] == v for r in rows) for v in experiment.EQUIVALENCE_VERDICTS}
    n = len(rows)
    testable = n - count["failed"] - count["too few splits"] - count["untestable"]
    div = summary.get("diverged_particles_total", 0)
    level = summary.get("level", 0.05)
    differ = [r for r, d in zip(rows, experiment.holm(experiment.testable_pvalues(rows), level)) if d]
    named = ", ".join(
        f"{_LABELS[(r['method'], int(r['hidden_layers']))]} {r['dataset'].capitalize()} {r['metric'].upper()} "
        f"({'below' if r['mean'] < r['paper_mean'] else 'above'} the paper's)" for r in differ)
    rest = [f"{count[v]} {v}" for v in ("untestable", "failed", "too few splits") if count[v]]
    return {
        "differ_holm": report.Text(named or "none"),
        "computed": report.Text(f"{n} RMSE/MNLL entries compared with the paper, {count['failed']} failed"),
        "equivalent": report.Text(f"{count['equivalent']} of {testable} testable"),
        "counts": report.Text(
            f"of {n} RMSE/MNLL entries, {testable} testable: {count['equivalent']} equivalent to the paper's "
            f"within its SD (two one-sided tests at {level:.0%}), "
            f"{count['differs (ours lower)']} differ with ours lower, {count['differs (ours higher)']} differ "
            f"with ours higher, {count['inconclusive']} inconclusive"
            + (f"; not testable: {', '.join(rest)}" if rest else "")
            + f"; at a family-wise {level:.0%} (Holm) {len(differ)} differ; {div} diverged particles"
        ),
    }


def by_column(summary: dict[str, Any], columns: tuple[tuple[str, int], ...] = TABLES23) -> pd.DataFrame:
    """The verdicts per method column of Tables 2-3 (ensembles first, then the baselines): how many datasets
    the summary holds a column's cells for, and how many of its RMSE and MNLL entries have each verdict of
    the equivalence rule (:data:`~bootens_core.repro.experiments.uci.EQUIVALENCE_VERDICTS`; the two
    *differs* verdicts as ``ours lower`` and ``ours higher``); ``not testable`` sums the untestable, failed
    and too-few-splits entries (the tables of entries say which)."""
    out = []
    for meth, layers in columns:
        rows = [r for r in summary["rows"] if (r["method"], int(r["hidden_layers"])) == (meth, layers)
                and r["metric"] in ("rmse", "mnll") and r["paper_mean"] is not None]
        count = {v: sum(r["equivalence"] == v for r in rows) for v in experiment.EQUIVALENCE_VERDICTS}
        untested = count["failed"] + count["too few splits"] + count["untestable"]
        out.append({"family": "bootstrap ensemble" if meth == "ensemble" else "baseline",
                    "method": _LABELS[(meth, layers)],
                    "datasets": len({r["dataset"] for r in rows}), "entries": len(rows),
                    "testable": len(rows) - untested, "equivalent": count["equivalent"],
                    "ours lower": count["differs (ours lower)"], "ours higher": count["differs (ours higher)"],
                    "inconclusive": count["inconclusive"], "not testable": untested})
    return pd.DataFrame(out).set_index(["family", "method"])


def by_family(summary: dict[str, Any], columns: tuple[tuple[str, int], ...] = TABLES23) -> report.Text:
    """:func:`by_column`'s counts summed per family, in one line: for the bootstrap ensembles and for the
    baselines, how many RMSE/MNLL entries exist, how many are testable, and how many of those are equivalent to the paper's, differ either way, or are
    inconclusive (e.g. for the book's introduction)."""
    table = by_column(summary, columns)
    parts = []
    for family, name in (("bootstrap ensemble", "bootstrap ensembles"), ("baseline", "baselines")):
        if family not in table.index.get_level_values(0):
            continue
        s = table.loc[family].sum()
        parts.append(f"{name}: of {s['entries']} entries, {s['testable']} testable: {s['equivalent']} equivalent, "
                     f"{s['ours lower']} lower, {s['ours higher']} higher, "
                     f"{s['inconclusive']} inconclusive")
    return report.Text("; ".join(parts) or "no entry")


def _big(x: float) -> str:
    """3 significant digits, in exponent form from 10^5 on (a diverged particle's RMSE can be 10^21)."""
    return f"{x:.3g}" if abs(x) >= 1e5 else report.sig(x)


def paper_prior(rows: Sequence[Any], level: float = 0.05) -> tuple[report.Verdict, pd.DataFrame]:
    """The 4-layer ensemble at the paper's weight prior N(0, 1), judged: each dataset and record
    (:func:`~bootens_core.repro.experiments.uci.coverage.prior_rows`) by the equivalence rule of
    :func:`~bootens_core.repro.experiments.uci.compare_with_paper` on RMSE, and a verdict over them.

    *NOT reproduced* when at least one dataset's RMSE differs from the paper's with ours higher and none is
    equivalent or lower; *reproduced* when every testable one is equivalent; otherwise *inconclusive* (or
    *too few splits* when no row has :data:`~bootens_core.repro.experiments.uci.MIN_SPLITS`). The table
    says how many splits of each row computed float32 products (the rest TF32, lower precision than the
    paper's: they count neither towards a column nor as evidence for the deviation, but a failure tens of
    times the paper's RMSE is not a rounding effect)."""
    from ....data.uci import PAPER_SPLITS

    table, verdicts = [], []
    for r in rows:
        c = experiment.compare_with_paper(list(r.rmse), r.paper_rmse, r.paper_sd, PAPER_SPLITS[r.dataset],
                                          level)
        verdicts.append(c["equivalence"])
        table.append({"dataset": r.dataset, "record": r.record, "splits": len(r.rmse),
                      "float32 splits": r.float32,
                      "RMSE, ours: median (range)": f"{_big(float(np.median(r.rmse)))} ({_big(min(r.rmse))}–"
                                                    f"{_big(max(r.rmse))})",
                      "RMSE, paper": f"{r.paper_rmse:.2f} (SD {r.paper_sd:.2f})",
                      "median / paper": f"{_big(float(np.median(r.rmse)) / r.paper_rmse)}×",
                      "verdict": c["equivalence"] + (f" (p {c['p']:.2g})" if np.isfinite(c["p"]) else "")})
    tested = [v for v in verdicts if v not in ("too few splits", "failed", "untestable")]
    higher = sum(v == "differs (ours higher)" for v in tested)
    if not tested:
        word = "too few splits"
    elif higher and not any(v in ("equivalent", "differs (ours lower)") for v in tested):
        word = "NOT reproduced: fails (RMSE above the paper's)"
    elif all(v == "equivalent" for v in tested):
        word = "reproduced"
    else:
        word = "inconclusive"
    datasets = sorted({r.dataset for r in rows})
    evidence = (f"{higher} of {len(tested)} testable dataset × record rows differ with ours higher, on "
                f"{', '.join(datasets) or 'no dataset'}; {sum(len(r.rmse) for r in rows)} splits in all, "
                f"{sum(r.float32 for r in rows)} with float32 products")
    frame = pd.DataFrame(table, columns=["dataset", "record", "splits", "float32 splits",
                                         "RMSE, ours: median (range)", "RMSE, paper", "median / paper",
                                         "verdict"])
    return report.Verdict(word, evidence), frame.set_index(["dataset", "record"])


def coverage(summary: dict[str, Any]) -> pd.DataFrame:
    """Coverage of the central 95% predictive interval on the test points (mean ± std over splits)."""
    rows = [r for r in summary["rows"] if r["metric"] == "coverage95"]
    out = pd.DataFrame(
        {
            "dataset": [r["dataset"] for r in rows],
            "method": [_LABELS[(r["method"], int(r["hidden_layers"]))] for r in rows],
            "coverage": [report.pm(r["mean"], r["std"]) for r in rows],
        }
    )
    return out.pivot(index="dataset", columns="method", values="coverage").fillna("not run")


def runs(runs: dict[str, dict[str, Any]], metric: str) -> pd.DataFrame:
    """Several runs of the same cells side by side (e.g. the faithful fixed step vs the line search).

    ``runs`` maps a column label to a summary; rows are the (dataset, method) pairs of the first run; entries
    are mean ± std over splits with the number of diverged particles.
    """
    table: dict[str, dict[str, str]] = {}
    for label, s in runs.items():
        col = {}
        for r in s["rows"]:
            if r["metric"] != metric:
                continue
            name = f"{r['dataset']}, {_LABELS[(r['method'], int(r['hidden_layers']))]}"
            div = f", {r['diverged_particles']} diverged" if r["diverged_particles"] else ""
            col[name] = f"{report.pm(r['mean'], r['std'])} ({r['n_splits']} splits{div})"
        table[label] = col
    names = list(next(iter(table.values()), {}))
    return pd.DataFrame({label: [col.get(n, "not run") for n in names] for label, col in table.items()},
                        index=pd.Index(names, dtype=object))


def lbfgs_variants(cells: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Diverged particles per split for L-BFGS variants on the same cells
    (:func:`bootens_core.repro.experiments.uci.lbfgs_variant_cells`).

    Rows: (sigma^2 in standardised label units, dataset, hidden layers); columns: the variants; entries: the
    diverged particles of each split, in split order, and the particles per cell (``"4, 0, 1 of 200"``);
    ``"not run"`` where a variant has no cell. Rows and columns keep the order of first appearance.
    """
    table: dict[tuple[str, str, int], dict[str, dict[int, tuple[int, int]]]] = {}
    columns: list[str] = []
    for c in cells:
        row = (f"{float(c['noise_var_std_units']):g}", str(c["dataset"]), int(c["hidden_layers"]))
        col = str(c["optimizer"])
        if col not in columns:
            columns.append(col)
        k = int(c["n_components"]) + int(c["diverged_particles"])
        table.setdefault(row, {}).setdefault(col, {})[int(c["split"])] = (int(c["diverged_particles"]), k)
    def entry(splits: dict[int, tuple[int, int]] | None) -> str:
        if not splits:
            return "not run"
        sizes = {k for _, k in splits.values()}
        size = f" of {sizes.pop()}" if len(sizes) == 1 else ""
        return ", ".join(str(splits[s][0]) for s in sorted(splits)) + size
    rows = sorted(table, key=lambda r: (float(r[0]), r[2]))
    index = pd.MultiIndex.from_tuples(rows, names=["σ² (standardised)", "dataset", "hidden layers"])
    return pd.DataFrame({col: [entry(table[r].get(col)) for r in rows] for col in columns}, index=index)


def noise_selection(result: Any) -> pd.DataFrame:
    """The likelihood variance each cell used, in standardised label units, per dataset and method.

    For the methods that select it on the ``noise_grid`` (the ensembles), the median over splits and how many
    splits chose the smallest or the largest grid value (a choice at an edge means the grid may have cut off
    the validation optimum); for the others (the GP's marginal likelihood, MC dropout's 1/tau from Gal's own
    grid), the median value (edges of the noise grid do not apply).
    ``result`` is a UCI :class:`~bootens_core.repro.Result` (its ``cells.csv`` and ``config``).
    """
    cells = pd.read_csv(io.StringIO(result.files["cells.csv"]))
    grid = result.config["noise_grid"]
    lo, hi = min(grid), max(grid)
    rows = []
    for (d, m, layers), g in cells.groupby(["dataset", "method", "hidden_layers"], sort=False):
        v = g["noise_var_std_units"].to_numpy(float)
        fitted = (not str(g["selection"].iloc[0]).startswith("validation MNLL")) if "selection" in g else m == "gp"
        rows.append({
            "dataset": d,
            "method": _LABELS[(m, int(layers))],
            "splits": len(v),
            "median σ² (std units)": f"{np.median(v):.2g}",
            f"at grid min {lo:g}": "—" if fitted else int(np.sum(np.isclose(v, lo))),
            f"at grid max {hi:g}": "—" if fitted else int(np.sum(np.isclose(v, hi))),
        })
    return pd.DataFrame(rows).set_index(["dataset", "method"])


def sghmc_study(study: dict[str, Any]) -> pd.DataFrame:
    """The SGHMC step-size study (:func:`bootens_core.repro.experiments.uci.sghmc_step_study`) as a table: one row per
    step size, test scores of the kept draws (original units), diverged restarts and the predictive R-hat
    across restarts (mean and max over the test inputs)."""
    rows = study["rows"]
    return pd.DataFrame({
        "test RMSE": [f"{r['test_rmse']:.2f}" for r in rows],
        "test MNLL": [f"{r['test_mnll']:.2f}" for r in rows],
        "95% coverage": [f"{r['coverage95']:.2f}" for r in rows],
        "diverged restarts": [r["diverged_restarts"] for r in rows],
        "predictive R-hat mean (max)": [f"{r['rhat_mean']:.2f} ({r['rhat_max']:.2f})" for r in rows],
        "wall s": [f"{r['wall_s']:.1f}" for r in rows],
    }, index=pd.Index([f"{r['step_size']:.3g}" for r in rows], name="step ε"))


# What makes a cell "paper scale" beside every split being there: the settings of its method family that set
# the amount of computation (particles, optimisation length, chain length, grid sizes) at the paper's values.
SCALE_FIELDS: dict[str, tuple[str, ...]] = {
    "ensemble": ("n_particles", "lbfgs.steps", "lbfgs.iters_per_step", "noise_grid", "val_fraction"),
    "mcd": ("mcd.epochs_x", "mcd.samples"),
    "sghmc": ("sghmc.restarts", "sghmc.draws", "sghmc.burn_in", "sghmc.thin", "noise_grid", "val_fraction"),
    "gp": ("gp.max_iter", "gp.n_inducing", "gp.svgp_datasets"),
}


def paper_scale(records: dict[str, Any]) -> tuple[pd.DataFrame, report.Text]:
    """How many cells of the paper's Tables 2-3 exist at the paper's scale in the given records.

    ``records``: label -> a stored UCI result (``summary`` and ``config``). A table cell (dataset x method
    column x metric, RMSE or MNLL) exists when some record made with the paper's values of the fields
    :data:`SCALE_FIELDS` names for that method holds every one of the dataset's splits (10, 5 on Protein).
    Returns one row per method column (datasets complete, table cells, splits present at paper scale, and
    which records hold them) and the overall count as text (e.g. "24 of 108 table cells").
    """
    from ....data.uci import PAPER_SPLITS

    paper = UCIConfig.paper()
    best: dict[tuple[str, int, str], tuple[int, str]] = {}
    for label, rec in records.items():
        cfg = config.from_dict(UCIConfig, rec.config)
        for r in rec.summary["rows"]:
            if r["metric"] != "rmse":
                continue
            meth, layers, d = r["method"], int(r["hidden_layers"]), r["dataset"]
            fields = SCALE_FIELDS.get(meth, ())
            if any(config.get(cfg, f) != config.get(paper, f) for f in fields):
                continue
            k = (meth, layers, d)
            if int(r["n_splits"]) > best.get(k, (0, ""))[0]:
                best[k] = (int(r["n_splits"]), label)
    rows, total = [], 0
    datasets = list(PAPER_SPLITS)
    for meth, layers in TABLES23:
        done = [d for d in datasets if best.get((meth, layers, d), (0, ""))[0] >= PAPER_SPLITS[d]]
        splits = sum(min(best.get((meth, layers, d), (0, ""))[0], PAPER_SPLITS[d]) for d in datasets)
        where = sorted({best[(meth, layers, d)][1] for d in datasets if (meth, layers, d) in best})
        total += 2 * len(done)
        rows.append({
            "method": _LABELS[(meth, layers)],
            f"datasets complete (of {len(datasets)})": len(done),
            f"table cells (of {2 * len(datasets)})": 2 * len(done),
            f"splits at paper scale (of {sum(PAPER_SPLITS.values())})": splits,
            "complete on": ", ".join(done) if done else "—",
            "record": ", ".join(where) if where else "—",
        })
    n_all = 2 * len(datasets) * len(TABLES23)
    return pd.DataFrame(rows).set_index("method"), report.Text(f"{total} of {n_all} table cells")


def lbfgs_summary(check: dict[str, Any], tol: float = 1e-9) -> dict[str, Any]:
    """Numbers of the L-BFGS check on one particle (:func:`bootens_core.repro.experiments.uci.lbfgs_check`).

    ``train_agree_iters``: iterations for which ``ensemble.train`` and the hand loop agree to relative ``tol``
    (they start identical; the fixed step is not a descent method, so rounding differences of the batched
    computation grow once the loss starts rising). ``fixed_rise_fraction``: share of fixed-step iterations
    whose loss is above the previous one. ``loss_at_32``: the loss after the literal 32 iterations.
    """
    fixed, train = np.asarray(check["fixed"]), np.asarray(check["train"])
    rel = np.abs(train - fixed) / np.abs(fixed)
    bad = np.flatnonzero(rel > tol)
    n32 = min(32, fixed.size - 1)
    return {
        "n_iters": int(fixed.size),
        "direction_rel_err_max": float(np.max(check["direction_rel_err"])),
        "train_agree_iters": int(bad[0]) if bad.size else int(fixed.size),
        "fixed_rise_fraction": float(np.mean(np.diff(fixed) > 0)),
        "loss_at_32": {k: float(np.asarray(check[k])[n32]) for k in ("fixed", "zoom", "scipy")},
        "loss_final": dict(check["final"]),
        "scipy_nfev": int(check["scipy_nfev"]),
    }


def _label(method_id: str) -> str:
    family, _, layers = method_id.partition("-")
    return _LABELS[(family, int(layers) if layers else 0)]


def paired(records: Sequence[Mapping[str, Any]], level: float = 0.05,
           baselines: Sequence[str] = experiment.BASELINE_IDS,
           metrics: Sequence[str] = ("rmse", "mnll"),
           ensembles: Sequence[str] = experiment.ENSEMBLE_IDS) -> pd.DataFrame:
    """Bootstrap ensembles against each baseline on the same splits
    (:func:`bootens_core.repro.experiments.uci.paired_comparisons`): per dataset, metric, ensemble and baseline the
    common splits, the mean over them of (ensemble − baseline) ± its SE over splits, the paired t (df) and
    its two-sided p-value (``scipy.stats.ttest_rel``), and what the ensemble is at ``level``. ``baselines``:
    the paper's (MC dropout, SGHMC, GP) or :data:`~bootens_core.repro.experiments.uci.PRACTICE_IDS`;
    ``metrics`` among ``rmse``, ``mnll``, ``coverage95`` and ``crps``; ``ensembles``: which bootstrap
    ensembles (method ids)."""

    rows = []
    for r in experiment.paired_comparisons(records, ensembles=ensembles, baselines=baselines, metrics=metrics,
                                           level=level):
        ok = np.isfinite(r["se"])
        rows.append({
            "dataset": r["dataset"], "metric": r["metric"].upper(), "ensemble": _label(r["ensemble"]),
            "baseline": _label(r["baseline"]),
            "splits": r["n"] if not r["dropped"] else f"{r['n']} ({r['dropped']} failed, left out)",
            "ensemble − baseline": (f"{report.sig(r['diff'])} ± {report.sig(r['se'], 2)}" if ok else
                                    (report.sig(r["diff"]) if np.isfinite(r["diff"]) else "—")),
            "t (df)": f"{r['t']:.2f} ({r['df']})" if ok else "—",
            "p": f"{r['p']:.3g}" if np.isfinite(r["p"]) else "—",
            "ensemble is": r["verdict"],
        })
    cols = ["dataset", "metric", "ensemble", "baseline", "splits", "ensemble − baseline", "t (df)", "p",
            "ensemble is"]
    return pd.DataFrame(rows, columns=cols).set_index(["dataset", "metric", "ensemble", "baseline"])


def repeats(
    reference: Sequence[Mapping[str, Any]],
    repeated: Mapping[str, Sequence[Mapping[str, Any]]],
    level: float = 0.05,
) -> pd.DataFrame:
    """The same cells computed again against a reference record, split by split
    (:func:`bootens_core.repro.experiments.uci.repeated_cells`): per repeat (e.g. the device and its float32
    products), dataset, method and metric the common splits, on how many the repeat is higher, the mean of
    (repeat − reference) ± its SE over splits, the paired t (df), its two-sided p-value and what the repeat is
    at ``level`` (``better`` = lower error than the reference)."""

    rows = []
    for r in experiment.repeated_cells(reference, repeated, level=level):
        ok = np.isfinite(r["se"])
        rows.append({
            "repeat": r["label"], "dataset": r["dataset"], "method": _label(r["method"]),
            "metric": r["metric"].upper(), "splits": r["n"], "higher on": f"{r['higher']} of {r['n']}",
            "repeat − reference": (f"{report.sig(r['diff'])} ± {report.sig(r['se'], 2)}" if ok else
                                   (report.sig(r["diff"]) if np.isfinite(r["diff"]) else "—")),
            "t (df)": f"{r['t']:.2f} ({r['df']})" if ok else "—",
            "p": f"{r['p']:.3g}" if np.isfinite(r["p"]) else "—",
            "repeat is": r["verdict"],
        })
    cols = ["repeat", "dataset", "method", "metric", "splits", "higher on", "repeat − reference", "t (df)", "p",
            "repeat is"]
    return pd.DataFrame(rows, columns=cols).set_index(["repeat", "dataset", "method", "metric"])


def grid_sensitivity(
    records: Sequence[Mapping[str, Any]], finer: Sequence[Mapping[str, Any]], level: float = 0.05,
) -> tuple[pd.DataFrame, pd.DataFrame, report.Text]:
    """How the σ² grid's resolution moves the comparative claim: the same ensemble cells selected on a finer
    grid (``finer``: cells of the same datasets, splits and method ids as cells of ``records``, made with
    another ``noise_grid``), against the record's.

    Returns three things. ``selected``: per dataset, method and split, the σ² each grid selected (standardised
    label units) and the two cells' test RMSE and MNLL. ``pairs``: the comparative claim's pairs
    (:func:`claim`'s rule: the ensemble against the best baseline, paired over the common splits at ``level``)
    on the datasets ``finer`` holds, restricted to the splits it holds, once with the record's cells and once
    with the finer grid's in their place; whether the pair's verdict moves. ``text``: how many of those pairs
    move, with the denominator; a pair needs :data:`~bootens_core.repro.experiments.uci.MIN_SPLITS` common
    splits, so with fewer splits there is none. A finer cell the record lacks is a ``ValueError``."""

    def cell_id(r: Mapping[str, Any]) -> tuple[str, int, str]:
        return str(r["dataset"]), int(r["split"]), experiment.method_id(r)

    grid_cells = {cell_id(r): r for r in records}
    fine_cells = {cell_id(r): r for r in finer}
    missing = sorted(set(fine_cells) - set(grid_cells))
    if missing:
        raise ValueError(f"the record holds no cell for {', '.join(f'{d}/{m}/split {s}' for d, s, m in missing)}: "
                         "a finer grid's cell needs its counterpart")
    selected = pd.DataFrame(
        [{"dataset": d, "method": _label(m), "split": s,
          "σ² (grid)": float(grid_cells[(d, s, m)]["noise_var_std_units"]),
          "σ² (finer)": float(fine_cells[(d, s, m)]["noise_var_std_units"]),
          "RMSE (grid)": float(grid_cells[(d, s, m)]["test_rmse"]),
          "RMSE (finer)": float(fine_cells[(d, s, m)]["test_rmse"]),
          "MNLL (grid)": float(grid_cells[(d, s, m)]["test_mnll"]),
          "MNLL (finer)": float(fine_cells[(d, s, m)]["test_mnll"])}
         for d, s, m in sorted(fine_cells)],
        columns=["dataset", "method", "split", "σ² (grid)", "σ² (finer)", "RMSE (grid)", "RMSE (finer)",
                 "MNLL (grid)", "MNLL (finer)"],
    ).set_index(["dataset", "method", "split"])
    splits = {(d, s) for d, s, _ in fine_cells}
    kept = [r for r in records if (str(r["dataset"]), int(r["split"])) in splits]
    swapped = [fine_cells.get(cell_id(r), r) for r in kept]
    ensembles = tuple(sorted({m for _, _, m in fine_cells}))

    def pairs_of(recs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
        c = experiment.comparative_claim(recs, ensembles=ensembles, level=level)
        return {(e, p["dataset"], p["metric"]): p for e, v in c["ensembles"].items() for p in v["pairs"]}

    before, after = pairs_of(kept), pairs_of(swapped)
    rows, moved = [], 0
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)

        def shown(p: Mapping[str, Any] | None) -> str:
            return "—" if p is None else f"{report.sig(p['diff'])} ± {report.sig(p['se'], 2)} (p {p['p']:.3g})"

        def verdict(p: Mapping[str, Any] | None) -> str:
            return "—" if p is None else ("competitive" if p["competitive"] else "significantly worse")

        moves = verdict(b) != verdict(a)
        moved += moves
        e, d, metric = key
        rows.append({"ensemble": _label(e), "dataset": d, "metric": metric.upper(),
                     "splits": (b or a)["n"],
                     "best baseline (grid)": _label(b["baseline"]) if b else "—",
                     "ensemble − best (grid)": shown(b), "grid": verdict(b),
                     "best baseline (finer)": _label(a["baseline"]) if a else "—",
                     "ensemble − best (finer)": shown(a), "finer": verdict(a),
                     "moves": "yes" if moves else "no"})
    cols = ["ensemble", "dataset", "metric", "splits", "best baseline (grid)", "ensemble − best (grid)", "grid",
            "best baseline (finer)", "ensemble − best (finer)", "finer", "moves"]
    pairs = pd.DataFrame(rows, columns=cols).set_index(["ensemble", "dataset", "metric"])
    if not rows:
        text = (f"no pair yet: the finer grid's cells give no dataset {experiment.MIN_SPLITS} splits shared with "
                "a baseline")
    else:
        text = f"the verdict moves on {moved} of {len(rows)} pair{'s' * (len(rows) != 1)} tested on the finer grid's splits"
    return selected, pairs, report.Text(text)


def ranking(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per dataset and metric, the methods from best to worst (:func:`bootens_core.repro.experiments.uci.ranking`):
    on the splits the ranked methods share, each method's mean and its mean rank over those splits (1 = lowest
    error); the methods left out for too few splits, with their numbers of splits."""

    table: dict[tuple[str, str], dict[str, Any]] = {}
    for r in experiment.ranking(records):
        row = table.setdefault((r["dataset"], r["metric"].upper()),
                               {"splits": r["splits"], "order": [], "left_out": r["left_out"]})
        row["order"].append(f"{_label(r['method'])} {report.sig(r['mean'])} (rank {r['mean_rank']:.1f})")
    index = pd.MultiIndex.from_tuples(list(table), names=["dataset", "metric"])
    left = [", ".join(f"{_label(m)} ({n} split{'s' * (n != 1)})" for m, n in v["left_out"].items()) or "—"
            for v in table.values()]
    return pd.DataFrame({"common splits": [v["splits"] for v in table.values()],
                         "best to worst: mean (mean rank)": [" · ".join(v["order"]) for v in table.values()],
                         "left out (too few splits)": left},
                        index=index)


def claim(records: Sequence[Mapping[str, Any]], level: float = 0.05) -> tuple[report.Verdict, pd.DataFrame]:
    """The paper's comparative claim (bootstrap ensembles are competitive with MC dropout, SGHMC and the GP)
    judged by the rule of :func:`bootens_core.repro.experiments.uci.comparative_claim`, fixed before the records
    were looked at: on each dataset × metric, the ensemble is *competitive* unless a paired t-test at
    ``level`` finds it significantly worse than the best baseline on the common splits; the claim holds for
    an ensemble competitive on more than half of its pairs. Returns the verdict (``supported``, ``partly
    supported``, ``not supported`` or ``not tested``; evidence per ensemble; margin in noise units) and the
    table of pairs."""

    c = experiment.comparative_claim(records, level=level)
    rows, evidence = [], []
    for e, v in c["ensembles"].items():
        worse = [p for p in v["pairs"] if not p["competitive"]]
        evidence.append(
            f"{_label(e)}: competitive on {v['competitive']} of {len(v['pairs'])} dataset × metric pairs "
            f"(needs {v['needed']})" + ("; significantly worse on " + ", ".join(
                f"{p['dataset']} {p['metric'].upper()} than {_label(p['baseline'])} ({report.sig(p['diff'])} ± "
                f"{report.sig(p['se'], 2)}, p {p['p']:.3g})" for p in worse) if worse else ""))
        for p in v["pairs"]:
            rows.append({"ensemble": _label(e), "dataset": p["dataset"], "metric": p["metric"].upper(),
                         "best baseline": _label(p["baseline"]), "splits": p["n"],
                         "ensemble − best": f"{report.sig(p['diff'])} ± {report.sig(p['se'], 2)}", "p": f"{p['p']:.3g}",
                         "competitive": "yes" if p["competitive"] else "no (significantly worse)"})
    text = {"supported": "supported: the ensembles are competitive on most dataset × metric pairs",
            "partly supported": "partly supported: one ensemble is competitive on most pairs, the other not",
            "not supported": "NOT supported: significantly worse than the best baseline on half of the pairs "
                             "or more",
            "not tested": "not tested: no ensemble and baseline share splits"}[c["verdict"]]
    cols = ["ensemble", "dataset", "metric", "best baseline", "splits", "ensemble − best", "p", "competitive"]
    table = pd.DataFrame(rows, columns=cols).set_index(["ensemble", "dataset", "metric"])
    return report.Verdict(text, "; ".join(evidence) or "no pair", c["margin"]), table


_PM_NAME = {"SE": "SE", "SD": "SD", "unstated": "± not stated"}


def published(*ours: dict[str, Any]) -> pd.DataFrame:
    """Published results of other papers on the same standard UCI splits (not ours, not the paper's:
    :func:`bootens_core.repro.experiments.uci.published_reference`): one row per dataset and source (a published
    method, or one of ours), columns ``RMSE`` and ``MNLL`` (a published test log-likelihood is shown negated,
    its ± unchanged). Each published entry carries its ± convention (``SE``, ``SD`` or ``± not stated``). With
    ``ours`` (summaries, e.g. of the paper-scale records), our methods' mean ± SE (splits) follow each dataset's
    published rows, labelled ``ours:``; a method of ours with no cell in any summary has no rows."""

    pub = experiment.published_reference()
    datasets = list(dict.fromkeys(r["dataset"] for r in pub))
    got = {(r["dataset"], r["label"], r["metric"].upper()): r for r in pub}
    sources = [(label, None) for label in dict.fromkeys(r["label"] for r in pub)]
    mine: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    if ours:
        mine = {(r["dataset"], r["metric"].upper(), r["method"], int(r["hidden_layers"])): r
                for s in ours for r in s["rows"] if r["metric"] in ("rmse", "mnll")}
        sources += [(f"ours: {_LABELS[(meth, layers)]}", (meth, layers))
                    for meth, layers in (*TABLES23, ("plain", 1), ("plain", 4), ("deep", 1))
                    if any(k[2:] == (meth, layers) for k in mine)]

    def entry(d: str, label: str, method: tuple[str, int] | None, metric: str) -> str:
        if method is None:
            r = got.get((d, label, metric))
            return f"{r['mean']:.2f} ± {r['pm']:.2f} ({_PM_NAME[r['pm_convention']]})" if r else "—"
        r = mine.get((d, metric, *method))
        if r is None:
            return "not run"
        return f"{report.sig(r['mean'])} ± {report.sig(r['se'], 2)} ({r['n_splits']})" if np.isfinite(r.get("se", np.nan)) else _ours(r)

    index = pd.MultiIndex.from_tuples([(d, label) for d in datasets for label, _ in sources], names=["dataset", "source"])
    return pd.DataFrame(
        {metric: [entry(d, label, method, metric) for d in datasets for label, method in sources]
         for metric in ("RMSE", "MNLL")},
        index=index,
    )


def gaussian_mnll(rmse: Any) -> Any:
    """The mean negative log-likelihood that a Gaussian predictive centred on the predictions, with one
    variance for every point set to the squared RMSE (the variance that minimises that MNLL), scores:
    ``0.5 * log(2 * pi * e * rmse**2)``. An MNLL above it means the predictive variances cost more than one
    well-chosen constant variance would; below it, that they follow the errors."""
    r = np.asarray(rmse, dtype=float)
    if np.any(~(r > 0)):
        raise ValueError(f"gaussian_mnll needs positive RMSEs, got {rmse!r}")
    out = 0.5 * np.log(2 * np.pi * np.e * r**2)
    return float(out) if out.ndim == 0 else out


def _excess(mnll: float, mnll_se: float, rmse: float, rmse_se: float) -> tuple[float, float]:
    # SE of mean MNLL - gaussian_mnll(mean RMSE), the two means' errors taken as independent (MNLL and log RMSE
    # rise together over splits, so this overstates the SE: the conservative side).
    return mnll - gaussian_mnll(rmse), float(np.hypot(mnll_se, rmse_se / rmse))


def _tally(t: list[int], excess: float, se: float) -> None:
    t[0] += excess > 2 * se
    t[1] += excess < -2 * se
    t[2] += 1


def mnll_excess(records: Sequence[Mapping[str, Any]] = ()) -> tuple[pd.DataFrame, report.Text]:
    """The MNLL of each UCI column above the Gaussian level of its own RMSE (:func:`gaussian_mnll` at the mean
    RMSE over splits), the paper's (from its published means; "—" where its RMSE rounds to 0) and, for the
    cells in ``records`` (per-split records, e.g. of the paper-scale records), ours, computed the same way.

    Per split, a Gaussian with the split's squared RMSE as its variance scores ``gaussian_mnll`` of that RMSE,
    and the mean of those over splits is at most the level at the mean RMSE (the log is concave), so an excess
    clearly above 0 says the predictive variances are worse, on average, than one constant variance per split.
    The ± is an SE: the published SD over splits over the root of the paper's number of splits (an SD printed
    as 0.00 taken as 0.005), ours the SD over splits over the root of their number, combined as if
    independent (conservative). The paper's RMSEs are rounded to 0.01; the rounding moves its excess by at
    most ``0.005 / rmse`` nats, included in its ± when larger than the SE.

    Returns the table (one row per dataset and method column, columns ``paper: RMSE, MNLL``, ``paper: excess``
    and ``ours: excess``) and a sentence counting, per method column, the datasets whose excess lies more than
    two SEs above 0, and more than two below, in the paper and in ours (a description, not a test of a claim).
    """
    from ....data.uci import PAPER_SPLITS

    ref = experiment.paper_reference()
    by_cell: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for r in records:
        by_cell.setdefault((r["dataset"], r["method"], int(r["hidden_layers"])), []).append(r)
    datasets = list(dict.fromkeys(d for d, *_ in ref))
    rows, index = [], []
    count: dict[tuple[str, int], dict[str, list[int]]] = {}  # [above, below, compared]
    for d in datasets:
        for meth, layers in TABLES23:
            p_rmse, p_mnll = ref.get((d, meth, layers, "rmse")), ref.get((d, meth, layers, "mnll"))
            if p_rmse is None or p_mnll is None:
                continue
            n_p = PAPER_SPLITS[d]
            tally = count.setdefault((meth, layers), {"paper": [0, 0, 0], "ours": [0, 0, 0]})
            paper_pair = f"{p_rmse[0]:.2f}, {p_mnll[0]:.2f}"
            if p_rmse[0] > 0.005:
                e, se = _excess(p_mnll[0], max(p_mnll[1], 0.005) / np.sqrt(n_p), p_rmse[0],
                                max(p_rmse[1], 0.005) / np.sqrt(n_p))
                se = max(se, 0.005 / (p_rmse[0] - 0.005))
                paper_e = f"{report.sig(e, 2)} ± {report.sig(se, 2)}"
                _tally(tally["paper"], e, se)
            else:
                paper_e = "— (RMSE rounds to 0)"
            cell = by_cell.get((d, meth, layers), [])
            rm = np.array([float(r["test_rmse"]) for r in cell])
            nl = np.array([float(r["test_mnll"]) for r in cell])
            if len(cell) >= 2 and np.all(np.isfinite(rm)) and np.all(np.isfinite(nl)) and np.all(rm > 0):
                k = len(cell)
                e, se = _excess(nl.mean(), nl.std(ddof=1) / np.sqrt(k), rm.mean(), rm.std(ddof=1) / np.sqrt(k))
                ours_e = f"{report.sig(e, 2)} ± {report.sig(se, 2)} ({k})"
                _tally(tally["ours"], e, se)
            elif not cell:
                ours_e = "not run"
            else:
                ours_e = "— (1 split)" if len(cell) == 1 else f"— (not finite on a split of {len(cell)})"
            index.append((d, _LABELS[(meth, layers)]))
            rows.append({"paper: RMSE, MNLL": paper_pair, "paper: excess": paper_e, "ours: excess": ours_e})

    def said(t: list[int]) -> str:
        return f"{t[0]} above, {t[1]} below of {t[2]}" if t[2] else "not run"

    text = report.Text("datasets whose MNLL lies more than two SEs above or below the Gaussian level of its RMSE — "
                + "; ".join(f"{_LABELS[m]}: paper {said(t['paper'])}, ours {said(t['ours'])}"
                            for m, t in count.items()))
    table = pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index, names=["dataset", "method"]))
    return table, text


def published_sources() -> pd.DataFrame:
    """Where each published column of :func:`published` was read: citation, address, what its ± is (SE,
    SD or not stated), the number of splits and the conversion applied to its numbers."""

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in experiment.published_reference():
        groups.setdefault(r["label"], []).append(r)
    out = []
    for label, rs in groups.items():
        splits = {r["dataset"]: r["n_splits"] for r in rs}
        usual = sorted({n for d, n in splits.items() if d != "protein"})
        text = ", ".join(map(str, usual)) + (f" (Protein {splits['protein']})" if "protein" in splits else "")
        conv = sorted({r["conversion"] for r in rs} - {"none"})
        out.append({"published column": label, "source": rs[0]["citation"], "address": rs[0]["url"],
                    "±": {"SE": "SE", "SD": "SD", "unstated": "not stated"}[rs[0]["pm_convention"]],
                    "splits": text, "conversion": "; ".join(conv) or "none"})
    return pd.DataFrame(out).set_index("published column")


# The nominal levels of the calibration table: the harness's and the tables' 95%.
LEVELS = (*harness.CALIBRATION_LEVELS, 0.95)


def calibration(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Calibration of every method's test predictive, per dataset (cells with the calibration fields only):
    the coverage of the central interval at each nominal level of :data:`LEVELS` (mean over splits; a
    calibrated predictive covers the level's share, overconfident ones less), the CRPS (mean ± SE over
    splits, label units, lower is better) and the PIT histogram pooled over the splits tested for uniformity
    (Pearson's chi-square, ``p``; a small p: the PIT values are not uniform)."""
    from scipy.stats import chisquare

    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("pit_counts") in (None, "", []):
            continue
        groups.setdefault((str(r["dataset"]), experiment.method_id(r)), []).append(r)
    rows = []
    order = {m: i for i, m in enumerate(("ensemble-1", "ensemble-4", "mcd-1", "mcd-4", "sghmc-1", "gp",
                                         *experiment.PRACTICE_IDS))}
    for (ds, mid), recs in sorted(groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99))):
        crps = np.asarray([float(r["test_crps"]) for r in recs])
        pooled = np.sum([np.asarray(r["pit_counts"], int) for r in recs], axis=0)
        row: dict[str, Any] = {"dataset": ds, "method": _label(mid), "splits": len(recs)}
        for lv in LEVELS:
            col = f"coverage{round(100 * lv)}"
            row[f"{round(100 * lv)}%"] = f"{np.mean([float(r[col]) for r in recs]):.2f}"
        se = np.std(crps, ddof=1) / np.sqrt(crps.size) if crps.size > 1 else float("nan")
        row["CRPS"] = f"{report.sig(float(np.mean(crps)))} ± {report.sig(float(se), 2)}" if np.isfinite(se) \
            else report.sig(float(np.mean(crps)))
        row["PIT uniform, p"] = f"{chisquare(pooled).pvalue:.2g}"
        rows.append(row)
    cols = ["dataset", "method", "splits", *(f"{round(100 * lv)}%" for lv in LEVELS), "CRPS", "PIT uniform, p"]
    return pd.DataFrame(rows, columns=cols).set_index(["dataset", "method"])


def deep_lr(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The deep-ensemble learning-rate check (:func:`bootens_core.repro.experiments.uci.deep_lr_check`): per
    Adam learning rate and dataset, the test RMSE and MNLL (mean ± SE over the splits), the worst split's RMSE
    and how many networks diverged."""
    groups: dict[tuple[float, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((float(r["lr"]), str(r["dataset"])), []).append(r)
    out = []
    for (lr, ds), recs in groups.items():
        entry: dict[str, Any] = {"Adam learning rate": f"{lr:g}", "dataset": ds, "splits": len(recs)}
        for metric, col in (("RMSE", "test_rmse"), ("MNLL", "test_mnll")):
            v = np.asarray([float(r[col]) for r in recs])
            se = np.std(v, ddof=1) / np.sqrt(v.size) if v.size > 1 else float("nan")
            entry[metric] = report.pm(float(np.mean(v)), float(se)) if np.isfinite(se) else report.sig(np.mean(v))
        entry["worst split RMSE"] = report.sig(max(float(r["test_rmse"]) for r in recs))
        entry["networks diverged"] = int(sum(int(r["diverged_particles"]) for r in recs))
        out.append(entry)
    return pd.DataFrame(out).set_index(["Adam learning rate", "dataset"])
