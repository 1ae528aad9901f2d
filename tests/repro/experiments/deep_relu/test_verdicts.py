"""experiments.deep_relu.verdicts: the rules that turn the run's summary into verdicts, and its tables."""

from __future__ import annotations

import numpy as np
import pytest

from bootens_core.repro.experiments import deep_relu


def _deep(**kw):
    s = {"rhat_max": 1.05, "ess_min": 150.0, "mean_abs_diff_mean": 0.2, "sd_ratio_median": 1.1,
         "reference_noise_mad": 0.15,
         "reference_noise_log_sd": 0.1, "agreement_steps": [0, 100, 200],
         "mean_abs_diff_mean_along": [1.0, 0.2, 0.2], "sd_ratio_median_along": [3.0, 1.1, 1.1]}
    return {**s, **kw}


def test_deep_relu_verdicts_follow_their_rules():
    v = deep_relu.verdicts.evaluate(_deep())
    assert {k: str(x) for k, x in v.items()} == {
        "reference": "converged", "agreement": "reproduced", "along": "agrees at 2 of 3 recorded steps"}
    # Margin by hand: mean |Δmean| is (0.3 - 0.2) / 0.15 units inside its limit 2 x 0.15, |log 1.1| is
    # (0.2 - log 1.1) / 0.1 units inside 2 x 0.1; the closer one decides.
    assert v["agreement"].margin == pytest.approx(min(0.1 / 0.15, (0.2 - np.log(1.1)) / 0.1))
    assert str(deep_relu.verdicts.evaluate(_deep(rhat_max=1.2))["reference"]).startswith("NOT")
    # Two-sided: too wide and too narrow both fail.
    assert str(deep_relu.verdicts.evaluate(_deep(sd_ratio_median=1.3))["agreement"]) == "NOT reproduced"
    assert str(deep_relu.verdicts.evaluate(_deep(sd_ratio_median=1 / 1.3))["agreement"]) == "NOT reproduced"
    assert str(deep_relu.verdicts.evaluate(_deep(mean_abs_diff_mean=0.31))["agreement"]) == "NOT reproduced"
    every = _deep(mean_abs_diff_mean_along=[0.1] * 3, sd_ratio_median_along=[1.0] * 3)
    assert str(deep_relu.verdicts.evaluate(every)["along"]) == "agrees at every recorded step"
    none = _deep(mean_abs_diff_mean_along=[1.0] * 3)
    assert str(deep_relu.verdicts.evaluate(none)["along"]) == "agrees at no recorded step"


def test_deep_relu_verdict_is_not_assessed_without_a_converged_reference():
    """Whatever the statistics say, a reference with R-hat >= 1.1 or a bulk ESS below 100 gives no agreement
    verdict; the reference verdict names what failed."""
    for ref in ({"rhat_max": 1.1}, {"ess_min": 99.0}, {"rhat_max": 1.17, "ess_min": 23.0}):
        for kw in ({}, {"sd_ratio_median": 3.0}):
            v = deep_relu.verdicts.evaluate(_deep(**ref, **kw))
            assert str(v["agreement"]) == "not assessed: the reference has not converged"
            assert str(v["along"]) == "not assessed: the reference has not converged"
            assert v["agreement"].margin is None
    assert str(deep_relu.verdicts.evaluate(_deep(ess_min=23.0))["reference"]) == (
        "NOT converged (bulk ESS below 100)")
    assert str(deep_relu.verdicts.evaluate(_deep(rhat_max=1.17, ess_min=23.0))["reference"]) == (
        "NOT converged (R-hat above 1.1, bulk ESS below 100)")
    assert str(deep_relu.verdicts.evaluate(_deep(ess_min=100.0))["agreement"]) == "reproduced"
    assert "the rule alone: differs" in deep_relu.verdicts.evaluate(_deep(rhat_max=1.3, sd_ratio_median=3.0))[
        "agreement"].evidence


def test_deep_relu_drift_reads_the_along_table():
    """The drift sentence starts at the step closest to the reference (the smaller worse statistic) and ends
    at the last recorded step, with the values of the along table."""
    s = _deep(agreement_steps=[0, 100, 200, 300], mean_abs_diff_mean_along=[1.0, 0.15, 0.3, 0.45],
              sd_ratio_median_along=[3.0, 1.0, 1.2, 1.5])
    text = str(deep_relu.verdicts.drift(s))
    assert text.startswith("closest at step 100; from there to step 300 ")
    assert "from 1.00 to 3.00 noise units" in text and "sd ratio from 1.00 to 1.50" in text


def test_the_rules_units_are_the_sample_noise_when_the_run_has_it():
    """A run with the noise of a sample of its size (a long reference) is judged in those units; without
    (a short reference), in the half-vs-half units."""
    half = deep_relu.verdicts.noise_units(_deep(reference_noise_partitions=3))
    assert half[:2] == (0.15, 0.1) and "3 splits" in half[2]
    s = _deep(sample_noise_mad=0.05, sample_noise_log_sd=0.02, sample_noise_n=200, sample_noise_repeats=64)
    assert deep_relu.verdicts.noise_units(s)[:2] == (0.05, 0.02)
    assert "200 reference draws against the rest" in deep_relu.verdicts.noise_units(s)[2]
    # 0.2 and log 1.1 are inside 2 x (0.15, 0.1) but outside 2 x (0.05, 0.02)
    assert str(deep_relu.verdicts.evaluate(_deep())["agreement"]) == "reproduced"
    assert str(deep_relu.verdicts.evaluate(s)["agreement"]) == "NOT reproduced"
    assert deep_relu.verdicts.along(s).loc[100, "in noise units"] == pytest.approx(0.2 / 0.05)


def test_the_rule_says_differs_of_a_sample_of_the_posterior_rarely():
    """Subsets of independent draws are samples of the same law: the rule fails them at about the size of a
    two-sided test at 2 sd per statistic (about 5% for |log sd ratio|, less for the mean difference, whose
    limit is twice its mean; below 10% each with the units' own noise, either below 15%), on 400 subsets
    (Monte-Carlo sd about 1 point). In half-vs-half units (here 500 draws against 500) a sample of 100 would
    fail about a quarter of the time."""
    f = np.random.default_rng(7).normal(size=(4, 250, 5))
    size = deep_relu.verdicts.rule_size(f, 100, repeats=400)
    assert size["repeats"] == 400
    assert size["log_sd"] < 0.1 and size["mad"] < 0.1 and size["either"] < 0.15
    assert size["either"] >= max(size["mad"], size["log_sd"])


def test_deep_relu_along_table():
    t = deep_relu.verdicts.along(_deep())
    assert list(t.index) == [0, 100, 200]
    assert list(t["rule"]) == ["differs", "agrees", "agrees"]
    assert t.loc[0, "in noise units"] == pytest.approx(1.0 / 0.15)
    assert t.loc[0, "|log sd ratio| in noise units"] == pytest.approx(np.log(3.0) / 0.1)


def test_deep_relu_reference_table_reads_the_summary():
    keys = ["nuts_rhat_max", "nuts_rhat_mean", "nuts_ess_min", "nuts_divergences", "nuts_mean_num_steps",
            "nuts_accept_rate", "nuts_draws_total", "reference_split_mean_abs_diff_mean",
            "reference_split_sd_ratio_median", "reference_split_band_coverage", "reference_noise_mad",
            "reference_noise_log_sd", "reference_noise_partitions", "sample_noise_mad", "sample_noise_log_sd",
            "sample_noise_n", "mh_faithful_accept_rate", "mh_deviation_accept_rate"]
    s = {k: float(i) for i, k in enumerate(keys)}
    del s["reference_split_band_coverage"]  # not computed by this run
    t = deep_relu.verdicts.reference(s)
    assert list(t.index)[0] == "NUTS predictive R-hat, max over x" and len(t) == len(keys)
    assert t.loc["NUTS bulk ESS, min over x", "value"] == keys.index("nuts_ess_min")
    assert np.isnan(t.loc["NUTS half vs half: band coverage", "value"])
    assert not any("_" in label for label in t.index)  # readable labels, no summary keys
    # Beside a shorter run: one column each, the same rows.
    short = {k: -v for k, v in s.items()}
    both = deep_relu.verdicts.reference(s, short)
    assert list(both.columns) == ["reference", "short run"] and list(both.index) == list(t.index)
    assert both["reference"].equals(t["value"].rename("reference"))
    assert both.loc["NUTS bulk ESS, min over x", "short run"] == -keys.index("nuts_ess_min")
