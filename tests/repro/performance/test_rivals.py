"""The estimator benchmark's scores against closed forms, its verdict rule on cases it must accept and
reject, and one small run end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from bootens_core.repro.performance import rivals


def test_one_component_mixture_scores_as_the_gaussian():
    rng = np.random.default_rng(0)
    y, mean = rng.normal(size=300), rng.normal(size=300)
    sd = 0.7
    mix = rivals.score_mixture(y, mean[None], sd**2)
    gauss = rivals.score_gaussian(y, mean, np.full(300, sd))
    assert mix.nll == pytest.approx(-np.mean(stats.norm.logpdf(y, mean, sd)), rel=1e-12)
    assert mix.nll == pytest.approx(gauss.nll, rel=1e-12)
    assert mix.rmse == pytest.approx(gauss.rmse) == pytest.approx(np.sqrt(np.mean((y - mean) ** 2)))
    assert mix.coverage90 == gauss.coverage90 == np.mean(np.abs(y - mean) <= stats.norm.ppf(0.95) * sd)
    assert math.isnan(mix.far_coverage90) and math.isnan(gauss.far_coverage90)


def test_mixture_coverage_is_that_of_the_central_90_percent_interval():
    f = np.array([[-1.0, 0.0, 3.0], [1.0, 0.5, 3.0]])
    cdf = lambda v: stats.norm.cdf((v - f) / 0.5).mean(0)  # noqa: E731
    lo = np.array([_solve(lambda v, j=j: cdf(np.full(3, v))[j] - 0.05) for j in range(3)])
    hi = np.array([_solve(lambda v, j=j: cdf(np.full(3, v))[j] - 0.95) for j in range(3)])
    y = np.array([lo[0] - 1e-6, lo[1] + 1e-6, hi[2] + 1e-6])  # outside, inside, outside
    assert rivals.score_mixture(y, f, 0.25).coverage90 == pytest.approx(1 / 3)


def _solve(g):
    from scipy.optimize import brentq

    return brentq(g, -20.0, 20.0, xtol=1e-12)


def test_far_coverage_counts_the_truth_inside_the_functions_interval():
    particles = np.tile(np.linspace(-1, 1, 101)[:, None], (1, 4))  # the same spread at 4 points
    truth = np.array([0.0, 0.89, 0.91, -2.0])  # the 5-95% quantiles are -0.9 and 0.9
    sc = rivals.score_mixture(np.zeros(1), np.zeros((101, 1)), 1.0, particles, truth)
    assert sc.far_coverage90 == pytest.approx(0.5)
    g = rivals.score_gaussian(np.zeros(1), np.zeros(1), np.ones(1), np.zeros(4), np.ones(4), truth * 1.645 / 0.9)
    assert g.far_coverage90 == pytest.approx(0.5)


def _rows(ours, gp, cov=0.9):
    return ([{"problem": "p", "method": "bootstrap", "split": s, "nll": v, "coverage90": cov, "far_coverage90": 0.5}
             for s, v in enumerate(ours)]
            + [{"problem": "p", "method": "gp", "split": s, "nll": v, "coverage90": 0.9, "far_coverage90": 0.9}
               for s, v in enumerate(gp)])


def test_verdict_matches_within_one_standard_error_and_not_beyond():
    gp = [1.0, 1.2, 0.8, 1.1, 0.9]
    within = rivals.verdicts(_rows([g + d for g, d in zip(gp, [0.05, -0.05, 0.1, 0.0, 0.02])], gp))[0]
    d = np.array([0.05, -0.05, 0.1, 0.0, 0.02])
    assert within["nll_minus_gp"] == pytest.approx(d.mean())
    assert within["nll_minus_gp_se"] == pytest.approx(d.std(ddof=1) / math.sqrt(5))
    assert within["nll_matches_gp"]  # 0.024 <= SE 0.026
    worse = rivals.verdicts(_rows([g + 0.3 + 0.01 * s for s, g in enumerate(gp)], gp))[0]
    assert not worse["nll_matches_gp"]
    better = rivals.verdicts(_rows([g - 0.5 for g in gp], gp))[0]
    assert better["nll_matches_gp"]
    assert rivals.verdicts(_rows(gp, gp, cov=0.925))[0]["calibrated"]
    assert not rivals.verdicts(_rows(gp, gp, cov=0.86))[0]["calibrated"]
    assert rivals.verdicts(_rows(gp, gp))[0]["far_coverage90"] == {"bootstrap": 0.5, "gp": 0.9}


def test_problems_and_bad_settings():
    for name in rivals.PROBLEMS:
        p = rivals.make_problem(name)
        assert p.x.shape[0] == p.y.shape[0] >= 400 and np.all(np.isfinite(p.y))
        assert (p.x_far is None) == (name == "diabetes")
    gap = rivals.make_problem("sinusoid-gap")
    assert np.all(np.abs(gap.x) >= 1.0) and np.all(np.abs(gap.x) <= 3.0)
    with pytest.raises(ValueError, match="unknown problem 'boston'"):
        rivals.make_problem("boston")
    with pytest.raises(ValueError, match="unknown method 'svm'"):
        rivals.measure(["diabetes"], ["svm"])
    with pytest.raises(ValueError, match="n_splits must be at least 2"):
        rivals.measure(["diabetes"], ["gp"], n_splits=1)


def test_a_small_run_end_to_end():
    doc = rivals.measure(["sinusoid-gap"], ["bootstrap", "plain"], n_splits=2,
                         estimator_settings={"n_particles": 4, "steps": 20, "optimizer": "adam", "learning_rate": 0.05,
                                             "noise_grid": (0.1, 1.0)})
    assert [(r["method"], r["split"]) for r in doc["rows"]] == [("bootstrap", 0), ("plain", 0), ("bootstrap", 1),
                                                                ("plain", 1)]
    for r in doc["rows"]:
        assert np.isfinite(r["nll"]) and 0 <= r["coverage90"] <= 1 and 0 <= r["far_coverage90"] <= 1
    (v,) = doc["verdicts"]
    assert v["problem"] == "sinusoid-gap" and v["n_splits"] == 2 and "nll_matches_gp" not in v
    assert doc["device"]["kind"] and doc["provenance"]["git_commit"] is not None


def test_table_shows_mean_and_standard_error_per_problem_and_method():
    rows = [{"problem": "p", "method": m, "split": s, "rmse": 1.0 + s, "nll": 2.0, "coverage90": 0.9,
             "far_coverage90": math.nan if m == "gp" else 0.5, "fit_s": 3.0 + s}
            for m in ("gp", "bootstrap") for s in range(3)]
    t = rivals.table({"rows": rows})
    assert list(t.index) == [("p", "bootstrap"), ("p", "gp")]  # METHODS order
    assert t.loc[("p", "bootstrap"), "RMSE"] == f"2 ± {1 / math.sqrt(3):.2g}"
    assert t.loc[("p", "gp"), "far coverage"] == "—"
    assert t.loc[("p", "gp"), "fit s (median)"] == "4.0"


def test_verdict_table_says_whether_each_goal_is_met():
    gp = [1.0, 1.2, 0.8, 1.1, 0.9]
    rows = _rows([g + 0.3 + 0.01 * s for s, g in enumerate(gp)], gp, cov=0.86)
    rows += [{**r, "problem": "q", "nll": r["nll"] - (0.5 if r["method"] == "bootstrap" else 0.0),
              "coverage90": 0.92 if r["method"] == "bootstrap" else 0.9, "far_coverage90": math.nan}
             for r in _rows(gp, gp)]
    t = rivals.verdict_table({"rows": rows})
    assert list(t.index) == ["p", "q"]
    assert t.loc["p", "within 1 SE of the GP or better"] == "no" and t.loc["q", "within 1 SE of the GP or better"] == "yes"
    assert t.loc["p", "within ±0.03 of 0.9"] == "no" and t.loc["q", "within ±0.03 of 0.9"] == "yes"
    assert t.loc["p", "difference (SE)"].startswith("+0.320")
    assert t.loc["p", "far coverage: bootstrap / plain / GP"] == "0.50 / — / 0.90"
    assert t.loc["q", "far coverage: bootstrap / plain / GP"] == "— / — / —"
