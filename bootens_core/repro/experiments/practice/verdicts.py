"""The guidance chapter's rules and tables: calibration, the comparisons with the plain ensemble and the
unscaled prior, and the guidance in one table."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ... import report
from ...store import summary_dict
from .experiment import METHODS, Summary

__all__ = ["calibration", "stopping", "comparison_table", "guidance_table", "LEVEL"]

LEVEL = 0.05  # every test's level; the coverage test shares it over the nominal levels (Bonferroni)


def calibration(s: Summary | dict[str, Any]) -> report.Verdict:
    """Calibrated when no nominal level's coverage differs from the level by the t-test over splits (mean of
    coverage minus level over its standard error corrected for splits that share rows, ``n_splits - 1``
    degrees of freedom, two-sided, level 0.05 shared over the levels); otherwise overconfident (coverage
    below) or underconfident (above) at the levels that differ."""
    s = summary_dict(s)
    t = np.asarray(s["coverage_t"], float)
    df = s["n_splits"] - 1
    crit = float(stats.t.isf(LEVEL / (2 * t.size), df))
    levels = np.asarray(s["levels"])
    low, high = levels[t < -crit], levels[t > crit]
    margin = float(np.min(np.abs(np.abs(t) - crit)))
    evidence = (f"coverage {', '.join(f'{c:.3f}' for c in s['coverage'])} at levels "
                f"{', '.join(f'{v:g}' for v in levels)}; t {', '.join(f'{v:.2f}' for v in t)} "
                f"(limit ±{crit:.2f})")
    if low.size == 0 and high.size == 0:
        return report.Verdict("calibrated at every level", evidence, margin)
    parts = []
    if low.size:
        parts.append(f"overconfident at {len(low)} of {levels.size} levels")
    if high.size:
        parts.append(f"underconfident at {len(high)} of {levels.size} levels")
    return report.Verdict("; ".join(parts), evidence, margin)


def stopping(s: Summary | dict[str, Any]) -> report.Verdict:
    """Whether fewer steps predict as well: the first of the recorded step counts whose test MNLL is shown
    within the margin of the last one's (:func:`~bootens_core.repro.experiments.practice.experiment
    .first_within`), named against the full run."""
    s = summary_dict(s)
    first, last = s["stop_step"], s["stop_steps"][-1]
    evidence = f"test MNLL by step {dict(zip(s['stop_steps'], (round(v, 4) for v in s['mnll_by_step'])))}"
    if first < last:
        return report.Verdict(f"as good after {first} steps as after {last}", evidence)
    return report.Verdict(f"no fewer steps shown as good as all {last}", evidence)


def comparison_table(s: Summary | dict[str, Any]) -> pd.DataFrame:
    """Each method's mean test RMSE, MNLL, 90% coverage, CRPS and fit seconds, with the paired difference
    from the bootstrap ensemble (other minus bootstrap, its standard error and the corrected resampled
    t-test's p; the verdict says lower or higher, which is better depending on the metric)."""
    s = summary_dict(s)
    rows = []
    for name in [m for m in METHODS if m in s["means"]]:  # a record made before deep ensembles joined lacks them
        for metric, mean in s["means"][name].items():
            row = {"method": name, "metric": metric, "mean": mean}
            if name != METHODS[0]:
                c = s["compare"][name][metric]
                row.update({"minus bootstrap": c["diff"], "se": c["se"], "p": c["p"],
                            "corrected paired t-test": c["verdict"]})
            rows.append(row)
    return pd.DataFrame(rows).set_index(["metric", "method"]).sort_index(level=0, sort_remaining=False)


def guidance_table(s: Summary | dict[str, Any]) -> pd.DataFrame:
    """The measured guidance, one row per question."""
    s = summary_dict(s)
    sel = np.asarray(s["selected_noise_var"])
    values, unique = np.unique(sel, return_counts=True)
    rows = [
        ("particles", f"{s['k_enough']} of {s['ks'][-1]}",
         f"fewest whose test MNLL is within {s['mnll_margin']:g} of all particles' (corrected 95% bound)"),
        ("noise variance", ", ".join(f"{v:g} ({c}x)" for v, c in zip(values, unique, strict=True)),
         "selected on held-out MNLL (fraction of the labels' variance), per split"),
        ("steps", f"{s['stop_step']} of {s['stop_steps'][-1]}",
         f"first whose test MNLL is within {s['mnll_margin']:g} of the last step's (corrected 95% bound)"),
        ("stuck particles", f"{s['stuck']} of {s['particles_total']}",
         "final objective over 5 robust sd above its ensemble's median"),
        ("calibration", str(calibration(s)),
         "coverage at 50-95% against the nominal level, corrected t-test over splits"),
    ]
    return pd.DataFrame(rows, columns=["question", "measured", "rule"]).set_index("question")
