"""Verdicts and glue-able text for the book: the rules that turn a summary into "reproduced" or not.

Keeping them here (not in notebooks) makes them testable and identical wherever they are shown.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Text", "univariate_verdict", "linear_verdicts"]


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
