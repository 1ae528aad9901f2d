"""Figure 4's verdicts and the histogram study's tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ... import report
from ...store import Result, summary_dict
from .experiment import STEP_LABELS, Summary

__all__ = ["KL_T", "STEP_NAMES", "evaluate", "kl_table", "same_sign_table"]


KL_T = 4.0  # |mean / SE| beyond which a change of the histogram KL counts (SE over independent ensembles)


STEP_NAMES = {"paper_step": "the paper's step", "small_step": "the small step"}


def _trend(d: float, se: float) -> tuple[str, float, float | None]:
    """Two-sided rule on a difference ``d`` with standard error ``se``: ``falls`` if ``d / se < -KL_T``,
    ``rises`` if ``> KL_T``, else ``no change``; margin: ``| |d / se| - KL_T |`` (in SE units)."""
    if not (np.isfinite(se) and se > 0):
        return ("no change" if d == 0 else ("falls" if d < 0 else "rises")), 0.0 if d == 0 else float("inf"), None
    t = d / se
    word = "falls" if t < -KL_T else "rises" if t > KL_T else "no change"
    return word, float(t), abs(abs(t) - KL_T)


def evaluate(s: Summary | dict[str, Any]) -> dict[str, report.Verdict]:
    """Verdicts of the toy-ReLU chapter (Figure 4).

    With the histogram study (``s["histogram"]``, see ``experiments.toy_relu``), every KL statistic is a
    difference of the histogram estimate of ``KL(q_t || p)`` between two times of the same ensembles, with its
    standard error over ``repeats`` independent ensembles; the rule on ``t = difference / SE`` is two-sided:
    ``t < -4`` the KL falls, ``t > 4`` it rises, otherwise no change beyond its noise. Per step size
    (``paper_step``, ``small_step``):

    * ``<step>_all``: final minus step 0 (including the first steps, where the paper's step overshoots);
    * ``<step>_late``: final minus the end of the overshoot window (the steps until an overshoot at the
      largest curvature has decayed below the configured tolerance; the same time at the small step);
    * ``<step>_min``: final minus the minimum of the mean curve (cross-fitted), a rise after the minimum.

    ``kl``: the paper's claim, a (strictly) decreasing KL curve: reproduced when at both step sizes the KL falls
    from step 0 and does not rise after its minimum beyond its noise. ``kl_kde``: the same claim judged with the
    paper's estimator (200-particle KDE): no rise between evaluated steps above 2 sd of the KDE self-distance.
    ``rhat``: the paper reports an average predictive R-hat of 1.00: reproduced when our largest predictive
    R-hat is below the 99% quantile of R-hat on i.i.d. draws (``rhat_iid_q99``). ``posterior``: whether the
    final particles (paper's step) are the posterior: their histogram KL within 4 SE of what exact posterior
    draws score (without the histogram study: the KDE KL within the KDE self-distance + 2 sd).

    Margins: histogram statistics in SE units (``| |t| - 4 |``); KDE statistics in units of the KDE
    self-distance's sd; R-hat in units of its i.i.d. noise, taken as (q99 - 1) / 2.33.
    """
    s = summary_dict(s)
    out: dict[str, report.Verdict] = {}
    h = s.get("histogram")
    sd = s["kde_self_distance_sd"]
    noise = 2 * sd
    rise = s["kl_max_increase"]
    kde = report.Verdict("reproduced" if rise <= noise else "NOT reproduced (a rise beyond the estimator's noise)",
                         f"paper's estimator (200-particle KDE): largest rise {rise:.3g} against 2 sd of its self-distance "
                         f"= {noise:.3g}", report.distance(rise, noise, sd))
    if h is not None:
        conds, falls_all, rises_min = [], {}, {}
        texts = {"falls": "falls beyond its noise", "rises": "rises beyond its noise",
                 "no change": "no change beyond its noise"}
        for lab in STEP_NAMES:
            st = h[lab]
            for win, key, what in (("all", "net_all", "final minus step 0"),
                                   ("late", "net_late", f"final minus time {h['overshoot_time']:g}")):
                word, t, m = _trend(st[key], st[f"{key}_se"])
                out[f"{lab}_{win}"] = report.Verdict(
                    texts[word], f"h = {st['step_size']:g}: {what} = {st[key]:.4g} ± {st[f'{key}_se']:.2g} "
                    f"(t = {t:.1f}, limit ±{KL_T:g})", m)
                if win == "all":
                    falls_all[lab] = word == "falls"
                    conds.append((word == "falls", None if m is None else abs(t + KL_T)))
            word, t, m = _trend(st["rise_after_min"], st["rise_after_min_se"])
            rises_min[lab] = word == "rises"
            out[f"{lab}_min"] = report.Verdict(
                "rises again after its minimum, beyond its noise" if rises_min[lab]
                else "no rise after its minimum beyond its noise",
                f"h = {st['step_size']:g}: final minus the minimum at time {st['kl_min_time']:g} (cross-fitted) = "
                f"{st['rise_after_min']:.4g} ± {st['rise_after_min_se']:.2g} (t = {t:.1f}, limit {KL_T:g})",
                None if m is None else abs(t - KL_T))
            conds.append((not rises_min[lab], None if m is None else abs(t - KL_T)))
        ok, margin = report.all_pass(conds)
        if ok:
            text = "reproduced"
        elif not all(falls_all.values()):
            text = "NOT reproduced (the KL does not fall beyond its noise)"
        else:  # which step sizes rise is in the per-step verdicts (a text naming them would flip with either)
            text = "NOT reproduced (the KL falls, then rises again beyond its noise)"
        ev = "; ".join(f"{STEP_NAMES[k]}: {'falls' if falls_all[k] else 'does not fall'}, "
                       f"{'rises' if rises_min[k] else 'no rise'} after its minimum" for k in STEP_NAMES)
        out["kl"] = report.Verdict(text, f"histogram estimator, {h['repeats']} ensembles of {h['particles']} particles; {ev}",
                                   margin)
    out["kl_kde"] = kde
    q99 = s["rhat_iid_q99"]
    rhat_scale = (q99 - 1) / 2.326
    out["rhat"] = report.Verdict(
        "reproduced" if s["rhat_max"] <= q99 else "NOT reproduced (largest R-hat above i.i.d. noise)",
        f"largest predictive R-hat {s['rhat_max']:.3f} against the i.i.d. 99% quantile {q99:.3f}",
        report.distance(s["rhat_max"], q99, rhat_scale))
    not_post = "NOT the exact posterior (as the paper says, the ensemble is not the same as MCMC)"
    if h is not None:
        st = h["paper_step"]
        d = st["kl_final"] - h["bias_posterior"]
        se = float(np.hypot(st["kl_final_se"], h["bias_posterior_se"]))
        far = d > KL_T * se
        out["posterior"] = report.Verdict(
            not_post if far else "the exact posterior",
            f"final histogram KL {st['kl_final']:.4g} ± {st['kl_final_se']:.2g} against exact posterior draws "
            f"{h['bias_posterior']:.2g} ± {h['bias_posterior_se']:.2g} (limit: 4 SE)", report.distance(d, KL_T * se, se))
    else:
        floor = s["kde_self_distance_mean"] + noise
        out["posterior"] = report.Verdict(
            "the exact posterior" if s["kl_final_vs_exact"] <= floor else not_post,
            f"final KL to the exact posterior {s['kl_final_vs_exact']:.3g} against the floor "
            f"{s['kde_self_distance_mean']:.3g} + 2 × {sd:.3g}", report.distance(s["kl_final_vs_exact"], floor, sd))
    first = [k for k in ("kl", "kl_kde") if k in out]
    return {k: out[k] for k in first + [k for k in out if k not in first]}


def _pm(m: float, se: float, digits: int = 4) -> str:
    return f"{m:.{digits}f} ± {se:.{digits}f}"


def kl_table(result: Result) -> pd.DataFrame:
    """Key numbers of the histogram KL curves (mean ± SE over the repeats), one column per step size."""
    h = result.summary["histogram"]
    rows: dict[str, dict[str, str]] = {}
    for lab in STEP_LABELS:
        s = h[lab]
        col = f"h = {s['step_size']:g} ({s['steps']} steps)"
        rows[col] = {
            "h x largest curvature": f"{s['h_curvature_max']:.3f}",
            "KL at step 0": _pm(s["kl_start"], s["kl_start_se"]),
            f"KL at time {h['overshoot_time']:g} (end of the excluded window)": _pm(s["kl_window"], s["kl_window_se"]),
            "minimum of the mean curve (time)": f"{s['kl_min']:.4f} ({s['kl_min_time']:g})",
            "final KL": _pm(s["kl_final"], s["kl_final_se"]),
            "final - step 0": _pm(s["net_all"], s["net_all_se"]),
            "final - end of window": _pm(s["net_late"], s["net_late_se"]),
            "final - minimum (cross-fitted)": _pm(s["rise_after_min"], s["rise_after_min_se"]),
            "  same, bins of half the width": _pm(s["rise_after_min_half_width"], s["rise_after_min_half_width_se"]),
            "  same, bins of twice the width": _pm(s["rise_after_min_double_width"], s["rise_after_min_double_width_se"]),
            "  same, half the particles": _pm(s["rise_after_min_half_particles"], s["rise_after_min_half_particles_se"]),
            "  cross-entropy part of it (the rest: entropy)":
                _pm(s["cross_change_after_min"], s["cross_change_after_min_se"]),
            "KL of the particles ending with opposite signs: change after the minimum":
                _pm(s["ends_opposite_change_after_min"], s["ends_opposite_change_after_min_se"]),
            "KL of the particles ending with the same sign: change after the minimum":
                _pm(s["ends_same_change_after_min"], s["ends_same_change_after_min_se"]),
            "jackknife correction: step 0, minimum, final":
                f"{s['correction_start']:.4f}, {s['correction_at_min']:.4f}, {s['correction_final']:.4f}",
        }
    df = pd.DataFrame(rows)
    df.loc["estimator bias on the prior (exact binned KL known)"] = _pm(h["bias_prior"], h["bias_prior_se"])
    df.loc["estimator bias on exact posterior draws (truth 0)"] = _pm(h["bias_posterior"], h["bias_posterior_se"])
    return df


def same_sign_table(result: Result) -> pd.DataFrame:
    """What the particles whose two weights share a sign do, at both step sizes."""
    h = result.summary["histogram"]
    q = result.summary["quadrant_mass_exact"]
    rows = {}
    for lab in STEP_LABELS:
        s = h[lab]
        rows[f"h = {s['step_size']:g}"] = {
            "same sign at step 0": f"{s['same_sign_start']:.3f}",
            "same sign at the end": _pm(s["same_sign_final"], s["same_sign_final_se"], 3),
            "of those starting so: left": _pm(s["leave_fraction"], s["leave_fraction_se"], 3),
            "time of leaving: median, 90%, last": f"{s['leave_time_median']:g}, {s['leave_time_q90']:g}, "
                                                  f"{s['leave_time_max']:g}",
            "leavers that left after the excluded window": f"{s['leave_after_window_fraction']:.3f}",
            "left and came back": f"{s['returned']}",
            "opposite sign at step 0, same sign at the end": f"{s['enter_fraction']:.4f}",
            "diagonal rule predicts who leaves (agreement)": f"{s['leave_rule_agreement']:.3f}",
        }
    df = pd.DataFrame(rows)
    df["exact posterior"] = ""
    df.loc["same sign at the end", "exact posterior"] = f"{q[0] + q[3]:.2g}"
    return df
