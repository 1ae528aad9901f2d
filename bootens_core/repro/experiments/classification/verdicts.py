"""The classification chapter's verdicts and tables: agreement with NUTS, paired comparisons of methods."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ... import noise, report
from ...store import summary_dict
from .experiment import METHOD_LABELS, Summary

__all__ = ["T_LIMIT", "RHAT_LIMIT", "ESS_MIN", "NOT_ASSESSED", "LEVEL", "evaluate", "noise_units", "rule_size", "agrees",
           "agreement",
           "table", "holm", "paired", "paired_all", "buys"]


_METRICS = ("accuracy", "mnll", "ece")

# The agreement rule, the deep-ReLU chapter's in form, units and limits: a statistic agrees with the reference
# when it is within T_LIMIT noise units (noise_units: a sample of the ensemble's size from the reference against
# the rest of it, or for a short reference its half-vs-half noise); the reference counts as converged
# when its largest R-hat of p(y = 1 | x) is below RHAT_LIMIT and its smallest bulk ESS at least ESS_MIN.
T_LIMIT = 2.0
RHAT_LIMIT = 1.1
ESS_MIN = 100.0
NOT_ASSESSED = "not assessed: the reference has not converged"

# Level of the paired tests of the real datasets: family-wise over all of them (Holm).
LEVEL = 0.05


def _dataset_label(name: str) -> str:
    """A dataset's name as a reader reads it (``breast_cancer`` -> ``breast cancer``)."""
    return name.replace("_", " ")


def noise_units(s: Summary | dict[str, Any]) -> tuple[float, float, str]:
    """The rule's units for the mean gap and ``|log width_ratio|``, and what they are: the noise of a sample of
    the bootstrap ensemble's size drawn from NUTS against the rest of its draws (``sample_noise_*``) when the
    run has it, else NUTS's half-vs-half noise (``reference_noise_*``), as the deep-ReLU chapter's rule
    (``deep_relu.verdicts.noise_units``)."""
    s = summary_dict(s)
    if s.get("sample_noise_prob_mad") is not None:
        return (s["sample_noise_prob_mad"], s["sample_noise_log_width"],
                f"{s['sample_noise_n']} NUTS draws against the rest, {s['sample_noise_repeats']} subsets")
    parts = s.get("reference_noise_partitions")
    return (s["reference_noise_prob_mad"], s["reference_noise_log_width"],
            "half of NUTS's chains against the other half" + (f", {parts} splits" if parts is not None else ""))


def rule_size(p_chains: Any, n: int, repeats: int = 256, seed: int = 1) -> dict[str, float]:
    """How often the rule says "differs" of a sample of ``n`` classifiers from the posterior: ``repeats``
    subsets of ``n`` of NUTS's draws ``p_chains`` ``(chains, draws, n_x)``, each against the rest, judged in the
    units of :func:`.experiment.sample_noise` at its default subsets. Returns the share of subsets failing each
    limit (``prob_mad``, ``log_width``) and either (``either``), and ``repeats``."""
    from .experiment import rule_statistics

    p = np.asarray(p_chains, np.float64)
    size = noise.rule_size(p.reshape(-1, p.shape[-1]), n, rule_statistics, T_LIMIT, repeats, seed)
    return {"prob_mad": size["first"], "log_width": size["second"], "either": size["either"],
            "repeats": size["repeats"]}


def agrees(prob_mad: float, width_ratio: float, s: Summary | dict[str, Any]
           ) -> tuple[bool, float | None, str]:
    """Two-sided agreement of one distribution of classifiers with the NUTS reference: (agrees, margin,
    evidence). The mean gap ``prob_mad`` (mean over x of |Δ mean p|) must be at most ``T_LIMIT`` times the
    unit's mean gap (:func:`noise_units`), and ``|log width_ratio|`` (the median band-width ratio: too wide and
    too narrow alike) at most ``T_LIMIT`` times the unit's root mean square of that log. Margins are in those
    noise units."""
    um, uw, _ = noise_units(s)
    lw = abs(float(np.log(width_ratio))) if width_ratio > 0 else float("inf")
    ok, margin = report.all_pass([(prob_mad <= T_LIMIT * um, report.distance(prob_mad, T_LIMIT * um, um)),
                                  (lw <= T_LIMIT * uw, report.distance(lw, T_LIMIT * uw, uw))])
    ev = (f"mean gap |Δ mean p| {prob_mad:.3g} against {T_LIMIT:g} × {um:.3g}; |log band-width ratio| {lw:.3g} "
          f"(ratio {width_ratio:.3g}) against {T_LIMIT:g} × {uw:.3g}")
    return ok, margin, ev


def evaluate(s: Summary | dict[str, Any]) -> dict[str, report.Verdict]:
    """Verdicts of the classification chapter.

    ``reference``: NUTS is converged when the R-hat of p(y = 1 | x) is below ``RHAT_LIMIT`` (1.1) everywhere on
    the grid and its bulk ESS at least ``ESS_MIN`` (100) everywhere. ``agreement``: the paper's "fairly
    accurate approximation of the MCMC result", judged two-sided
    against the reference's own noise (:func:`agrees`: the mean gap and the band-width ratio of the bootstrap
    ensemble at the paper's alpha_eps, each within ``T_LIMIT`` (2) of :func:`noise_units`; a band too wide
    fails as a band too narrow does). With a reference that is not converged no agreement is assessed (the
    evidence says what the rule alone gives).
    """
    s = summary_dict(s)
    failed = ([f"R-hat above {RHAT_LIMIT:g}"] if not s["rhat_max"] < RHAT_LIMIT else []) + (
        [f"bulk ESS below {ESS_MIN:g}"] if not s["ess_bulk_min"] >= ESS_MIN else [])
    converged = not failed
    ref = "converged" if converged else f"NOT converged ({', '.join(failed)})"
    out = {"reference": report.Verdict(ref, f"largest R-hat of p(y = 1 | x) {s['rhat_max']:.4f} (limit "
                                            f"{RHAT_LIMIT:g}); smallest bulk ESS {s['ess_bulk_min']:.0f} "
                                            f"(at least {ESS_MIN:g})")}
    ok, margin, ev = agrees(s["prob_mad_vs_mcmc"], s["width_ratio_vs_mcmc"], s)
    if converged:
        out["agreement"] = report.Verdict("reproduced" if ok else "NOT reproduced", ev, margin)
    else:
        out["agreement"] = report.Verdict(NOT_ASSESSED,
                                          f"the rule alone: {'agrees' if ok else 'differs'} ({ev})")
    return out


def agreement(s: Summary | dict[str, Any]) -> pd.DataFrame:
    """Agreement with NUTS on the grid: the bootstrap and plain ensembles at the paper's alpha_eps, the
    alpha_eps study, and NUTS against itself (half of its chains vs the other half). Per row the two statistics
    of the rule (:func:`agrees`), each also in the rule's noise units (:func:`noise_units`), what the rule says,
    and the mean |difference| of the band edges as a descriptive figure."""
    s = summary_dict(s)
    um, uw, _ = noise_units(s)
    rows = [
        (f"Bootstrap ensemble, α_ε = {s['alpha_eps']:g} (paper)", s["prob_mad_vs_mcmc"], s["width_ratio_vs_mcmc"],
         s["band_mad_vs_mcmc"]),
        (f"Plain ensemble, α_ε = {s['alpha_eps']:g}", s["plain_prob_mad_vs_mcmc"], s["plain_width_ratio_vs_mcmc"],
         s["plain_band_mad_vs_mcmc"]),
    ]
    for a, v in s.get("alpha_eps_study", {}).items():
        if float(a) != float(s["alpha_eps"]):
            rows.append((f"Bootstrap ensemble, α_ε = {a}", v["prob_mad"], v["width_ratio"], v["band_mad"]))
    rows.append(("NUTS vs NUTS (half the chains each)", s["reference_split_prob_mad"],
                 s["reference_split_width_ratio"], s["reference_split_band_mad"]))
    out = []
    for label, mad, ratio, band in rows:
        ok, _, _ = agrees(mad, ratio, s)
        out.append({"distribution of classifiers": label, "mean gap |Δ mean p|": mad,
                    "gap in noise units": mad / um, "median band-width ratio": ratio,
                    "|log ratio| in noise units": abs(np.log(ratio)) / uw if ratio > 0 else float("inf"),
                    "rule": "agrees" if ok else "differs", "mean |Δ band edge|": band})
    return pd.DataFrame(out).set_index("distribution of classifiers")


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


def holm(pvalues: Sequence[float], level: float = LEVEL) -> list[bool]:
    """Holm's step-down rejections at family-wise ``level`` (:func:`bootens_core.repro.report.holm`)."""
    return report.holm(pvalues, level)


def _paired_rows(result: Any, other: str) -> list[dict[str, Any]]:
    """Per dataset and metric, the paired differences bootstrap − ``other`` over splits: mean, standard error,
    splits and the two-sided p-value of the paired t-test (1 when every difference is zero; NaN with one
    split)."""
    rows = []
    for ds in result.summary["real"]:
        b, o = result[f"{ds}_bootstrap_metrics"], result[f"{ds}_{other}_metrics"]
        for j, metric in enumerate(_METRICS):
            d = b[:, j] - o[:, j]
            n = d.size
            se = float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
            if n < 2:
                p = float("nan")
            elif se > 0:
                p = float(2 * stats.t.sf(abs(d.mean()) / se, n - 1))
            else:
                p = 1.0 if d.mean() == 0 else 0.0
            rows.append({"dataset": _dataset_label(ds), "metric": metric.upper() if metric != "accuracy" else metric,
                         "_metric": metric, "mean": float(d.mean()), "se": se, "splits": int(n), "p": p})
    return rows


def _verdict(row: dict[str, Any], rejected: bool) -> str:
    if not rejected:
        return "no clear difference"
    sign = 1.0 if row["_metric"] == "accuracy" else -1.0
    return "better" if sign * row["mean"] > 0 else "worse"


def _frame(rows: list[dict[str, Any]], rejected: list[bool], diff_col: str) -> pd.DataFrame:
    return pd.DataFrame([{"dataset": r["dataset"], "metric": r["metric"], diff_col: round(r["mean"], 4),
                          "std. error": round(r["se"], 4), "splits": r["splits"], "p": r["p"],
                          "bootstrap is": _verdict(r, rej)}
                         for r, rej in zip(rows, rejected, strict=True)]).set_index(["dataset", "metric"])


def _name(other: str) -> str:
    name = METHOD_LABELS[other]
    return name if name.startswith("MC") else name.lower()


def paired(result: Any, other: str = "plain", level: float = LEVEL) -> pd.DataFrame:
    """What the bootstrap buys against one method: per dataset and metric, the mean over splits of
    (bootstrap − ``other``), its standard error over splits (paired: same split, same test rows), the two-sided
    p-value of the paired t-test, and the verdict at ``level`` with Holm's correction over this table's tests:
    "better"/"worse" (lower MNLL/ECE, higher accuracy is better) where the test rejects, else "no clear
    difference". The chapter's table is :func:`paired_all`, whose correction runs over all three opponents."""
    rows = _paired_rows(result, other)
    return _frame(rows, holm([r["p"] for r in rows], level), f"bootstrap − {_name(other)}")


def paired_all(result: Any, others: tuple[str, ...] = ("plain", "mcd", "deep"), level: float = LEVEL
               ) -> pd.DataFrame:
    """The paired comparisons against each of ``others``, one block of rows each (index: against whom,
    dataset, metric), the difference in one column ``bootstrap − other``. The verdicts are at family-wise
    ``level`` (5%) with Holm's correction over every test of the table (opponents × datasets × metrics)."""
    rows = {other: _paired_rows(result, other) for other in others}
    flat = [r for other in others for r in rows[other]]
    rejected = holm([r["p"] for r in flat], level)
    blocks, at = {}, 0
    for other in others:
        n = len(rows[other])
        blocks[METHOD_LABELS[other]] = _frame(rows[other], rejected[at:at + n], "bootstrap − other")
        at += n
    return pd.concat(blocks, names=["against"])


def buys(result: Any, other: str = "plain", others: tuple[str, ...] = ("plain", "mcd", "deep")
         ) -> report.Text:
    """One sentence per dataset: the metrics where the bootstrap is significantly better or worse than
    ``other`` in :func:`paired_all` over ``others`` (family-wise 5%, Holm), or that no difference is
    significant."""
    df = paired_all(result, others).loc[METHOD_LABELS[other]]
    parts = []
    for ds in result.summary["real"]:
        sub = df.loc[_dataset_label(ds)]
        n = int(sub["splits"].iloc[0])
        found = [f"{v} {m} ({sub.loc[m, 'bootstrap − other']:+.3f} ± {sub.loc[m, 'std. error']:.3f})"
                 for m, v in sub["bootstrap is"].items() if v != "no clear difference"]
        parts.append(f"{_dataset_label(ds)} ({n} splits): " + ("; ".join(found) if found else "no significant difference"))
    return report.Text(". ".join(parts) + ".")
