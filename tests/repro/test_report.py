"""bootens_core.repro.report: the verdict rules the book prints."""

from __future__ import annotations

import numpy as np
import pytest

from bootens_core.repro import report


def test_text_displays_as_itself():
    t = report.Text("reproduced")
    assert str(t) == repr(t) == t._repr_markdown_() == "reproduced"


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
    v = report.linear_verdicts({**LIN, **change})
    assert str(v["kl"]) == kl and str(v["map"]) == map_
    assert set(v) == {"kl", "map"}


def test_linear_deviation_is_named_from_the_summary():
    """The verdict names the deviation the summary ran, not a fixed text."""
    v = report.linear_verdicts({**LIN, "step_size": 0.05, "steps": 2000})
    assert str(v["kl"]) == "reproduced with a deviation (Adagrad h = 0.05, 2 000 steps)"


def test_linear_scaled_verdict():
    v = report.linear_verdicts(LIN, LIN_SCALED)["scaled"]
    assert str(v) == "does not reach the self-distance in 400 steps"
    assert v.margin == pytest.approx((7.3 - 6.75) / 0.25)
    assert "7.300" in v.evidence and "6.750" in v.evidence and "h = 0.01" in v.evidence
    assert not any(ch.isdigit() for ch in str(v).replace("400", ""))  # the text names no measured number
    v = report.linear_verdicts(LIN, {**LIN_SCALED, "paper_setting_kl_final": 6.5, "paper_setting_steps": 300})
    assert str(v["scaled"]) == "reaches the self-distance in 300 steps"
    assert v["scaled"].margin == pytest.approx(1.0)
    # The continued run, when there is one, goes to the evidence.
    cont = {**LIN_SCALED, "paper_setting_continued_steps": 2000,
            "paper_setting_continued_steps_to_self_distance_3sd": 665}
    assert "within the limit from step 665" in report.linear_verdicts(LIN, cont)["scaled"].evidence
    cont["paper_setting_continued_steps_to_self_distance_3sd"] = None
    assert "continued to 2000 steps: never within it" in report.linear_verdicts(LIN, cont)["scaled"].evidence


_TOY_KDE = {"kde_self_distance_sd": 0.1, "kde_self_distance_mean": 6.0, "kl_max_increase": 0.1, "rhat_max": 1.01,
            "rhat_iid_q99": 1.05, "kl_final_vs_exact": 6.1}


def _toy(**kw):
    s = dict(_TOY_KDE)
    s.update(kw)
    return {k: str(v) for k, v in report.toy_relu_verdicts(s).items()}


def _toy_hist(paper=None, small=None, **kw):
    """A summary with the histogram study: by default a KL that falls and then stays flat at both steps."""
    def step(h, **over):
        st = {"step_size": h, "net_all": -15.0, "net_all_se": 0.04, "net_late": 0.0, "net_late_se": 0.001,
              "rise_after_min": 0.0, "rise_after_min_se": 0.001, "kl_min_time": 0.3, "kl_final": 10.6,
              "kl_final_se": 0.04}
        st.update(over)
        return st

    h = {"repeats": 10, "particles": 10_000, "overshoot_time": 1.25, "bias_posterior": 0.004,
         "bias_posterior_se": 0.0006, "paper_step": step(0.05, **(paper or {})),
         "small_step": step(0.005, **(small or {}))}
    h.update(kw)
    return report.toy_relu_verdicts({**_TOY_KDE, "histogram": h})


def test_toy_relu_verdicts_follow_their_rules():
    v = _toy()
    assert v == {"kl_kde": "reproduced", "rhat": "reproduced", "posterior": "the exact posterior"}
    assert _toy(kl_max_increase=0.21)["kl_kde"].startswith("NOT")  # a rise above 2 sd of the estimator
    assert _toy(rhat_max=1.06)["rhat"].startswith("NOT")
    assert _toy(kl_final_vs_exact=6.3)["posterior"].startswith("NOT")


def test_toy_relu_histogram_rule_decreasing_flat_increasing():
    """Two-sided rule on difference / SE with limits ±4, per step size and window."""
    v = _toy_hist()  # falls from step 0, flat afterwards, no rise after the minimum
    assert str(v["kl"]) == "reproduced"
    assert str(v["paper_step_all"]) == "falls beyond its noise" and str(v["small_step_all"]) == "falls beyond its noise"
    assert str(v["paper_step_late"]) == "no change beyond its noise"
    assert str(v["small_step_min"]) == "no rise after its minimum beyond its noise"
    assert v["kl"].margin == pytest.approx(4.0)  # closest condition: t = 0 after the minimum, limit 4
    assert v["paper_step_all"].margin == pytest.approx(15 / 0.04 - 4)

    flat = _toy_hist(small={"net_all": 0.01, "net_all_se": 0.04})
    assert str(flat["small_step_all"]) == "no change beyond its noise"
    assert flat["small_step_all"].margin == pytest.approx(4 - 0.25)
    assert str(flat["kl"]) == "NOT reproduced (the KL does not fall beyond its noise)"

    up = _toy_hist(paper={"net_late": 0.05, "net_late_se": 0.01})
    assert str(up["paper_step_late"]) == "rises beyond its noise" and up["paper_step_late"].margin == pytest.approx(1)

    # Falls, then rises again after its minimum (t = 10): the paper's "strictly decreasing" does not hold.
    dip = _toy_hist(small={"rise_after_min": 0.01, "rise_after_min_se": 0.001})
    assert str(dip["small_step_min"]) == "rises again after its minimum, beyond its noise"
    assert str(dip["kl"]) == "NOT reproduced (the KL falls, then rises again beyond its noise)"
    assert dip["kl"].margin == pytest.approx(6.0)
    assert str(dip["paper_step_min"]).startswith("no rise")
    # A rise within the noise (t = 3) does not count.
    assert str(_toy_hist(small={"rise_after_min": 0.003, "rise_after_min_se": 0.001})["kl"]) == "reproduced"


def test_toy_relu_histogram_rule_without_noise():
    """After convergence no particle changes bin: the difference is exactly 0 with SE 0 -- no change, and no
    margin (there is no noise scale)."""
    v = _toy_hist(small={"net_late": 0.0, "net_late_se": 0.0})
    assert str(v["small_step_late"]) == "no change beyond its noise" and v["small_step_late"].margin is None


def test_toy_relu_histogram_verdict_texts_carry_no_number():
    import re

    for vs in (_toy_hist(), _toy_hist(small={"rise_after_min": 0.0114, "rise_after_min_se": 0.0013},
                                      paper={"net_late": 0.05, "net_late_se": 0.01})):
        for v in vs.values():
            assert not re.findall(r"\d", str(v)), str(v)
            assert v.evidence


def test_toy_relu_posterior_verdict_uses_the_histogram_floor():
    v = _toy_hist()
    assert str(v["posterior"]).startswith("NOT the exact posterior")
    close = _toy_hist(paper={"kl_final": 0.005, "kl_final_se": 0.001})
    assert str(close["posterior"]) == "the exact posterior"


def _deep(**kw):
    s = {"rhat_max": 1.05, "mean_abs_diff_mean": 0.2, "sd_ratio_median": 1.1, "reference_noise_mad": 0.15,
         "reference_noise_log_sd": 0.1, "agreement_steps": [0, 100, 200],
         "mean_abs_diff_mean_along": [1.0, 0.2, 0.2], "sd_ratio_median_along": [3.0, 1.1, 1.1]}
    return {**s, **kw}


def test_deep_relu_verdicts_follow_their_rules():
    v = report.deep_relu_verdicts(_deep())
    assert {k: str(x) for k, x in v.items()} == {
        "reference": "converged", "agreement": "reproduced", "along": "agrees at 2 of 3 recorded steps"}
    # Margin by hand: mean |Δmean| is (0.3 - 0.2) / 0.15 units inside its limit 2 x 0.15, |log 1.1| is
    # (0.2 - log 1.1) / 0.1 units inside 2 x 0.1; the closer one decides.
    assert v["agreement"].margin == pytest.approx(min(0.1 / 0.15, (0.2 - np.log(1.1)) / 0.1))
    assert str(report.deep_relu_verdicts(_deep(rhat_max=1.2))["reference"]).startswith("NOT")
    # Two-sided: too wide and too narrow both fail.
    assert str(report.deep_relu_verdicts(_deep(sd_ratio_median=1.3))["agreement"]) == "NOT reproduced"
    assert str(report.deep_relu_verdicts(_deep(sd_ratio_median=1 / 1.3))["agreement"]) == "NOT reproduced"
    assert str(report.deep_relu_verdicts(_deep(mean_abs_diff_mean=0.31))["agreement"]) == "NOT reproduced"
    every = _deep(mean_abs_diff_mean_along=[0.1] * 3, sd_ratio_median_along=[1.0] * 3)
    assert str(report.deep_relu_verdicts(every)["along"]) == "agrees at every recorded step"
    none = _deep(mean_abs_diff_mean_along=[1.0] * 3)
    assert str(report.deep_relu_verdicts(none)["along"]) == "agrees at no recorded step"


def test_deep_relu_verdict_is_inconclusive_without_a_converged_reference():
    """Whatever the statistics say, a reference with R-hat >= 1.1 gives no agreement verdict."""
    for kw in ({}, {"sd_ratio_median": 3.0}):
        v = report.deep_relu_verdicts(_deep(rhat_max=1.1, **kw))
        assert str(v["agreement"]) == "inconclusive (reference not converged)"
        assert str(v["along"]) == "inconclusive (reference not converged)"
        assert v["agreement"].margin is None
    assert "the rule alone: differs" in report.deep_relu_verdicts(_deep(rhat_max=1.3, sd_ratio_median=3.0))[
        "agreement"].evidence


def test_deep_relu_along_table():
    t = report.deep_relu_along(_deep())
    assert list(t.index) == [0, 100, 200]
    assert list(t["rule"]) == ["differs", "agrees", "agrees"]
    assert t.loc[0, "in noise units"] == pytest.approx(1.0 / 0.15)
    assert t.loc[0, "|log sd ratio| in noise units"] == pytest.approx(np.log(3.0) / 0.1)


def test_theory_verdicts_follow_their_rules():
    s = {"lemma1_z_paper_abs_max": 100.0, "lemma1_z_corrected_abs_max": 1.0,
         "linear": {"max_z_vs_exact_kl_rate": 2.0, "theorem1_max_z_vs_exact_kl_rate": 50.0,
                    "frac_steps_kl_decreasing_exact": 1.0},
         "relu": {"frac_steps_theorem2_corrected_holds": 1.0}, "tanh": {"frac_steps_theorem2_corrected_holds": 0.25}}
    v = {k: str(x) for k, x in report.theory_verdicts(s).items()}
    assert v["lemma1"].startswith("sign error")
    assert v["linear_rate"] == "matches the exact rate"
    assert v["theorem1_linear"].startswith("is NOT")
    assert v["theorem2"].startswith("its proof does NOT hold") and "holds for the linear model (exact" in v["theorem2"]
    t2 = report.theory_verdicts(s)["theorem2"]
    assert "100% (relu), 25% (tanh)" in t2.evidence and t2.margin == pytest.approx(3.0)
    s["linear"]["frac_steps_kl_decreasing_exact"] = 0.9
    assert "only at some steps" in str(report.theory_verdicts(s)["theorem2"])
    s["linear"]["theorem1_max_z_vs_exact_kl_rate"] = 2.0
    assert str(report.theory_verdicts(s)["theorem1_linear"]) == "matches the KL rate"
    s["lemma1_z_corrected_abs_max"] = 6.0
    assert str(report.theory_verdicts(s)["lemma1"]) == "not settled"
    assert str(report.theory_verdicts(s)["theorem2"]) == "not settled"


# ------------------------------------------------------------------------------------------ classification


class _FakeResult:
    def __init__(self, summary, arrays):
        self.summary, self.arrays = summary, arrays

    def __getitem__(self, k):
        return self.arrays[k]


def test_classification_paired_verdicts_follow_the_t_test():
    from scipy import stats

    # differences of MNLL over 4 splits: mean -0.1, sd 0.01 -> far beyond t * se: better
    base = np.array([[0.9, 0.3, 0.05]] * 4)
    boot = base.copy()
    boot[:, 1] -= np.array([0.09, 0.1, 0.11, 0.1])
    boot[:, 2] += np.array([0.01, -0.01, 0.02, -0.015])  # ECE: noise around zero
    boot[:, 0] += np.array([-0.02, -0.021, -0.019, -0.02])  # accuracy drops: worse
    res = _FakeResult({"real": {"d": {}}}, {"d_bootstrap_metrics": boot, "d_plain_metrics": base})
    df = report.classification_paired(res, "plain")
    assert df.loc[("d", "MNLL"), "bootstrap is"] == "better"
    assert df.loc[("d", "accuracy"), "bootstrap is"] == "worse"
    d = boot[:, 2] - base[:, 2]
    assert abs(d.mean()) < stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert df.loc[("d", "ECE"), "bootstrap is"] == "no clear difference"
    # a dataset's name as a reader reads it, the baseline named as the chapter names it
    res = _FakeResult({"real": {"breast_cancer": {}}},
                      {"breast_cancer_bootstrap_metrics": boot, "breast_cancer_mcd_metrics": base})
    df = report.classification_paired(res, "mcd")
    assert list(df.index.get_level_values(0).unique()) == ["breast cancer"]
    assert "bootstrap − MC dropout" in df.columns
    # accuracy: mean -0.020, SE 0.00041; MNLL: mean -0.100, SE 0.0041 (by hand)
    assert str(report.classification_buys(res, "mcd")) == (
        "breast cancer (4 splits): worse accuracy (-0.020 ± 0.000); better MNLL (-0.100 ± 0.004).")


def test_classification_verdict_rule():
    s = {"rhat_max": 1.02, "band_coverage_vs_mcmc": 0.81}
    assert str(report.classification_verdicts(s)["agreement"]) == "reproduced"
    assert str(report.classification_verdicts(s)["reference"]) == "converged"
    s = {"rhat_max": 1.3, "band_coverage_vs_mcmc": 0.79}
    assert str(report.classification_verdicts(s)["agreement"]) == "NOT reproduced"
    assert "NOT converged" in str(report.classification_verdicts(s)["reference"])


# ------------------------------------------------------------------------------------------ verdict margins


def test_verdict_is_text_with_evidence_and_margin():
    v = report.Verdict("reproduced", "x = 1", 2.5)
    assert str(v) == repr(v) == "reproduced" and v.evidence == "x = 1" and v.margin == 2.5
    table = report.verdict_table({"a": v, "b": report.Verdict("NOT reproduced")}, {"a": "claim A"})
    assert list(table.index) == ["claim A", "b"]
    assert table.loc["claim A", "margin (noise units)"] == "2.5" and table.loc["b", "margin (noise units)"] == "—"


def test_linear_margin_counts_both_comparisons():
    from scipy import stats

    # kl_final 6.1 against 6.0 + 3 * 0.25 = 6.75: 2.6 sd below; the paper setting is far above.
    v = report.linear_verdicts(LIN)
    assert v["kl"].margin == pytest.approx((6.75 - 6.1) / 0.25)
    # |z| = 0.3 and 0.2 are 3.7 and 3.8 from their limit 4; the chi-square p = 0.5 (z = 0) is 3.09 from
    # the z of its limit 0.001: the closest.
    assert v["map"].margin == pytest.approx(stats.norm.isf(1e-3))
    v = report.linear_verdicts({**LIN, "paper_setting_kl_final": 6.7})
    assert str(v["kl"]) == "reproduced" and v["kl"].margin == pytest.approx(0.05 / 0.25)


def test_theory_margins_in_z_units():
    s = {"lemma1_z_paper_abs_max": 100.0, "lemma1_z_corrected_abs_max": 1.0,
         "linear": {"max_z_vs_exact_kl_rate": 2.0, "theorem1_max_z_vs_exact_kl_rate": 50.0,
                    "frac_steps_kl_decreasing_exact": 1.0}}
    v = report.theory_verdicts(s)
    assert v["lemma1"].margin == pytest.approx(3.0)  # the corrected identity: 1 against 4
    assert v["linear_rate"].margin == pytest.approx(2.0)
    assert v["theorem1_linear"].margin == pytest.approx(45.0)
    s["linear"]["theorem1_max_z_vs_exact_kl_rate"] = 4.6  # between the two thresholds: not settled
    v = report.theory_verdicts(s)["theorem1_linear"]
    assert str(v) == "not settled" and v.margin == pytest.approx(0.4)


def test_toy_relu_rhat_margin_uses_the_iid_noise_scale():
    s = {"kde_self_distance_sd": 0.1, "kde_self_distance_mean": 6.0, "kl_max_increase": 0.1, "rhat_max": 1.02,
         "rhat_iid_q99": 1.06, "kl_final_vs_exact": 6.1}
    v = report.toy_relu_verdicts(s)
    assert v["rhat"].margin == pytest.approx(0.04 / (0.06 / 2.326))
    assert v["kl_kde"].margin == pytest.approx(1.0) and v["posterior"].margin == pytest.approx(1.0)


@pytest.mark.parametrize("fn, s", [
    (report.toy_relu_verdicts, {"kde_self_distance_sd": 0.11, "kde_self_distance_mean": 6.9, "kl_max_increase": 1.0012,
                                "rhat_max": 1.0234, "rhat_iid_q99": 1.0612, "kl_final_vs_exact": 12.94}),
    (report.deep_relu_verdicts, {"rhat_max": 1.3097, "mean_abs_diff_mean": 0.3712, "sd_ratio_median": 1.308,
                                 "reference_noise_mad": 0.1698, "reference_noise_log_sd": 0.0211}),
    (report.deep_relu_verdicts, {"rhat_max": 1.0512, "mean_abs_diff_mean": 0.3712, "sd_ratio_median": 1.308,
                                 "reference_noise_mad": 0.1698, "reference_noise_log_sd": 0.0211}),
    (report.classification_verdicts, {"rhat_max": 1.2345, "band_coverage_vs_mcmc": 0.353}),
])
def test_verdict_texts_carry_no_measured_number(fn, s):
    """A checked notebook output prints the verdict text: a measured number there would move with rounding."""
    import re

    for name, v in fn(s).items():
        measured = {f"{x:.{d}f}" for x in s.values() for d in (1, 2, 3) if x not in (1.1, 0.8)}
        found = set(re.findall(r"\d+\.\d+", str(v))) & measured
        assert not found, (name, str(v))
        assert v.evidence, name  # ... the numbers are in the evidence instead


def test_provenance_block_is_collapsed_and_complete():
    prov = {"device": {"kind": "NVIDIA H100", "count": 1}, "finished_utc": "2026-11-23T11:30:16Z",
            "git_commit": "f4cc185d3b6ac5829f2a7fc9b731166458a7720e", "versions": {"jax": "0.10.2"},
            "wall_time_s": 3941.26, "note": "<b>"}
    block = report.Provenance(prov, "paper-scale record")
    assert repr(block) == "Provenance of the paper-scale record: NVIDIA H100, 2026-11-23, commit f4cc185"
    page = block._repr_html_()
    assert page.startswith("<details") and page.count("<details") == 1 and "open" not in page
    assert "<summary>Provenance of the paper-scale record: NVIDIA H100, 2026-11-23, commit f4cc185</summary>" in page
    assert "<th style='text-align:left'>versions: jax</th><td>0.10.2</td>" in page
    assert "<th style='text-align:left'>device: kind</th><td>NVIDIA H100</td>" in page
    assert "<th style='text-align:left'>finished (UTC)</th>" in page and "<th style='text-align:left'>git commit</th>" in page
    assert "<th style='text-align:left'>wall time (s)</th><td>3941.3</td>" in page  # seconds to 0.1 s
    assert "<td>&lt;b&gt;</td>" in page  # text escaped
    assert repr(report.Provenance({}, "x")) == "Provenance of the x: device not recorded"
    with pytest.raises(TypeError, match="provenance mapping"):
        report.Provenance("cpu", "x")


def test_deep_relu_reference_table_reads_the_summary():
    keys = ["nuts_rhat_max", "nuts_rhat_mean", "nuts_ess_min", "nuts_divergences", "nuts_mean_num_steps",
            "nuts_accept_rate", "nuts_draws_total", "reference_split_mean_abs_diff_mean",
            "reference_split_sd_ratio_median", "reference_split_band_coverage", "reference_noise_mad",
            "reference_noise_log_sd", "reference_noise_partitions", "mh_faithful_accept_rate",
            "mh_deviation_accept_rate"]
    s = {k: float(i) for i, k in enumerate(keys)}
    del s["reference_split_band_coverage"]  # not computed by this run
    t = report.deep_relu_reference(s)
    assert list(t.index)[0] == "NUTS predictive R-hat, max over x" and len(t) == len(keys)
    assert t.loc["NUTS bulk ESS, min over x", "value"] == keys.index("nuts_ess_min")
    assert np.isnan(t.loc["NUTS half vs half: band coverage", "value"])
    assert not any("_" in label for label in t.index)  # readable labels, no summary keys
