"""experiments.practice: its rules by hand (splits, stuck particles, the non-inferiority rule, the calibration
verdict), its configuration errors, and the contract of the chapter's own run (``chapter_run``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from bootens_core.repro.experiments import practice
from bootens_core.repro.experiments.practice.experiment import (
    first_within,
    resampled_paired,
    stuck_particles,
)

CFG = practice.Config.quick()


def test_split_rows_partition_the_rows_the_same_way_every_time():
    tr, te = practice.split_rows(442, 3, 0, 0.2)
    assert te.size == 88 and tr.size == 354
    assert np.array_equal(np.sort(np.concatenate([tr, te])), np.arange(442))
    again = practice.split_rows(442, 3, 0, 0.2)
    assert np.array_equal(tr, again[0]) and np.array_equal(te, again[1])
    assert not np.array_equal(te, practice.split_rows(442, 4, 0, 0.2)[1])


def test_stuck_particles_are_the_far_outliers_above():
    rng = np.random.default_rng(0)
    final = rng.normal(100.0, 2.0, size=200)
    assert not stuck_particles(final).any()
    final[[3, 7]] = [100.0 + 20 * 2.0, 100.0 - 20 * 2.0]  # one far above, one far below (a better optimum)
    assert np.flatnonzero(stuck_particles(final)).tolist() == [3]
    assert stuck_particles(np.array([1.0, 1.0, 1.0, 2.0])).tolist() == [False, False, False, True]  # MAD 0


def test_first_within_is_a_paired_non_inferiority_test():
    """Column 0 is worse than the last by 0.5 on every split, column 1 by 0.001 +- noise: with margin 0.02
    the rule takes column 1; a margin above 0.5 plus its bound takes column 0; none within: the last."""
    rng = np.random.default_rng(1)
    last = rng.normal(5.0, 0.1, size=8)
    values = np.stack([last + 0.5, last + 0.001 + 0.001 * rng.standard_normal(8), last], axis=1)
    assert first_within(values, [1, 5, 20], 0.02) == 5
    assert first_within(values, [1, 5, 20], 0.6) == 1
    assert first_within(values[:, [0, 2]], [1, 20], 0.02) == 20
    # the bound by hand: mean + t_{0.95, n-1} sd / sqrt(n) of column 1's differences
    d = values[:, 1] - values[:, 2]
    bound = d.mean() + stats.t.ppf(0.95, 7) * d.std(ddof=1) / np.sqrt(8)
    assert first_within(values[:, 1:], [5, 20], bound + 1e-12) == 5
    assert first_within(values[:, 1:], [5, 20], bound - 1e-12) == 20


def test_resampled_paired_is_the_paired_t_test_widened_by_the_overlap_of_splits():
    """With no overlap (ratio 0) it is scipy's paired t-test; with ratio r its standard error is
    SD(d) sqrt(1/J + r) (Nadeau and Bengio's correction), so its t shrinks by sqrt(1 / (1 + J r))."""
    rng = np.random.default_rng(2)
    a, b = rng.normal(1.0, 1.0, 12), rng.normal(0.3, 1.0, 12)
    plain = resampled_paired(a, b, 0.0)
    ref = stats.ttest_rel(a, b)
    assert plain["t"] == pytest.approx(ref.statistic, rel=1e-12)
    assert plain["p"] == pytest.approx(ref.pvalue, rel=1e-12)
    wide = resampled_paired(a, b, 0.25)
    assert wide["t"] == pytest.approx(ref.statistic / np.sqrt(1 + 12 * 0.25), rel=1e-12)
    assert wide["p"] > plain["p"]
    assert resampled_paired(a, a + 5.0, 0.25)["verdict"] == "lower"
    assert resampled_paired(a, a, 0.25) == {"n": 12, "diff": 0.0, "se": 0.0, "t": 0.0, "p": 1.0,
                                            "verdict": "no significant difference"}


class _Fake:
    """A run's result as the verdicts read it: summary, config and arrays."""

    def __init__(self, summary, arrays, test_fraction=0.2):
        self.summary, self.arrays, self.config = summary, arrays, {"test_fraction": test_fraction}

    def __getitem__(self, k):
        return self.arrays[k]


def _calibration_run(shift, n=10, sd=0.02, seed=0):
    """Coverage per split at levels 0.5 and 0.9 around ``level + shift`` (sd ``sd`` over splits)."""
    rng = np.random.default_rng(seed)
    levels = np.array([0.5, 0.9])
    noise = rng.standard_normal((n, 2))
    noise = (noise - noise.mean(0)) / noise.std(0, ddof=1)  # the mean and sd over splits exactly as asked
    cov = levels[None] + np.asarray(shift)[None] + sd * noise
    return _Fake({"levels": levels.tolist(), "n_splits": n}, {"coverage": cov})


def test_calibration_verdict_follows_the_t_rule():
    """The corrected t-test with the level shared over the levels; a coverage shortfall beyond the limit is
    overconfidence, an excess underconfidence, and a non-rejection says what the test could have seen."""
    se = 0.02 * np.sqrt(1 / 10 + 0.25)
    crit = stats.t.isf(0.05 / 4, 9)
    v = practice.verdicts.calibration(_calibration_run([0.0, -(crit - 0.1) * se]))
    # a non-rejection is not "calibrated": it names the smallest errors the test detects at 80% power
    detect = (crit + stats.t.ppf(0.8, 9)) * se
    assert str(v) == (f"no miscalibration detected (the test detects coverage errors from {detect:.2f} to "
                      f"{detect:.2f}, by level)")
    assert "calibrated" not in str(v).replace("miscalibration", "")
    v = practice.verdicts.calibration(_calibration_run([-(crit + 0.1) * se, 0.0]))
    assert str(v) == "overconfident at 1 of 2 levels" and v.margin == pytest.approx(0.1)
    wide = practice.verdicts.calibration(_calibration_run([0.0, (crit + 1) * se]))
    assert "underconfident at 1 of 2" in str(wide)
    table = practice.verdicts.calibration_table(_calibration_run([0.0, -0.03]))
    assert table.loc[0.9, "corrected SE"] == pytest.approx(se)
    assert table.loc[0.9, "t"] == pytest.approx(-0.03 / se)
    assert table.loc[0.5, "detected at 80% power from"] == pytest.approx(detect)


def test_calibration_test_misses_a_shortfall_below_what_it_detects():
    """A true shortfall of half the detectable size at 3 splits is usually not found: why the verdict must not
    read "calibrated". Over many simulated runs its rejection rate stays well below the stated 80%, and a
    shortfall of twice the detectable size is found in at least 80% of them."""
    rng = np.random.default_rng(3)
    n, sd = 5, 0.05
    se = sd * np.sqrt(1 / n + 0.25)
    crit = stats.t.isf(0.05 / 4, n - 1)
    detect = (crit + stats.t.ppf(0.8, n - 1)) * se

    def rate(shortfall):
        found = 0
        for _ in range(400):
            shift = np.array([0.0, -shortfall])
            cov = np.array([0.5, 0.9])[None] + shift[None] + sd * rng.standard_normal((n, 2))
            v = practice.verdicts.calibration(_Fake({"levels": [0.5, 0.9], "n_splits": n}, {"coverage": cov}))
            found += str(v).startswith("overconfident")
        return found / 400

    assert rate(detect / 2) < 0.5
    assert rate(2 * detect) > 0.8


def test_against_last_by_hand():
    rng = np.random.default_rng(4)
    values = rng.normal(5.0, 0.1, size=(6, 3))
    t = practice.verdicts.against_last(values, [1, 5, 20], 0.25)
    d = values[:, 0] - values[:, 2]
    se = d.std(ddof=1) * np.sqrt(1 / 6 + 0.25)
    assert t.loc[1, "minus the last"] == pytest.approx(d.mean())
    assert t.loc[1, "corrected SE"] == pytest.approx(se)
    assert t.loc[1, "CI high"] == pytest.approx(d.mean() + stats.t.ppf(0.975, 5) * se)
    assert t.loc[1, "shown within"] == pytest.approx(d.mean() + stats.t.ppf(0.95, 5) * se)
    assert t.loc[20, "minus the last"] == 0.0 and t.loc[5, "mean"] == pytest.approx(values[:, 1].mean())
    # the rule's choice is the first candidate whose bound is below the margin
    margin = t.loc[5, "shown within"] + 1e-9
    expected = 1 if t.loc[1, "shown within"] < margin else 5
    assert first_within(values, [1, 5, 20], margin, 0.25) == expected


def test_stopping_names_early_stopping_while_the_objective_falls():
    s = {"stop_step": 5, "stop_steps": [0, 5, 10], "mnll_by_step": [6.0, 5.5, 5.52]}
    falling = np.linspace(100.0, 50.0, 10)[None]  # at step 5 (index 4) 77.8: 56% of the fall ahead
    v = practice.verdicts.stopping(_Fake(s, {"loss_median": falling}))
    assert str(v) == ("test MNLL as good after 5 steps as after 10, with 56% of the objective's fall still "
                      "ahead: early stopping, not convergence")
    flat = np.concatenate([np.linspace(100.0, 50.0, 5), np.full(5, 50.0)])[None]
    assert str(practice.verdicts.stopping(_Fake(s, {"loss_median": flat}))) == (
        "test MNLL as good after 5 steps as after 10")
    assert str(practice.verdicts.stopping(_Fake({**s, "stop_step": 10}, {"loss_median": falling}))) == (
        "no fewer steps shown as good as all 10")


@pytest.mark.parametrize("change, match", [
    ({"n_splits": 2}, "n_splits"), ({"ks": (1, 5)}, "ks"), ({"compare_particles": 50}, "compare_particles"),
    ({"stop_steps": (0, 10)}, "stop_steps"), ({"test_fraction": 1.0}, "test_fraction"),
])
def test_bad_configuration_is_named(change, match):
    import jax

    with pytest.raises(ValueError, match=match):
        practice.run(jax.random.key(0), dataclasses.replace(CFG, **change), use_cache=False)


@pytest.fixture(scope="module")
def chapter(chapter_run):
    return chapter_run("practice", CFG)  # the chapter's own run: read from the book build's cache


@pytest.mark.slow
def test_chapter_run_has_the_contract(chapter):
    s = practice.Summary.of(chapter)
    n, kk = CFG.n_splits, len(CFG.ks)
    assert chapter["by_k"].shape == (n, kk, 3) and chapter["by_step"].shape == (n, len(CFG.stop_steps), 3)
    assert chapter["method"].shape == (n, len(practice.METHODS), 5)
    assert np.all(np.isfinite(chapter["by_k"])) and np.all(np.isfinite(chapter["method"]))
    assert set(s.selected_noise_var) <= set(CFG.noise_grid)
    assert s.k_enough in CFG.ks and s.stop_step in CFG.stop_steps
    assert np.all((chapter["coverage"] >= 0) & (chapter["coverage"] <= 1))
    assert chapter["pit_counts"].sum() == n * s.n_test
    # the full ensemble's row of the k sweep is the bootstrap arm of the comparison (compare_particles == K)
    np.testing.assert_allclose(chapter["by_k"][:, -1, 1], chapter["method"][:, 0, 1], rtol=1e-12)
    assert s.mnll_by_k[-1] == pytest.approx(s.means["bootstrap"]["mnll"], rel=1e-12)
    for name in practice.METHODS[1:]:
        assert set(s.compare[name]) == {"rmse", "mnll", "coverage90", "crps", "fit_s"}
    table = practice.verdicts.guidance_table(chapter)
    assert list(table.index) == ["particles", "noise variance", "steps", "stuck particles", "calibration"]
    assert list(practice.verdicts.particles_curve(chapter).index) == list(CFG.ks)
    assert "90% coverage" in practice.verdicts.steps_curve(chapter).columns


def test_the_committed_record_reads_with_its_curves():
    """The larger-scale record (made before the coverage was kept along the steps) gives its curves and
    guidance: 20 particles within 0.007 nats of 50, a shortfall at 95% the test cannot see."""
    from pathlib import Path

    from bootens_core.repro import store

    record = store.load(Path(__file__).resolve().parents[4] / "results" / "paper" / "practice")
    pc = practice.verdicts.particles_curve(record)
    assert pc.loc[20, "minus the last"] == pytest.approx(0.0066, abs=5e-4)
    assert pc.loc[20, "shown within"] > record.summary["mnll_margin"]  # why the rule says 50 of 50
    assert "90% coverage" not in practice.verdicts.steps_curve(record).columns
    cal = practice.verdicts.calibration_table(record)
    assert cal.loc[0.95, "coverage"] == pytest.approx(0.9125)
    assert str(practice.verdicts.calibration(record)).startswith("no miscalibration detected")
    assert list(practice.verdicts.guidance_table(record).index)[0] == "particles"


def test_comparison_table_shows_the_methods_a_summary_holds():
    c = {"diff": 1.0, "se": 0.5, "p": 0.1, "verdict": "no significant difference"}
    metrics = ("rmse", "mnll")
    old = {"means": {name: {m: 1.0 for m in metrics} for name in practice.METHODS[:3]},
           "compare": {name: {m: c for m in metrics} for name in practice.METHODS[1:3]}}
    table = practice.verdicts.comparison_table(old)  # a record made before deep ensembles joined
    assert set(table.index.get_level_values("method")) == set(practice.METHODS[:3])
    new = {"means": {**old["means"], "deep ensemble": {m: 2.0 for m in metrics}},
           "compare": {**old["compare"], "deep ensemble": {m: c for m in metrics}}}
    table = practice.verdicts.comparison_table(new)
    assert table.loc[("rmse", "deep ensemble"), "mean"] == 2.0
    assert table.loc[("mnll", "deep ensemble"), "corrected paired t-test"] == "no significant difference"


def test_deep_ensemble_arm_is_the_baseline_on_standardised_rows_in_label_units():
    import jax

    from bootens_core.baselines import deep_ensemble
    from bootens_core.repro.experiments.practice.experiment import _deep_ensemble

    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(80, 2))
    x[:, 1] = 5.0  # a constant column: scaled by 1, as the estimator does
    y = 10 + 4 * x[:, 0] + rng.normal(size=80)
    key = jax.random.key(2)
    f, var = _deep_ensemble(key, x[:60], y[:60], x[60:], CFG)
    xm, xs = x[:60].mean(0), np.array([x[:60, 0].std(), 1.0])
    ens = deep_ensemble.fit(key, (x[:60] - xm) / xs, (y[:60] - y[:60].mean()) / y[:60].std(), hidden=(50,),
                            n_networks=5, epochs=40, batch_size=100, lr=0.01, adversarial_eps=0.01)
    mu, v = deep_ensemble.predict(ens, (x[60:] - xm) / xs)
    np.testing.assert_allclose(f, y[:60].mean() + y[:60].std() * mu, rtol=1e-12)
    np.testing.assert_allclose(var, y[:60].var() * v, rtol=1e-12)
    assert f.shape == var.shape == (5, 20)
