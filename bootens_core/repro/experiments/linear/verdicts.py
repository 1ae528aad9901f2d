"""Section 4.1's verdicts: the rules that turn the run's summary into "reproduced" or not."""

from __future__ import annotations

from typing import Any

from ... import report
from ...store import summary_dict
from .experiment import Summary

__all__ = ["evaluate"]


def evaluate(s: Summary | dict[str, Any], scaled: Summary | dict[str, Any] | None = None) -> dict[str, report.Verdict]:
    """Verdicts of the linear chapter.

    Figures 2/5: the final KL within 3 sd of the self-distance. Section 4.1: |z| < 4 for the full covariance
    error and for the data-subspace KL of the MAP samples, and the chi-square test of their mean p > 1e-3.
    The deviation named in the verdict is the one the summary ran (``step_size``, ``steps``).

    ``scaled``: the summary of the same experiment with ``feature_scale = "sqrt(2/D)"``; adds ``"scaled"``:
    whether the paper's Adagrad setting (``paper_setting_step_size``, ``paper_setting_steps``) reaches the
    self-distance on that model, by the same rule (KL after its last step within 3 sd of the self-distance).

    ``s``, ``scaled``: the runs' :class:`Summary`, or dicts with at least the keys the rules read.
    """
    s, scaled = summary_dict(s), summary_dict(scaled)
    sd = s["self_distance_sd"]
    limit = s["self_distance_mean"] + 3 * sd
    kl_ok = s["kl_final"] <= limit
    paper_ok = s["paper_setting_kl_final"] <= limit
    # Either comparison flipping changes the verdict: the margin is the closer of the two.
    m_kl, m_paper = report.distance(s["kl_final"], limit, sd), report.distance(s["paper_setting_kl_final"], limit, sd)
    kl_margin = None if m_kl is None or m_paper is None else min(m_kl, m_paper)
    map_ok, map_margin = report.all_pass([
        (abs(s["map_cov_z"]) < 4, report.distance(abs(s["map_cov_z"]), 4, 1.0)),
        (abs(s["map_subspace_kl_z"]) < 4, report.distance(abs(s["map_subspace_kl_z"]), 4, 1.0)),
        (s["map_mean_chi2_pvalue"] > 1e-3,
         report.distance(report.p_to_z(s["map_mean_chi2_pvalue"]), report.p_to_z(1e-3), 1.0)),
    ])
    if kl_ok and paper_ok:
        kl = "reproduced"
    elif kl_ok:
        steps = f"{int(s['steps']):,}".replace(",", " ")  # 20000 -> "20 000"
        kl = f"reproduced with a deviation (Adagrad h = {s['step_size']:g}, {steps} steps)"
    else:
        kl = "NOT reproduced"
    kl_ev = (f"final KL {s['kl_final']:.3f}, paper's setting {s['paper_setting_kl_final']:.4g}; limit: "
             f"self-distance {s['self_distance_mean']:.3f} + 3 × {sd:.3f} = {limit:.3f}")
    map_ev = (f"covariance z = {s['map_cov_z']:.2f}, subspace KL z = {s['map_subspace_kl_z']:.2f} (limit |z| < 4); "
              f"χ² p = {s['map_mean_chi2_pvalue']:.3g} (limit 0.001)")
    out = {"kl": report.Verdict(kl, kl_ev, kl_margin),
           "map": report.Verdict("reproduced" if map_ok else "NOT reproduced", map_ev, map_margin)}
    if scaled is not None:
        c = scaled
        c_sd, n = c["self_distance_sd"], c["paper_setting_steps"]
        c_limit = c["self_distance_mean"] + 3 * c_sd
        c_ok = c["paper_setting_kl_final"] <= c_limit
        c_ev = (f"features × {c['feature_scale']}, Adagrad h = {c['paper_setting_step_size']:g}: KL after {n} steps "
                f"{c['paper_setting_kl_final']:.3f}; limit: self-distance {c['self_distance_mean']:.3f} + 3 × "
                f"{c_sd:.3f} = {c_limit:.3f}")
        if c.get("paper_setting_continued_steps") is not None:
            first = c["paper_setting_continued_steps_to_self_distance_3sd"]
            c_ev += (f"; the same run continued: within the limit from step {first}" if first is not None else
                     f"; the same run continued to {c['paper_setting_continued_steps']} steps: never within it")
        text = f"{'reaches' if c_ok else 'does not reach'} the self-distance in {n} steps"
        out["scaled"] = report.Verdict(text, c_ev,
                                       report.distance(c["paper_setting_kl_final"], c_limit, c_sd))
    return out
