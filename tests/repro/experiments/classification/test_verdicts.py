"""experiments.classification.verdicts: the rules that turn the run's summary into verdicts, and its tables."""

from __future__ import annotations

import numpy as np
import pytest

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
    assert str(classification.verdicts.buys(res, "mcd", others=("mcd",))) == (
        "breast cancer (4 splits): worse accuracy (-0.020 ± 0.000); better MNLL (-0.100 ± 0.004).")


def test_paired_verdicts_are_holm_corrected_over_the_whole_table():
    """A difference significant on its own (p about 0.01) is no longer significant among 18 tests (Holm's
    smallest threshold 0.05/18 = 0.0028); one with p far below that stays; the per-test p-value is shown."""
    from scipy import stats

    base = np.array([[0.9, 0.3, 0.05]] * 4)
    # MNLL: mean -0.1, sd 0.001 -> t ~ 200, p ~ 3e-7; ECE: mean 0.01 with sd chosen for p ~ 0.01
    boot = base.copy()
    boot[:, 1] -= np.array([0.099, 0.1, 0.101, 0.1])
    e = np.array([0.007, 0.013, 0.007, 0.013])
    boot[:, 2] += e
    p_ece = 2 * stats.t.sf(e.mean() / (e.std(ddof=1) / 2), 3)
    assert 0.0028 < p_ece < 0.05
    arrays = {"d_bootstrap_metrics": boot}
    for other in ("plain", "mcd", "deep"):
        arrays[f"d_{other}_metrics"] = base
    res = _FakeResult({"real": {"d": {}, "e": {}}}, {**arrays, **{k.replace("d_", "e_", 1): v
                                                                for k, v in arrays.items()}})
    alone = classification.verdicts.paired(res, "plain")  # 6 tests: 0.05/6 = 0.0083 < p_ece
    assert alone.loc[("d", "ECE"), "p"] == pytest.approx(p_ece)
    table = classification.verdicts.paired_all(res)
    assert len(table) == 18  # 3 opponents x 2 datasets x 3 metrics
    assert list(table.columns) == ["bootstrap − other", "std. error", "splits", "p", "bootstrap is"]
    assert (table.xs("ECE", level="metric")["bootstrap is"] == "no clear difference").all()
    assert (table.xs("MNLL", level="metric")["bootstrap is"] == "better").all()
    # identical accuracies on every split: no difference, p = 1
    assert (table.xs("accuracy", level="metric")["p"] == 1.0).all()
    # uncorrected, the ECE difference would count: the correction is what removes it
    assert classification.verdicts.holm([p_ece], 0.05) == [True]
    assert classification.verdicts.holm([p_ece] + [0.5] * 17, 0.05) == [False] + [False] * 17


def test_holm_by_hand():
    holm = classification.verdicts.holm
    # m = 4: thresholds 0.0125, 0.0167, 0.025, 0.05 for the sorted p-values
    assert holm([0.01, 0.04, 0.012, 0.03]) == [True, False, True, False]
    assert holm([0.01, 0.015, 0.024, 0.04]) == [True, True, True, True]
    assert holm([0.01, 0.02, 0.024, 0.04]) == [True, False, False, False]  # 0.02 > 0.05/3 stops it
    assert holm([0.03, 0.001]) == [True, True] and holm([0.06, 0.001]) == [False, True]
    assert holm([float("nan"), 0.04]) == [False, True]  # a NaN is neither rejected nor counted


def _cls(**kw):
    s = {"rhat_max": 1.01, "ess_bulk_min": 900.0, "prob_mad_vs_mcmc": 0.008, "width_ratio_vs_mcmc": 1.02,
         "reference_noise_prob_mad": 0.005, "reference_noise_log_width": 0.03}
    return {**s, **kw}


def test_classification_agreement_rule_is_two_sided():
    """The rule of the deep-ReLU chapter's form: a matching band passes; a band too wide, a band too narrow
    and a shifted mean each fail, in units of NUTS's half-vs-half noise."""
    ev = classification.verdicts.evaluate
    v = ev(_cls())
    assert str(v["reference"]) == "converged" and str(v["agreement"]) == "reproduced"
    # margin by hand: the gap is (0.01 - 0.008)/0.005 units inside 2 x 0.005, |log 1.02| (0.06 - 0.0198)/0.03
    assert v["agreement"].margin == pytest.approx(min(0.002 / 0.005, (0.06 - np.log(1.02)) / 0.03))
    # an over-wide band covers all of NUTS's band, which the old one-sided rule passed: it fails now
    assert str(ev(_cls(width_ratio_vs_mcmc=1.5))["agreement"]) == "NOT reproduced"
    assert str(ev(_cls(width_ratio_vs_mcmc=1 / 1.5))["agreement"]) == "NOT reproduced"  # too narrow
    assert str(ev(_cls(prob_mad_vs_mcmc=0.011))["agreement"]) == "NOT reproduced"  # shifted mean
    assert str(ev(_cls(width_ratio_vs_mcmc=0.0))["agreement"]) == "NOT reproduced"  # no band at all
    # the same limits as the deep-ReLU chapter's rule
    from bootens_core.repro.experiments import deep_relu
    assert classification.verdicts.T_LIMIT == deep_relu.verdicts.T_LIMIT
    assert classification.verdicts.RHAT_LIMIT == deep_relu.verdicts.RHAT_LIMIT


def test_classification_agreement_rule_on_real_bands():
    """The rule on probabilities: a sample of the reference's own law agrees; the same law widened about its
    mean, narrowed, or shifted by a tenth in probability does not."""
    from bootens_core.repro.experiments.classification import experiment

    rng = np.random.default_rng(0)
    x = np.linspace(-3, 3, 41)
    def draws(n, scale=1.0, shift=0.0):
        z = np.sin(x)[None] + shift + scale * 0.6 * rng.standard_normal((n, 1)) * (1 + 0.3 * np.cos(x))[None]
        return 1 / (1 + np.exp(-z))
    ref = draws(4000).reshape(4, 1000, -1)
    noise = experiment.reference_noise(ref)
    assert noise["partitions"] == 3
    flat = ref.reshape(-1, x.size)

    def verdict(q):
        a = experiment.agreement(q, flat)
        s = _cls(prob_mad_vs_mcmc=a["prob_mad"], width_ratio_vs_mcmc=a["width_ratio"],
                 reference_noise_prob_mad=noise["prob_mad"], reference_noise_log_width=noise["log_width"])
        return str(classification.verdicts.evaluate(s)["agreement"]), a

    ok, a = verdict(draws(4000))
    assert ok == "reproduced"
    wide, a = verdict(draws(4000, scale=1.5))
    # it covers NUTS's band: the old one-sided rule passed it
    assert wide == "NOT reproduced" and a["band_coverage"] > 0.99
    assert verdict(draws(4000, scale=0.6))[0] == "NOT reproduced"
    assert verdict(draws(4000, shift=0.5))[0] == "NOT reproduced"


def test_classification_agreement_is_not_assessed_without_a_converged_reference():
    for kw in ({"rhat_max": 1.1}, {"ess_bulk_min": 50.0}):
        for bad in ({}, {"width_ratio_vs_mcmc": 2.0}):
            v = classification.verdicts.evaluate(_cls(**kw, **bad))
            assert str(v["reference"]).startswith("NOT converged")
            assert str(v["agreement"]) == "not assessed: the reference has not converged"
            assert v["agreement"].margin is None


def test_classification_rule_judges_a_small_ensemble_in_the_noise_of_its_own_size():
    """200 classifiers drawn from the reference's own law, against a reference of 4000 draws: in the
    reference's half-vs-half units (2000 draws against 2000) the rule calls most such samples different,
    although they are samples of the same law; in the noise of 200 reference draws against the rest
    (sample_noise, the unit when the run has it) it calls most of them agreeing. Here every draw is one random
    shift of a curve, so the mean gap over the grid is close to a half-normal, which exceeds twice its mean
    about 11% of the time; with |log width ratio| (about 5%) the rule's size is near 15% (rule_size measures
    it), so at least 15 of 20 independent samples agree, and at most 10 in half-vs-half units."""
    from bootens_core.repro.experiments.classification import experiment

    rng = np.random.default_rng(5)
    x = np.linspace(-3, 3, 41)

    def draws(n):
        z = np.sin(x)[None] + 0.6 * rng.standard_normal((n, 1)) * (1 + 0.3 * np.cos(x))[None]
        return 1 / (1 + np.exp(-z))

    ref = draws(4000).reshape(4, 1000, -1)
    flat = ref.reshape(-1, x.size)
    half = experiment.reference_noise(ref)
    sample = experiment.sample_noise(ref, 200)
    assert sample["n"] == 200 and sample["repeats"] == 256
    assert sample["prob_mad"] > 1.5 * half["prob_mad"]  # the ensemble's own sampling noise dominates
    base = _cls(reference_noise_prob_mad=half["prob_mad"], reference_noise_log_width=half["log_width"],
                reference_noise_partitions=half["partitions"])
    with_sample = {**base, "sample_noise_prob_mad": sample["prob_mad"], "sample_noise_log_width":
                   sample["log_width"], "sample_noise_n": 200, "sample_noise_repeats": 256}
    assert classification.verdicts.noise_units(with_sample)[:2] == (sample["prob_mad"], sample["log_width"])
    assert "half of NUTS's chains" in classification.verdicts.noise_units(base)[2]
    agree_half = agree_sample = 0
    for _ in range(20):
        a = experiment.agreement(draws(200), flat)
        stats = {"prob_mad_vs_mcmc": a["prob_mad"], "width_ratio_vs_mcmc": a["width_ratio"]}
        agree_half += str(classification.verdicts.evaluate({**base, **stats})["agreement"]) == "reproduced"
        agree_sample += str(classification.verdicts.evaluate({**with_sample, **stats})["agreement"]) == "reproduced"
    assert agree_sample >= 15 and agree_half <= 10
    size = classification.verdicts.rule_size(ref, 200, repeats=400)
    assert 0.05 < size["either"] < 0.3 and size["repeats"] == 400
    assert abs(size["prob_mad"] - 0.11) < 0.06  # the half-normal's P(|Z| > 2 E|Z|) = 0.110
