"""Verdicts and glue-able text for the book: the rules that turn a summary into "reproduced" or not.

Keeping them here (not in notebooks) makes them testable and identical wherever they are shown.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Text", "univariate_verdict", "linear_verdicts", "toy_relu_verdicts", "deep_relu_verdicts", "theory_verdicts"]


class Text:
    """Text that displays as itself in every mime type (``glue`` of a plain ``str`` shows its quotes)."""

    def __init__(self, text: str):
        self.text = str(text)

    def __repr__(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text

    def _repr_markdown_(self) -> str:
        return self.text


def univariate_verdict(s: dict[str, Any]) -> Text:
    """Figure 1 is reproduced when the final particles match the posterior within 4 Monte-Carlo scales."""
    ok = (
        s["mean_error_sd"] < 4 * s["mean_error_sd_mc_scale"]
        and abs(s["sd_ratio"] - 1) < 4 * s["sd_ratio_mc_scale"]
        and s["ks_pvalue"] > 1e-3
    )
    return Text("reproduced" if ok else "NOT reproduced")


def linear_verdicts(s: dict[str, Any]) -> dict[str, Text]:
    """Verdicts of the linear chapter.

    Figures 2/5: the final KL within 3 sd of the self-distance. Section 4.1: |z| < 4 for the full covariance
    error and for the data-subspace KL of the MAP samples, and the chi-square test of their mean p > 1e-3.
    """
    kl_ok = s["kl_final"] <= s["self_distance_mean"] + 3 * s["self_distance_sd"]
    paper_ok = s["paper_setting_kl_final"] <= s["self_distance_mean"] + 3 * s["self_distance_sd"]
    map_ok = abs(s["map_cov_z"]) < 4 and abs(s["map_subspace_kl_z"]) < 4 and s["map_mean_chi2_pvalue"] > 1e-3
    if kl_ok and paper_ok:
        kl = "reproduced"
    elif kl_ok:
        kl = "reproduced with a deviation (Adagrad h = 0.1, 20 000 steps)"
    else:
        kl = "NOT reproduced"
    return {"kl": Text(kl), "map": Text("reproduced" if map_ok else "NOT reproduced")}


def toy_relu_verdicts(s: dict[str, Any]) -> dict[str, Text]:
    """Verdicts of the toy-ReLU chapter (Figure 4).

    ``kl``: the paper's claim, a decreasing KL curve: reproduced when no rise between evaluated steps exceeds
    the spread (2 sd) of the KDE estimator on 200 exact samples, i.e. every rise is within estimator noise.
    ``rhat``: the paper reports an average predictive R-hat of 1.00, i.e. converged chains: reproduced when our
    largest predictive R-hat is within R-hat's own noise for perfectly mixed chains of the same size (below
    the 99% quantile of R-hat on i.i.d. draws, ``rhat_iid_q99``).
    ``posterior``: whether the final particles are the posterior: their KL to the exact posterior within the
    KDE self-distance (mean + 2 sd).
    """
    noise = 2 * s["kde_self_distance_sd"]
    kl = "reproduced" if s["kl_max_increase"] <= noise else (
        f"NOT reproduced (largest rise {s['kl_max_increase']:.3g} > estimator noise {noise:.3g})")
    rhat = "reproduced" if s["rhat_max"] <= s["rhat_iid_q99"] else (
        f"NOT reproduced (max R-hat {s['rhat_max']:.3f} above {s['rhat_iid_q99']:.3f})")
    floor = s["kde_self_distance_mean"] + noise
    post = "the exact posterior" if s["kl_final_vs_exact"] <= floor else (
        "NOT the exact posterior (as the paper says, the ensemble is not the same as MCMC)")
    return {"kl": Text(kl), "rhat": Text(rhat), "posterior": Text(post)}


def deep_relu_verdicts(s: dict[str, Any]) -> dict[str, Text]:
    """Verdicts of the deep-ReLU chapter (Figure 3).

    ``reference``: the NUTS reference is converged when its predictive R-hat is below 1.1 everywhere on the
    grid. ``agreement``: the paper's claim that the particles "reasonably approximate" the MCMC result, read as:
    the ensemble's 95% band covers at least 80% of the reference's and the predictive sd is within a factor 2
    of the reference's at the median x (rules fixed before the runs).
    """
    ref = "converged" if s["rhat_max"] < 1.1 else f"NOT converged (max R-hat {s['rhat_max']:.2f})"
    ok = s["band_coverage"] >= 0.8 and 0.5 <= s["sd_ratio_median"] <= 2.0
    return {"reference": Text(ref), "agreement": Text("reproduced" if ok else "NOT reproduced")}


def theory_verdicts(s: dict[str, Any]) -> dict[str, Text]:
    """Verdicts of the theory chapter.

    ``lemma1``: the lemma claims an identity for every theta, so one decisive Monte-Carlo rejection
    (|z| > 5) refutes it; the corrected identity must pass every check (|z| < 4). ``linear_rate``: the
    particles' score-based estimate matches the exact KL rate at every recorded step (|z| < 4).
    ``theorem1_linear``: Theorem 1's expression with each particle's own perturbation is the KL rate only if
    it matches the exact rate at every recorded step (|z| < 4); it is refuted if some step has |z| > 5.
    """
    lem = s["lemma1_z_paper_abs_max"] > 5 and s["lemma1_z_corrected_abs_max"] < 4
    lin = s["linear"]
    z1 = lin["theorem1_max_z_vs_exact_kl_rate"]
    t1 = "is NOT the KL rate along Algorithm 1" if z1 > 5 else ("matches the KL rate" if z1 < 4 else "not settled")
    return {
        "lemma1": Text("sign error confirmed; the corrected identity holds" if lem else "not settled"),
        "linear_rate": Text("matches the exact rate" if lin["max_z_vs_exact_kl_rate"] < 4 else "does NOT match"),
        "theorem1_linear": Text(t1),
    }
