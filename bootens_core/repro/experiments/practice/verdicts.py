"""The guidance chapter's rules and tables: the curves behind the guidance with their uncertainty, calibration
and the smallest coverage error its test detects, the comparisons with the plain ensemble and the unscaled
prior, and the guidance in one table."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ... import report
from ...store import summary_dict
from .experiment import METHODS, Summary

__all__ = ["calibration", "calibration_table", "against_last", "particles_curve", "steps_curve", "stopping",
           "comparison_table", "guidance_table", "LEVEL", "POWER"]

LEVEL = 0.05  # every test's level; the coverage test shares it over the nominal levels (Bonferroni)
POWER = 0.8  # the power at which a test's smallest detectable effect is stated


def _ratio(result: Any) -> float:
    """n_test / n_train of every split of a run, from its configuration."""
    f = float(result.config["test_fraction"])
    return f / (1 - f)


def against_last(values: np.ndarray, candidates: list[int], test_to_train: float,
                 level: float = LEVEL) -> pd.DataFrame:
    """Each candidate (a column of ``values``, one row per split) against the last one: the mean over splits,
    the mean difference from the last column with its standard error corrected for splits that share rows
    (``SD(d) sqrt(1/J + n_test/n_train)``, as :func:`~bootens_core.repro.experiments.practice.experiment
    .resampled_paired`), its two-sided ``1 - level`` confidence interval, and the one-sided ``1 - level``
    upper bound: the smallest margin within which the non-inferiority test of ``first_within`` shows the
    candidate (it shows it within a margin above this bound)."""
    values = np.asarray(values, float)
    j = values.shape[0]
    rows = []
    for i, c in enumerate(candidates):
        d = values[:, i] - values[:, -1]
        se = float(d.std(ddof=1) * math.sqrt(1 / j + test_to_train))
        mean = float(d.mean())
        half = float(stats.t.ppf(1 - level / 2, j - 1)) * se
        rows.append({"candidate": int(c), "mean": float(values[:, i].mean()), "minus the last": mean,
                     "corrected SE": se, "CI low": mean - half, "CI high": mean + half,
                     "shown within": mean + float(stats.t.ppf(1 - level, j - 1)) * se})
    return pd.DataFrame(rows).set_index("candidate")


def _coverage_band(cov: np.ndarray, test_to_train: float, level: float = LEVEL
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Mean coverage per column over splits and the half-width of its corrected two-sided interval."""
    j = cov.shape[0]
    se = cov.std(0, ddof=1) * math.sqrt(1 / j + test_to_train)
    return cov.mean(0), float(stats.t.ppf(1 - level / 2, j - 1)) * se


def particles_curve(result: Any) -> pd.DataFrame:
    """Test MNLL of the first ``k`` particles against all of them (:func:`against_last`) and the coverage of
    their central 90% intervals with its corrected 95% interval, per ``k``."""
    s = summary_dict(result.summary)
    by_k, ratio = result["by_k"], _ratio(result)
    t = against_last(by_k[:, :, 1], s["ks"], ratio).rename_axis("particles")
    cov, half = _coverage_band(by_k[:, :, 2], ratio)
    return t.rename(columns={"mean": "test MNLL"}).assign(**{"90% coverage": cov, "± (95%)": half})


def steps_curve(result: Any) -> pd.DataFrame:
    """Test MNLL of the particles after each recorded step against the last step's (:func:`against_last`), the
    coverage of their central 90% intervals when the run recorded it, and the objective of the median particle
    (mean over splits) at that step."""
    s = summary_dict(result.summary)
    by_step, ratio = result["by_step"], _ratio(result)
    t = against_last(by_step[:, :, 1], s["stop_steps"], ratio).rename_axis("steps")
    t = t.rename(columns={"mean": "test MNLL"})
    if by_step.shape[2] > 2:  # a record made before the coverage was kept along the steps lacks it
        cov, half = _coverage_band(by_step[:, :, 2], ratio)
        t = t.assign(**{"90% coverage": cov, "± (95%)": half})
    return t.assign(objective=_objective(result, s["stop_steps"]))


def _objective(result: Any, steps: list[int]) -> np.ndarray:
    """The median particle's objective after each of ``steps`` (mean over splits; NaN at step 0)."""
    med = np.asarray(result["loss_median"], float).mean(0)
    return np.array([med[t - 1] if t >= 1 else np.nan for t in steps])


def calibration_table(result: Any, level: float = LEVEL, power: float = POWER) -> pd.DataFrame:
    """Per nominal level: the mean coverage over splits, its difference from the level, the corrected
    standard error, the t statistic of the rule (:func:`calibration`), and the smallest coverage error the
    rule detects with probability ``power`` (``(t_crit + t_power) SE``, Student's t on ``J - 1`` degrees of
    freedom, ``t_crit`` with the level shared over the nominal levels)."""
    s = summary_dict(result.summary)
    levels = np.asarray(s["levels"], float)
    cov = np.asarray(result["coverage"], float)
    j = cov.shape[0]
    dev = cov - levels[None]
    se = dev.std(0, ddof=1) * math.sqrt(1 / j + _ratio(result))
    crit = float(stats.t.isf(level / (2 * levels.size), j - 1))
    detect = (crit + float(stats.t.ppf(power, j - 1))) * se
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, dev.mean(0) / se, 0.0)
    return pd.DataFrame({"nominal": levels, "coverage": cov.mean(0), "minus nominal": dev.mean(0),
                         "corrected SE": se, "t": t, f"detected at {power:.0%} power from": detect}
                        ).set_index("nominal")


def calibration(result: Any) -> report.Verdict:
    """The intervals' calibration by the t-test over splits at each nominal level (mean of coverage minus
    level over its standard error corrected for splits that share rows, ``n_splits - 1`` degrees of freedom,
    two-sided, level 0.05 shared over the levels): overconfident (coverage below) or underconfident (above) at
    the levels that differ. When none differs the verdict says so together with what the test can see: the
    smallest coverage errors it detects at 80% power (:func:`calibration_table`), by level — a non-rejection
    is not a proof of calibration."""
    table = calibration_table(result)
    t = table["t"].to_numpy()
    levels = table.index.to_numpy()
    crit = float(stats.t.isf(LEVEL / (2 * t.size), result["coverage"].shape[0] - 1))
    low, high = levels[t < -crit], levels[t > crit]
    margin = float(np.min(np.abs(np.abs(t) - crit)))
    detect = table.iloc[:, -1].to_numpy()
    evidence = (f"coverage {', '.join(f'{c:.3f}' for c in table['coverage'])} at levels "
                f"{', '.join(f'{v:g}' for v in levels)}; t {', '.join(f'{v:.2f}' for v in t)} "
                f"(limit ±{crit:.2f}); detected at 80% power from {', '.join(f'{v:.2f}' for v in detect)}")
    if low.size == 0 and high.size == 0:
        return report.Verdict(f"no miscalibration detected (the test detects coverage errors from "
                              f"{detect.min():.2f} to {detect.max():.2f}, by level)", evidence, margin)
    parts = []
    if low.size:
        parts.append(f"overconfident at {len(low)} of {levels.size} levels")
    if high.size:
        parts.append(f"underconfident at {len(high)} of {levels.size} levels")
    return report.Verdict("; ".join(parts), evidence, margin)


def stopping(result: Any) -> report.Verdict:
    """Whether fewer steps predict as well: the first of the recorded step counts whose test MNLL is shown
    within the margin of the last one's (:func:`~bootens_core.repro.experiments.practice.experiment
    .first_within`), named against the full run, with the share of the median particle's fall in objective
    still ahead at that step: a test MNLL as good before the particles reach their optima is early stopping on
    these data, not Algorithm 1 having converged."""
    s = summary_dict(result.summary)
    first, last = s["stop_step"], s["stop_steps"][-1]
    evidence = f"test MNLL by step {dict(zip(s['stop_steps'], (round(v, 4) for v in s['mnll_by_step'])))}"
    if first >= last:
        return report.Verdict(f"no fewer steps shown as good as all {last}", evidence)
    obj = np.asarray(result["loss_median"], float).mean(0)
    ahead = (obj[first - 1] - obj[-1]) / (obj[0] - obj[-1]) if first >= 1 and obj[0] != obj[-1] else 0.0
    text = f"test MNLL as good after {first} steps as after {last}"
    if ahead > 0.01:
        text += f", with {ahead:.0%} of the objective's fall still ahead: early stopping, not convergence"
    return report.Verdict(text, evidence)


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


def guidance_table(result: Any) -> pd.DataFrame:
    """The measured guidance, one row per question, each with what its test can and cannot see."""
    s = summary_dict(result.summary)
    sel = np.asarray(s["selected_noise_var"])
    values, unique = np.unique(sel, return_counts=True)
    pc = particles_curve(result)
    k_prev = pc.index[-2]
    prev = pc.loc[k_prev]
    st = steps_curve(result)
    stop = s["stop_step"]
    margin, last_k, last_step = s["mnll_margin"], s["ks"][-1], s["stop_steps"][-1]
    ci = f"95% CI {prev['CI low']:+.3f} to {prev['CI high']:+.3f}"
    particles = (f"{s['k_enough']} of {last_k} shown within {margin:g}; {k_prev} particles: "
                 f"{prev['minus the last']:+.3f} nats ({ci})")
    steps = f"{stop} of {last_step}"
    if stop >= 1:
        steps += (f" by test MNLL ({st.loc[stop, 'minus the last']:+.3f} nats); objective "
                  f"{st.loc[stop, 'objective']:.4g} then, {st['objective'].iloc[-1]:.4g} at the end")
    rows = [
        ("particles", particles,
         f"fewest shown within {margin:g} nats of all particles' test MNLL (corrected 95% bound): "
         "with few splits, a matter of the test's power as much as of the particles"),
        ("noise variance", ", ".join(f"{v:g} ({c}x)" for v, c in zip(values, unique, strict=True)),
         "selected on held-out MNLL (fraction of the labels' variance), per split"),
        ("steps", steps,
         f"first whose test MNLL is shown within {margin:g} of the last step's (corrected 95% bound): "
         "early stopping on these data when the objective is still falling"),
        ("stuck particles", f"{s['stuck']} of {s['particles_total']}",
         "final objective over 5 robust sd above its ensemble's median"),
        ("calibration", str(calibration(result)),
         "coverage at 50-95% against the nominal level, corrected t-test over splits"),
    ]
    return pd.DataFrame(rows, columns=["question", "measured", "rule"]).set_index("question")
