"""experiments.theory.verdicts: the rules that turn the run's summary into verdicts, and its tables."""

from __future__ import annotations

import pytest

from bootens_core.repro.experiments import theory


def test_theory_verdicts_follow_their_rules():
    s = {"lemma1_z_paper_abs_max": 100.0, "lemma1_z_corrected_abs_max": 1.0,
         "linear": {"max_z_vs_exact_kl_rate": 2.0, "theorem1_max_z_vs_exact_kl_rate": 50.0,
                    "frac_steps_kl_decreasing_exact": 1.0},
         "relu": {"frac_steps_theorem2_corrected_holds": 1.0}, "tanh": {"frac_steps_theorem2_corrected_holds": 0.25}}
    v = {k: str(x) for k, x in theory.verdicts.evaluate(s).items()}
    assert v["lemma1"].startswith("sign error")
    assert v["linear_rate"] == "matches the exact rate"
    assert v["theorem1_linear"].startswith("is NOT")
    assert v["theorem2"].startswith("its proof does NOT hold") and "holds for the linear model (exact" in v["theorem2"]
    t2 = theory.verdicts.evaluate(s)["theorem2"]
    assert "100% (relu), 25% (tanh)" in t2.evidence and t2.margin == pytest.approx(3.0)
    s["linear"]["frac_steps_kl_decreasing_exact"] = 0.9
    assert "only at some steps" in str(theory.verdicts.evaluate(s)["theorem2"])
    s["linear"]["theorem1_max_z_vs_exact_kl_rate"] = 2.0
    assert str(theory.verdicts.evaluate(s)["theorem1_linear"]) == "matches the KL rate"
    s["lemma1_z_corrected_abs_max"] = 6.0
    assert str(theory.verdicts.evaluate(s)["lemma1"]) == "not settled"
    assert str(theory.verdicts.evaluate(s)["theorem2"]) == "not settled"


def test_theory_margins_in_z_units():
    s = {"lemma1_z_paper_abs_max": 100.0, "lemma1_z_corrected_abs_max": 1.0,
         "linear": {"max_z_vs_exact_kl_rate": 2.0, "theorem1_max_z_vs_exact_kl_rate": 50.0,
                    "frac_steps_kl_decreasing_exact": 1.0}}
    v = theory.verdicts.evaluate(s)
    assert v["lemma1"].margin == pytest.approx(3.0)  # the corrected identity: 1 against 4
    assert v["linear_rate"].margin == pytest.approx(2.0)
    assert v["theorem1_linear"].margin == pytest.approx(45.0)
    s["linear"]["theorem1_max_z_vs_exact_kl_rate"] = 4.6  # between the two thresholds: not settled
    v = theory.verdicts.evaluate(s)["theorem1_linear"]
    assert str(v) == "not settled" and v.margin == pytest.approx(0.4)
