"""Lemma 1 and Theorems 1-2: the rules that turn the measurements into verdicts."""

from __future__ import annotations

from typing import Any

from ... import report
from ...store import summary_dict
from .experiment import Summary

__all__ = ["evaluate"]


def evaluate(s: Summary | dict[str, Any]) -> dict[str, report.Verdict]:
    """Verdicts of the theory chapter.

    ``lemma1``: the lemma claims an identity for every theta, so one decisive Monte-Carlo rejection
    (|z| > 5) refutes it; the corrected identity must pass every check (|z| < 4). ``linear_rate``: the
    particles' score-based estimate matches the exact KL rate at every recorded step (|z| < 4).
    ``theorem1_linear``: Theorem 1's expression with each particle's own perturbation is the KL rate only if
    it matches the exact rate at every recorded step (|z| < 4); it is refuted if some step has |z| > 5.
    ``theorem2``: the theorem's proof combines Theorem 1 with Lemma 1, so it stands or falls with the lemma's
    verdict; its conclusion (the KL never rises for linear and ReLU models) is judged separately where an
    exact rate exists -- the linear model's closed form, which must be <= 0 at every recorded step (no
    Monte-Carlo error) -- and is "NOT established" for ReLU networks, where no exact KL exists and what
    remains of the theorem (the corrected condition, for the flow averaged over perturbations) is not a
    statement about Algorithm 1. Margins are in z units.
    """
    s = summary_dict(s)
    zp, zc = s["lemma1_z_paper_abs_max"], s["lemma1_z_corrected_abs_max"]
    lem, lem_margin = report.all_pass([(zp > 5, report.distance(zp, 5, 1.0)), (zc < 4, report.distance(zc, 4, 1.0))])
    lin = s["linear"]
    z1 = lin["theorem1_max_z_vs_exact_kl_rate"]
    t1 = "is NOT the KL rate along Algorithm 1" if z1 > 5 else ("matches the KL rate" if z1 < 4 else "not settled")
    zr = lin["max_z_vs_exact_kl_rate"]
    falls = lin["frac_steps_kl_decreasing_exact"]
    if lem:
        t2 = ("its proof does NOT hold (it uses Lemma 1's sign); the conclusion holds for the linear model "
              + ("(exact KL rate)" if falls == 1.0 else "only at some steps (exact KL rate)")
              + " and is NOT established for ReLU networks")
    else:
        t2 = "not settled"
    shares = ", ".join(f"{s[k]['frac_steps_theorem2_corrected_holds']:.0%} ({k})" for k in ("relu", "tanh") if k in s)
    t2_ev = (f"Lemma 1 as printed: largest |z| {zp:.3g}; linear model: exact KL rate <= 0 at {falls:.0%} of recorded "
             "steps" + (f"; the corrected condition holds at {shares} of recorded steps" if shares else ""))
    return {
        "lemma1": report.Verdict("sign error confirmed; the corrected identity holds" if lem else "not settled",
                                 f"largest |z| of the printed identity {zp:.3g} (refuted above 5), of the corrected one "
                                 f"{zc:.2f} (holds below 4)", lem_margin),
        "linear_rate": report.Verdict("matches the exact rate" if zr < 4 else "does NOT match",
                                      f"largest |z| against the exact rate {zr:.2f} (limit 4)", report.distance(zr, 4, 1.0)),
        "theorem1_linear": report.Verdict(t1, f"largest |z| against the exact rate {z1:.3g} (refuted above 5, matches "
                                          "below 4)", min(report.distance(z1, 5, 1.0), report.distance(z1, 4, 1.0))),
        "theorem2": report.Verdict(t2, t2_ev, lem_margin),
    }
