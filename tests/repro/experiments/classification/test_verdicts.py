"""experiments.classification.verdicts: the rules that turn the run's summary into verdicts, and its tables."""

from __future__ import annotations

import numpy as np

from bootens_core.repro.experiments import classification


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
    df = classification.verdicts.paired(res, "plain")
    assert df.loc[("d", "MNLL"), "bootstrap is"] == "better"
    assert df.loc[("d", "accuracy"), "bootstrap is"] == "worse"
    d = boot[:, 2] - base[:, 2]
    assert abs(d.mean()) < stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert df.loc[("d", "ECE"), "bootstrap is"] == "no clear difference"
    # a dataset's name as a reader reads it, the baseline named as the chapter names it
    res = _FakeResult({"real": {"breast_cancer": {}}},
                      {"breast_cancer_bootstrap_metrics": boot, "breast_cancer_mcd_metrics": base})
    df = classification.verdicts.paired(res, "mcd")
    assert list(df.index.get_level_values(0).unique()) == ["breast cancer"]
    assert "bootstrap − MC dropout" in df.columns
    # accuracy: mean -0.020, SE 0.00041; MNLL: mean -0.100, SE 0.0041 (by hand)
    assert str(classification.verdicts.buys(res, "mcd")) == (
        "breast cancer (4 splits): worse accuracy (-0.020 ± 0.000); better MNLL (-0.100 ± 0.004).")


def test_classification_verdict_rule():
    s = {"rhat_max": 1.02, "band_coverage_vs_mcmc": 0.81}
    assert str(classification.verdicts.evaluate(s)["agreement"]) == "reproduced"
    assert str(classification.verdicts.evaluate(s)["reference"]) == "converged"
    s = {"rhat_max": 1.3, "band_coverage_vs_mcmc": 0.79}
    assert str(classification.verdicts.evaluate(s)["agreement"]) == "NOT reproduced"
    assert "NOT converged" in str(classification.verdicts.evaluate(s)["reference"])
