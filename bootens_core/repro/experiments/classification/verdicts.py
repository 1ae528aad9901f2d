"""The classification chapter's verdicts and tables: agreement with NUTS, paired comparisons of methods."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ... import report
from ...store import summary_dict
from .experiment import METHOD_LABELS, Summary

__all__ = ["evaluate", "agreement", "table", "paired", "paired_all", "buys"]


_METRICS = ("accuracy", "mnll", "ece")


def _dataset_label(name: str) -> str:
    """A dataset's name as a reader reads it (``breast_cancer`` -> ``breast cancer``)."""
    return name.replace("_", " ")


def evaluate(s: Summary | dict[str, Any]) -> dict[str, report.Verdict]:
    """Verdicts of the classification chapter.

    ``reference``: NUTS is converged when the R-hat of p(y = 1 | x) is below 1.1 everywhere on the grid.
    ``agreement``: the paper's "fairly accurate approximation of the MCMC result", read with the deep-ReLU
    chapter's rule: the ensemble's 95% band covers at least 80% of the reference band, averaged over x.
    No noise scale is known for these single-run statistics: margins are ``None``.
    """
    s = summary_dict(s)
    ref = "converged" if s["rhat_max"] < 1.1 else "NOT converged (max R-hat above 1.1)"
    ok = s["band_coverage_vs_mcmc"] >= 0.8
    return {"reference": report.Verdict(ref, f"largest R-hat of p(y = 1 | x) {s['rhat_max']:.4f} (limit 1.1)"),
            "agreement": report.Verdict("reproduced" if ok else "NOT reproduced",
                                        f"share of the reference band covered {s['band_coverage_vs_mcmc']:.3f} "
                                        "(limit 0.8)")}


def agreement(s: Summary | dict[str, Any]) -> pd.DataFrame:
    """Agreement with NUTS on the grid: the bootstrap and plain ensembles at the paper's alpha_eps, the
    alpha_eps study, and NUTS against itself (half of its chains vs the other half: the noise floor)."""
    s = summary_dict(s)
    rows = [
        (f"Bootstrap ensemble, α_ε = {s['alpha_eps']:g} (paper)", s["prob_mad_vs_mcmc"], s["band_mad_vs_mcmc"],
         s["band_coverage_vs_mcmc"]),
        (f"Plain ensemble, α_ε = {s['alpha_eps']:g}", s["plain_prob_mad_vs_mcmc"], s["plain_band_mad_vs_mcmc"],
         s["plain_band_coverage_vs_mcmc"]),
    ]
    for a, v in s.get("alpha_eps_study", {}).items():
        if float(a) != float(s["alpha_eps"]):
            rows.append((f"Bootstrap ensemble, α_ε = {a}", v["prob_mad"], v["band_mad"], v["band_coverage"]))
    rows.append(("NUTS vs NUTS (half the chains each)", s["reference_split_prob_mad"], s["reference_split_band_mad"],
                 float("nan")))
    df = pd.DataFrame(rows, columns=["distribution of classifiers", "mean |Δ mean p|", "mean |Δ band edge|",
                                     "share of NUTS band covered"])
    return df.set_index("distribution of classifiers").round(3)


def table(s: Summary | dict[str, Any]) -> pd.DataFrame:
    """Real datasets: accuracy, MNLL and ECE per method, mean ± std over splits."""
    s = summary_dict(s)
    rows = []
    for ds, entry in s["real"].items():
        for m, label in METHOD_LABELS.items():
            e = entry[m]
            rows.append({
                "dataset": f"{_dataset_label(ds)} ({entry['n_splits']} splits)",
                "method": label,
                "accuracy": f"{e['accuracy']:.3f} ± {e['accuracy_std']:.3f}",
                "MNLL": f"{e['mnll']:.3f} ± {e['mnll_std']:.3f}",
                "ECE": f"{e['ece']:.3f} ± {e['ece_std']:.3f}",
            })
    return pd.DataFrame(rows).set_index(["dataset", "method"])


def paired(result: Any, other: str = "plain", level: float = 0.95) -> pd.DataFrame:
    """What the bootstrap buys: per dataset and metric, the mean over splits of (bootstrap − ``other``), its
    standard error over splits (paired: same split, same test rows), and the verdict of a two-sided paired
    t-test at ``level``: "better"/"worse" (lower MNLL/ECE, higher accuracy is better) when the mean difference
    exceeds the t quantile times the standard error, else "no clear difference"."""

    rows = []
    for ds in result.summary["real"]:
        b, o = result[f"{ds}_bootstrap_metrics"], result[f"{ds}_{other}_metrics"]
        for j, metric in enumerate(_METRICS):
            d = b[:, j] - o[:, j]
            n = d.size
            se = d.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
            bound = stats.t.ppf(0.5 + level / 2, n - 1) * se if n > 1 else float("nan")
            sign = 1.0 if metric == "accuracy" else -1.0
            if np.isfinite(bound) and abs(d.mean()) > bound:
                verdict = "better" if sign * d.mean() > 0 else "worse"
            else:
                verdict = "no clear difference"
            name = METHOD_LABELS[other]
            rows.append({"dataset": _dataset_label(ds), "metric": metric.upper() if metric != "accuracy" else metric,
                         f"bootstrap − {name if name.startswith('MC') else name.lower()}": round(float(d.mean()), 4),
                         "std. error": round(float(se), 4), "splits": int(n), "bootstrap is": verdict})
    return pd.DataFrame(rows).set_index(["dataset", "metric"])


def paired_all(result: Any, others: tuple[str, ...] = ("plain", "mcd", "deep"), level: float = 0.95) -> pd.DataFrame:
    """:func:`paired` against each of ``others``, one block of rows each (index: against whom, dataset,
    metric), the difference in one column ``bootstrap − other``: a table as narrow as one comparison."""
    blocks = {}
    for other in others:
        df = paired(result, other, level)
        blocks[METHOD_LABELS[other]] = df.rename(columns={df.columns[0]: "bootstrap − other"})
    return pd.concat(blocks, names=["against"])


def buys(result: Any, other: str = "plain") -> report.Text:
    """One sentence per dataset: the metrics where the bootstrap is significantly better or worse than
    ``other`` (:func:`paired`), or that no difference is significant."""
    df = paired(result, other)
    parts = []
    for ds in result.summary["real"]:
        sub = df.loc[_dataset_label(ds)]
        n = int(sub["splits"].iloc[0])
        col = next(c for c in sub.columns if c.startswith("bootstrap − "))
        found = [f"{'better' if v == 'better' else 'worse'} {m} ({sub.loc[m, col]:+.3f} ± {sub.loc[m, 'std. error']:.3f})"
                 for m, v in sub["bootstrap is"].items() if v != "no clear difference"]
        parts.append(f"{_dataset_label(ds)} ({n} splits): " + ("; ".join(found) if found else "no significant difference"))
    return report.Text(". ".join(parts) + ".")
