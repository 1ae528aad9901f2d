"""Figure 1's verdict: the rule that turns the run's summary into "reproduced" or not."""

from __future__ import annotations

from typing import Any

from ... import report
from ...store import summary_dict
from .experiment import Summary

__all__ = ["evaluate"]


def evaluate(s: Summary | dict[str, Any]) -> report.Verdict:
    """Figure 1 is reproduced when the final particles match the posterior within 4 Monte-Carlo scales.

    ``s``: the run's :class:`Summary`, or a dict with at least the keys the rule reads."""
    s = summary_dict(s)
    me, me_sc = s["mean_error_sd"], s["mean_error_sd_mc_scale"]
    sr, sr_sc = s["sd_ratio"], s["sd_ratio_mc_scale"]
    z_ks, z_cut = report.p_to_z(s["ks_pvalue"]), report.p_to_z(1e-3)
    ok, margin = report.all_pass([
        (me < 4 * me_sc, report.distance(me, 4 * me_sc, me_sc)),
        (abs(sr - 1) < 4 * sr_sc, report.distance(abs(sr - 1), 4 * sr_sc, sr_sc)),
        (s["ks_pvalue"] > 1e-3, report.distance(z_ks, z_cut, 1.0)),
    ])
    evidence = (f"mean error {me:.3f} sd (limit {4 * me_sc:.3f}); sd ratio {sr:.3f} (limit 1 ± {4 * sr_sc:.3f}); "
                f"KS p = {s['ks_pvalue']:.3g} (limit 0.001)")
    return report.Verdict("reproduced" if ok else "NOT reproduced", evidence, margin)
