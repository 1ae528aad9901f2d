"""experiments.toy_relu.verdicts: the rules that turn the run's summary into verdicts, and its tables."""

from __future__ import annotations

import pytest

from bootens_core.repro.experiments import toy_relu


_TOY_KDE = {"kde_self_distance_sd": 0.1, "kde_self_distance_mean": 6.0, "kl_max_increase": 0.1, "rhat_max": 1.01,
            "rhat_iid_q99": 1.05, "kl_final_vs_exact": 6.1}


def _toy(**kw):
    s = dict(_TOY_KDE)
    s.update(kw)
    return {k: str(v) for k, v in toy_relu.verdicts.evaluate(s).items()}


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
    return toy_relu.verdicts.evaluate({**_TOY_KDE, "histogram": h})


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


def test_toy_relu_rhat_margin_uses_the_iid_noise_scale():
    s = {"kde_self_distance_sd": 0.1, "kde_self_distance_mean": 6.0, "kl_max_increase": 0.1, "rhat_max": 1.02,
         "rhat_iid_q99": 1.06, "kl_final_vs_exact": 6.1}
    v = toy_relu.verdicts.evaluate(s)
    assert v["rhat"].margin == pytest.approx(0.04 / (0.06 / 2.326))
    assert v["kl_kde"].margin == pytest.approx(1.0) and v["posterior"].margin == pytest.approx(1.0)
