"""bootens_core.report: the verdict rules the book prints."""

from __future__ import annotations

import numpy as np
import pytest

from bootens_core import report

K = 200
UNI_OK = {
    "mean_error_sd": 0.05,
    "mean_error_sd_mc_scale": 1 / np.sqrt(K),
    "sd_ratio": 1.02,
    "sd_ratio_mc_scale": 1 / np.sqrt(2 * (K - 1)),
    "ks_pvalue": 0.4,
}


def test_text_displays_as_itself():
    t = report.Text("reproduced")
    assert str(t) == repr(t) == t._repr_markdown_() == "reproduced"


def test_univariate_reproduced():
    assert str(report.univariate_verdict(UNI_OK)) == "reproduced"


@pytest.mark.parametrize(
    "change",
    [
        {"mean_error_sd": 4.01 / np.sqrt(K)},
        {"sd_ratio": 1 + 4.01 / np.sqrt(2 * (K - 1))},
        {"sd_ratio": 1 - 4.01 / np.sqrt(2 * (K - 1))},
        {"ks_pvalue": 9e-4},
    ],
)
def test_univariate_not_reproduced(change):
    assert str(report.univariate_verdict({**UNI_OK, **change})) == "NOT reproduced"


LIN = {
    "kl_final": 6.1,
    "paper_setting_kl_final": 494.0,
    "self_distance_mean": 6.0,
    "self_distance_sd": 0.25,
    "map_cov_z": 0.3,
    "map_subspace_kl_z": -0.2,
    "map_mean_chi2_pvalue": 0.5,
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


def _toy(**kw):
    s = {"kde_self_distance_sd": 0.1, "kde_self_distance_mean": 6.0, "kl_max_increase": 0.1, "rhat_max": 1.01,
         "rhat_iid_q99": 1.05, "kl_final_vs_exact": 6.1}
    s.update(kw)
    return {k: str(v) for k, v in report.toy_relu_verdicts(s).items()}


def test_toy_relu_verdicts_follow_their_rules():
    v = _toy()
    assert v == {"kl": "reproduced", "rhat": "reproduced", "posterior": "the exact posterior"}
    assert _toy(kl_max_increase=0.21)["kl"].startswith("NOT")  # a rise above 2 sd of the estimator
    assert _toy(rhat_max=1.06)["rhat"].startswith("NOT")
    assert _toy(kl_final_vs_exact=6.3)["posterior"].startswith("NOT")


def test_deep_relu_verdicts_follow_their_rules():
    ok = {"rhat_max": 1.05, "band_coverage": 0.9, "sd_ratio_median": 1.3}
    assert {k: str(v) for k, v in report.deep_relu_verdicts(ok).items()} == {
        "reference": "converged", "agreement": "reproduced"}
    assert str(report.deep_relu_verdicts({**ok, "rhat_max": 1.2})["reference"]).startswith("NOT")
    assert str(report.deep_relu_verdicts({**ok, "sd_ratio_median": 2.5})["agreement"]).startswith("NOT")
    assert str(report.deep_relu_verdicts({**ok, "band_coverage": 0.7})["agreement"]).startswith("NOT")


def test_theory_verdicts_follow_their_rules():
    s = {"lemma1_z_paper_abs_max": 100.0, "lemma1_z_corrected_abs_max": 1.0,
         "linear": {"max_z_vs_exact_kl_rate": 2.0, "theorem1_max_z_vs_exact_kl_rate": 50.0}}
    v = {k: str(x) for k, x in report.theory_verdicts(s).items()}
    assert v["lemma1"].startswith("sign error")
    assert v["linear_rate"] == "matches the exact rate"
    assert v["theorem1_linear"].startswith("is NOT")
    s["linear"]["theorem1_max_z_vs_exact_kl_rate"] = 2.0
    assert str(report.theory_verdicts(s)["theorem1_linear"]) == "matches the KL rate"
    s["lemma1_z_corrected_abs_max"] = 6.0
    assert str(report.theory_verdicts(s)["lemma1"]) == "not settled"


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


def test_classification_verdict_rule():
    s = {"rhat_max": 1.02, "band_coverage_vs_mcmc": 0.81}
    assert str(report.classification_verdicts(s)["agreement"]) == "reproduced"
    assert str(report.classification_verdicts(s)["reference"]) == "converged"
    s = {"rhat_max": 1.3, "band_coverage_vs_mcmc": 0.79}
    assert str(report.classification_verdicts(s)["agreement"]) == "NOT reproduced"
    assert "NOT converged" in str(report.classification_verdicts(s)["reference"])
