"""experiments.linear.verdicts: the rules that turn the run's summary into verdicts, and its tables."""

from __future__ import annotations

import pytest

from bootens_core.repro.experiments import linear


LIN = {
    "kl_final": 6.1,
    "paper_setting_kl_final": 494.0,
    "self_distance_mean": 6.0,
    "self_distance_sd": 0.25,
    "map_cov_z": 0.3,
    "map_subspace_kl_z": -0.2,
    "map_mean_chi2_pvalue": 0.5,
    "step_size": 0.1,
    "steps": 20_000,
}


# The same experiment with features times sqrt(2/D): the paper's setting 7.3 against 6.0 + 3 * 0.25 = 6.75.
LIN_SCALED = {
    "feature_scale": "sqrt(2/D)",
    "paper_setting_kl_final": 7.3,
    "paper_setting_step_size": 0.01,
    "paper_setting_steps": 400,
    "self_distance_mean": 6.0,
    "self_distance_sd": 0.25,
}


@pytest.mark.parametrize(
    "change, kl, map_",
    [
        ({}, "reproduced with a deviation (Adagrad h = 0.1, 20 000 steps)", "reproduced"),
        ({"paper_setting_kl_final": 6.5}, "reproduced", "reproduced"),
        ({"kl_final": 6.0 + 3 * 0.25 + 0.01}, "NOT reproduced", "reproduced"),
        (
            {"map_cov_z": -4.5},
            "reproduced with a deviation (Adagrad h = 0.1, 20 000 steps)",
            "NOT reproduced",
        ),
        (
            {"map_subspace_kl_z": 4.5},
            "reproduced with a deviation (Adagrad h = 0.1, 20 000 steps)",
            "NOT reproduced",
        ),
        (
            {"map_mean_chi2_pvalue": 1e-4},
            "reproduced with a deviation (Adagrad h = 0.1, 20 000 steps)",
            "NOT reproduced",
        ),
    ],
)
def test_linear_verdicts(change, kl, map_):
    v = linear.verdicts.evaluate({**LIN, **change})
    assert str(v["kl"]) == kl and str(v["map"]) == map_
    assert set(v) == {"kl", "map"}


def test_linear_deviation_is_named_from_the_summary():
    """The verdict names the deviation the summary ran, not a fixed text."""
    v = linear.verdicts.evaluate({**LIN, "step_size": 0.05, "steps": 2000})
    assert str(v["kl"]) == "reproduced with a deviation (Adagrad h = 0.05, 2 000 steps)"


def test_linear_scaled_verdict():
    v = linear.verdicts.evaluate(LIN, LIN_SCALED)["scaled"]
    assert str(v) == "does not reach the self-distance in 400 steps"
    assert v.margin == pytest.approx((7.3 - 6.75) / 0.25)
    assert "7.300" in v.evidence and "6.750" in v.evidence and "h = 0.01" in v.evidence
    assert not any(ch.isdigit() for ch in str(v).replace("400", ""))  # the text names no measured number
    v = linear.verdicts.evaluate(LIN, {**LIN_SCALED, "paper_setting_kl_final": 6.5, "paper_setting_steps": 300})
    assert str(v["scaled"]) == "reaches the self-distance in 300 steps"
    assert v["scaled"].margin == pytest.approx(1.0)
    # The continued run, when there is one, goes to the evidence.
    cont = {**LIN_SCALED, "paper_setting_continued_steps": 2000,
            "paper_setting_continued_steps_to_self_distance_3sd": 665}
    assert "within the limit from step 665" in linear.verdicts.evaluate(LIN, cont)["scaled"].evidence
    cont["paper_setting_continued_steps_to_self_distance_3sd"] = None
    assert "continued to 2000 steps: never within it" in linear.verdicts.evaluate(LIN, cont)["scaled"].evidence


def test_linear_margin_counts_both_comparisons():
    from scipy import stats

    # kl_final 6.1 against 6.0 + 3 * 0.25 = 6.75: 2.6 sd below; the paper setting is far above.
    v = linear.verdicts.evaluate(LIN)
    assert v["kl"].margin == pytest.approx((6.75 - 6.1) / 0.25)
    # |z| = 0.3 and 0.2 are 3.7 and 3.8 from their limit 4; the chi-square p = 0.5 (z = 0) is 3.09 from
    # the z of its limit 0.001: the closest.
    assert v["map"].margin == pytest.approx(stats.norm.isf(1e-3))
    v = linear.verdicts.evaluate({**LIN, "paper_setting_kl_final": 6.7})
    assert str(v["kl"]) == "reproduced" and v["kl"].margin == pytest.approx(0.05 / 0.25)
