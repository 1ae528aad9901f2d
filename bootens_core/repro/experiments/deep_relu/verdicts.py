"""Figure 3's verdicts and tables: agreement with the reference in the reference's own noise units."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ... import noise, report
from ...store import summary_dict
from .experiment import Summary

__all__ = ["T_LIMIT", "RHAT_LIMIT", "ESS_MIN", "NOT_ASSESSED", "evaluate", "reference_converged", "noise_units",
           "rule_size", "along", "drift", "reference"]


# Figure 3's rule: a statistic agrees with the reference when it is within T_LIMIT noise units (noise_units:
# a sample of the ensemble's size from the reference against the rest of it, or, for a reference too short for
# that, the reference's half-vs-half noise); the reference counts as converged when its largest predictive R-hat is below
# RHAT_LIMIT and its smallest predictive bulk ESS at least ESS_MIN (a sample smaller than that estimates
# neither its mean nor its spread well enough to judge an ensemble against).
T_LIMIT = 2.0


RHAT_LIMIT = 1.1
ESS_MIN = 100.0

# The verdict of an agreement that cannot be judged.
NOT_ASSESSED = "not assessed: the reference has not converged"


def reference_converged(s: Summary | dict[str, Any]) -> tuple[bool, str, str]:
    """Whether the NUTS reference is converged (``RHAT_LIMIT``, ``ESS_MIN``): (converged, verdict,
    evidence)."""
    s = summary_dict(s)
    failed = ([f"R-hat above {RHAT_LIMIT:g}"] if not s["rhat_max"] < RHAT_LIMIT else []) + (
        [f"bulk ESS below {ESS_MIN:g}"] if not s["ess_min"] >= ESS_MIN else [])
    verdict = "converged" if not failed else f"NOT converged ({', '.join(failed)})"
    evidence = (f"largest predictive R-hat {s['rhat_max']:.3f} (limit {RHAT_LIMIT:g}); smallest predictive "
                f"bulk ESS {s['ess_min']:.0f} (at least {ESS_MIN:g})")
    return not failed, verdict, evidence


def noise_units(s: Summary | dict[str, Any]) -> tuple[float, float, str]:
    """The rule's units for ``mean |Δmean| / sd`` and ``|log sd ratio|``, and what they are: the noise of a
    sample of the ensemble's size drawn from the reference against the rest of it (``sample_noise_*``: the
    sampling noise of both sides of the comparison) when the run has it; else the reference's half-vs-half
    noise (``reference_noise_*``), which over-states the comparison's noise, and so errs towards "agrees",
    while the reference holds at most about three times as many draws as the ensemble has particles."""
    s = summary_dict(s)
    if s.get("sample_noise_mad") is not None:
        return (s["sample_noise_mad"], s["sample_noise_log_sd"],
                f"{s['sample_noise_n']} reference draws against the rest, {s['sample_noise_repeats']} subsets")
    return (s["reference_noise_mad"], s["reference_noise_log_sd"],
            f"half of the reference's chains against the other half, {s['reference_noise_partitions']} splits"
            if s.get("reference_noise_partitions") is not None else "half of the chains against the other half")


def rule_size(f_chains: Any, n: int, repeats: int = 256, seed: int = 1) -> dict[str, float]:
    """How often the rule says "differs" of an ensemble that is a sample of the posterior: ``repeats``
    subsets of ``n`` of the reference's draws ``f_chains`` ``(chains, draws, n_x)``, each against the rest,
    judged in the units of :func:`.experiment.sample_noise` at its default subsets (the units the rule uses
    for an ensemble of ``n`` particles). Returns the share of subsets failing each statistic's limit
    (``mad``, ``log_sd``) and either (``either``), and ``repeats``."""
    from .experiment import rule_statistics

    f = np.asarray(f_chains, np.float64)
    size = noise.rule_size(f.reshape(-1, f.shape[-1]), n, rule_statistics, T_LIMIT, repeats, seed)
    return {"mad": size["first"], "log_sd": size["second"], "either": size["either"], "repeats": size["repeats"]}


def _agrees(mad: float, sd_ratio: float, s: dict[str, Any]) -> tuple[bool, float | None, str]:
    """Two-sided agreement of one step with the reference: (agrees, margin, evidence)."""
    um, us, _ = noise_units(s)
    ls = abs(float(np.log(sd_ratio)))
    ok, margin = report.all_pass([(mad <= T_LIMIT * um, report.distance(mad, T_LIMIT * um, um)),
                            (ls <= T_LIMIT * us, report.distance(ls, T_LIMIT * us, us))])
    ev = (f"mean |Δmean|/sd {mad:.3g} against {T_LIMIT:g} × {um:.3g}; |log sd ratio| {ls:.3g} "
          f"(ratio {sd_ratio:.3g}) against {T_LIMIT:g} × {us:.3g}")
    return ok, margin, ev


def evaluate(s: Summary | dict[str, Any]) -> dict[str, report.Verdict]:
    """Verdicts of the deep-ReLU chapter (Figure 3).

    ``reference``: the NUTS reference is converged when its largest predictive R-hat on the grid is below
    ``RHAT_LIMIT`` (1.1) and its smallest predictive bulk ESS at least ``ESS_MIN`` (100). ``agreement``
    (final step) and ``along`` (every recorded step): the paper's
    claim that the particles "reasonably approximate" the MCMC result, judged two-sided in the noise units
    of :func:`noise_units` (a sample of the ensemble's size from the reference against the rest of it, or a
    short reference's half-vs-half noise): the mean difference ``mean |Δmean|/sd`` must be at most
    ``T_LIMIT`` (2) times the unit's mean, and ``|log sd ratio|`` (too wide and too narrow alike) at most 2
    times the unit's root mean square. Margins are in those noise units. With a reference that is not converged
    no agreement can be judged: both read ``NOT_ASSESSED`` (the evidence says what the rule alone gives).
    """
    s = summary_dict(s)
    converged, ref, ref_ev = reference_converged(s)
    out = {"reference": report.Verdict(ref, ref_ev)}
    ok, margin, ev = _agrees(s["mean_abs_diff_mean"], s["sd_ratio_median"], s)
    rule = "agrees" if ok else "differs"
    if converged:
        out["agreement"] = report.Verdict("reproduced" if ok else "NOT reproduced", ev, margin)
    else:
        out["agreement"] = report.Verdict(NOT_ASSESSED, f"the rule alone: {rule} ({ev})")
    if "agreement_steps" in s:
        steps = s["agreement_steps"]
        res = [_agrees(m, r, s) for m, r in
               zip(s["mean_abs_diff_mean_along"], s["sd_ratio_median_along"], strict=True)]
        agree_at = [t for t, (o, _, _) in zip(steps, res, strict=True) if o]
        if not agree_at:
            text = "agrees at no recorded step"
        elif len(agree_at) == len(steps):
            text = "agrees at every recorded step"
        else:
            text = f"agrees at {len(agree_at)} of {len(steps)} recorded steps"
        margins = [m for _, m, _ in res]
        margin = None if any(m is None for m in margins) else min(margins)
        ev = (f"agrees at steps {', '.join(map(str, agree_at)) or 'none'} of {steps[0]}-{steps[-1]} "
              f"(every {steps[1] - steps[0] if len(steps) > 1 else 0})")
        out["along"] = (report.Verdict(text, ev, margin) if converged else
                        report.Verdict(NOT_ASSESSED, f"the rule alone: {text}; {ev}"))
    return out


def along(s: Summary | dict[str, Any]) -> pd.DataFrame:
    """The ensemble against the reference at every recorded optimisation step: the two statistics of the
    rule (``evaluate``) in its noise units (:func:`noise_units`), and what the rule says."""
    s = summary_dict(s)
    um, us, _ = noise_units(s)
    rows = []
    for t, m, r in zip(s["agreement_steps"], s["mean_abs_diff_mean_along"], s["sd_ratio_median_along"],
                       strict=True):
        ok, _, _ = _agrees(m, r, s)
        rows.append({"step": t, "mean |Δmean| / sd": m, "in noise units": m / um, "median sd ratio": r,
                     "|log sd ratio| in noise units": abs(np.log(r)) / us,
                     "rule": "agrees" if ok else "differs"})
    return pd.DataFrame(rows).set_index("step")


def drift(s: Summary | dict[str, Any]) -> report.Text:
    """How the ensemble moves relative to the reference after the recorded step where it is closest to it
    (the smaller of the rule's two statistics' worse one, in noise units): the mean difference and the
    sd ratio there and at the last recorded step, in the reference's noise units. Read against a reference
    that has not converged, this describes the two samples, not the ensemble against the posterior."""
    t = along(s)
    worst = t[["in noise units", "|log sd ratio| in noise units"]].max(axis=1)
    best, last = int(worst.idxmin()), int(t.index[-1])
    b, e = t.loc[best], t.loc[last]
    return report.Text(
        f"closest at step {best}; from there to step {last} the mean difference grows from "
        f"{b['in noise units']:.2f} to {e['in noise units']:.2f} noise units and the sd ratio from "
        f"{b['median sd ratio']:.2f} to {e['median sd ratio']:.2f} "
        f"({b['|log sd ratio| in noise units']:.1f} to {e['|log sd ratio| in noise units']:.1f} noise units)")


# The NUTS reference's diagnostics and noise scale, the paper's MH acceptance: (label, summary key).
_REFERENCE = (
    ("NUTS predictive R-hat, max over x", "nuts_rhat_max"), ("NUTS predictive R-hat, mean", "nuts_rhat_mean"),
    ("NUTS bulk ESS, min over x", "nuts_ess_min"), ("NUTS divergent transitions", "nuts_divergences"),
    ("NUTS leapfrog steps per draw", "nuts_mean_num_steps"), ("NUTS mean acceptance", "nuts_accept_rate"),
    ("NUTS draws", "nuts_draws_total"),
    ("NUTS half vs half: mean |Δmean| / sd", "reference_split_mean_abs_diff_mean"),
    ("NUTS half vs half: median sd ratio", "reference_split_sd_ratio_median"),
    ("NUTS half vs half: band coverage", "reference_split_band_coverage"),
    ("half vs half: mean |Δmean| / sd, mean over half splits", "reference_noise_mad"),
    ("half vs half: |log sd ratio|, rms over half splits", "reference_noise_log_sd"),
    ("half splits of the chains", "reference_noise_partitions"),
    ("sample of the ensemble's size vs the rest: mean |Δmean| / sd", "sample_noise_mad"),
    ("sample of the ensemble's size vs the rest: |log sd ratio|, rms", "sample_noise_log_sd"),
    ("sample size (the particles kept)", "sample_noise_n"),
    ("paper's MH, faithful prior: acceptance", "mh_faithful_accept_rate"),
    ("paper's MH, deviation prior: acceptance", "mh_deviation_accept_rate"),
)


def reference(s: Summary | dict[str, Any], short: Summary | dict[str, Any] | None = None) -> pd.DataFrame:
    """The deep-ReLU chapter's reference, by readable label: NUTS's convergence diagnostics, its half-vs-half
    noise and a sample of the ensemble's size against the rest (the units of the agreement rule,
    :func:`noise_units`) and the paper's MH acceptance rates, from the summary ``s`` (NaN
    for a quantity the run did not compute). With ``short`` (the summary of a run whose own NUTS reference is
    shorter, e.g. the chapter's profile beside a reference read with
    :func:`.reference.against`), one column each: ``reference`` and ``short run``."""
    index = pd.Index([label for label, _ in _REFERENCE], name="quantity")

    def column(x: Summary | dict[str, Any]) -> list[float]:
        d = summary_dict(x)
        return [float("nan") if d.get(key) is None else float(d[key]) for _, key in _REFERENCE]

    if short is None:
        return pd.DataFrame({"value": column(s)}, index=index)
    return pd.DataFrame({"reference": column(s), "short run": column(short)}, index=index)
