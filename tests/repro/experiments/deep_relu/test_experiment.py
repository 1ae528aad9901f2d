"""experiments.deep_relu (Figure 3): the agreement statistics against hand computations, and the contract of
the chapter's own run (``chapter_run`` in conftest.py: the book build's run, or computed once and handed to
it)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bootens_core.repro.experiments.deep_relu.config import DeepReluConfig
from bootens_core.repro.experiments import deep_relu


def test_agreement_of_identical_sets_is_perfect():
    f = np.random.default_rng(0).normal(size=(500, 7))
    a = deep_relu.agreement(f, f)
    assert a["mean_abs_diff_mean"] == 0
    assert a["sd_ratio_median"] == 1
    assert a["band_coverage"] == 1
    assert a["inside_ref_band"] == pytest.approx(0.95, abs=0.01)


def test_agreement_by_hand():
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(4000, 3))
    q = 0.5 + 2.0 * rng.normal(size=(4000, 3))
    a = deep_relu.agreement(q, ref)
    assert a["mean_abs_diff_mean"] == pytest.approx(0.5, abs=0.1)
    assert a["sd_ratio_median"] == pytest.approx(2.0, rel=0.05)
    assert a["band_coverage"] == pytest.approx(1.0)  # the wider band contains the narrower one
    narrow = deep_relu.agreement(ref, q)["band_coverage"]
    assert narrow == pytest.approx(0.5, abs=0.05)  # half as wide, nearly centred


def test_agreement_shape_errors():
    with pytest.raises(ValueError, match="same grid"):
        deep_relu.agreement(np.zeros((3, 4)), np.zeros((3, 5)))


def test_reference_noise_by_hand():
    """Four chains: the three half splits, computed one by one with agreement()."""
    rng = np.random.default_rng(2)
    f = rng.normal(size=(4, 30, 5)) * np.array([1.0, 1.0, 2.0, 2.0])[:, None, None]
    got = deep_relu.reference_noise(f)
    mads, logs = [], []
    for a, b in (([0, 1], [2, 3]), ([0, 2], [1, 3]), ([0, 3], [1, 2])):
        st = deep_relu.agreement(f[a].reshape(-1, 5), f[b].reshape(-1, 5))
        mads.append(st["mean_abs_diff_mean"])
        logs.append(np.log(st["sd_ratio_median"]))
    assert got["partitions"] == 3
    assert got["mad"] == pytest.approx(np.mean(mads))
    assert got["log_sd"] == pytest.approx(np.sqrt(np.mean(np.square(logs))))
    # Chains of one law: the half-vs-half mean difference is about its sampling noise, sqrt(2 / 60) sd
    # times E|N(0,1)| = sqrt(2/pi).
    same = deep_relu.reference_noise(rng.normal(size=(10, 200, 50)))
    assert same["partitions"] == 64
    assert same["mad"] == pytest.approx(np.sqrt(2 / 1000) * np.sqrt(2 / np.pi), rel=0.15)


def test_reference_noise_shape_errors():
    with pytest.raises(ValueError, match="chains >= 2"):
        deep_relu.reference_noise(np.zeros((1, 5, 3)))


def test_compare_is_agreement_step_by_step_and_the_references_noise():
    rng = np.random.default_rng(1)
    f_along = rng.normal(size=(3, 6, 4))
    f_ref = rng.normal(size=(4, 5, 4))
    diverged = np.array([False, True, False, False, False, False])
    arrays = {"along_steps": np.array([0, 10, 20]), "f_along": f_along, "stages": np.array([0, 20]),
              "diverged": diverged}
    got = deep_relu.compare(arrays, f_ref)
    flat = f_ref.reshape(-1, 4)
    each = [deep_relu.agreement(f[~diverged], flat) for f in f_along]
    assert {k: got[k] for k in each[-1]} == each[-1]
    assert got["agreement_steps"] == [0, 10, 20]
    assert got["mean_abs_diff_mean_along"] == [e["mean_abs_diff_mean"] for e in each]
    assert got["sd_ratio_median_along"] == [e["sd_ratio_median"] for e in each]
    assert got["band_coverage_stages"] == [each[0]["band_coverage"], each[2]["band_coverage"]]
    split = deep_relu.agreement(f_ref[:2].reshape(-1, 4), f_ref[2:].reshape(-1, 4))
    assert {k: got[f"reference_split_{k}"] for k in split} == split
    assert {k: got[f"reference_noise_{k}"] for k in ("mad", "log_sd", "partitions")} == deep_relu.reference_noise(f_ref)
    # 20 draws, at least twice the 5 particles kept: the noise of 5 of them against the rest
    assert {k: got[f"sample_noise_{k}"] for k in ("mad", "log_sd", "n", "repeats")} == deep_relu.sample_noise(f_ref, 5)
    few = deep_relu.compare(arrays, f_ref[:, :2])  # 8 draws
    assert not any(k.startswith("sample_noise") for k in few) and "reference_noise_mad" in few
    single = deep_relu.compare(arrays, f_ref[:1])
    assert not any(k.startswith("reference_") for k in single)
    with pytest.raises(ValueError, match="on the run's grid of 4 points"):
        deep_relu.compare(arrays, f_ref[..., :3])
    with pytest.raises(ValueError, match="stages"):
        deep_relu.compare({**arrays, "stages": np.array([5])}, f_ref)


def test_sample_noise_is_the_noise_of_independent_samples_of_that_size():
    """Independent N(0, 1) draws at 3 grid points, 20 against 180: mean |Δmean|/sd is E|N(0, 1/20 + 1/180)| =
    sqrt(2/pi) sqrt(1/20 + 1/180) and log sd ratio has sd about sqrt(1/(2*19) + 1/(2*179)), up to the
    Monte-Carlo error of 400 subsets (and of the median over 3 points)."""
    f = np.random.default_rng(3).normal(size=(4, 50, 3))
    got = deep_relu.sample_noise(f, 20, repeats=400, seed=2, each=True)
    want_mad = np.sqrt(2 / np.pi) * np.sqrt(1 / 20 + 1 / 180)
    assert got["mad"] == pytest.approx(want_mad, rel=0.1)
    assert 0.5 * np.sqrt(1 / 38 + 1 / 358) < got["log_sd"] < 1.2 * np.sqrt(1 / 38 + 1 / 358)
    assert len(got["mad_each"]) == 400 and got["n"] == 20 and got["repeats"] == 400
    assert deep_relu.sample_noise(f, 20, repeats=5) == deep_relu.sample_noise(f, 20, repeats=5)  # seeded
    for bad in (1, 101):
        with pytest.raises(ValueError, match="2 n <= the reference's 200 draws"):
            deep_relu.sample_noise(f, bad)


CFG = DeepReluConfig.quick()


@pytest.mark.slow
def test_chapter_run_has_the_contract_keys(chapter_run, tmp_path):
    res = chapter_run("deep-relu", CFG)  # the chapter's own run: read from the book build's cache
    s = res.summary
    for k in ("rhat_max", "mean_abs_diff_mean", "sd_ratio_median", "band_coverage", "reference_noise_mad",
              "reference_noise_log_sd"):
        assert np.isfinite(s[k]), k
    assert res["f_stages"].shape == (len(CFG.stages), CFG.n_particles, CFG.x_grid_points)
    along = sorted(set(CFG.stages) | set(range(0, CFG.steps + 1, CFG.agreement_every)))
    assert s["agreement_steps"] == along and len(s["mean_abs_diff_mean_along"]) == len(along)
    assert res["f_nuts"].shape == (CFG.nuts.chains * CFG.nuts.draws, CFG.x_grid_points)
    assert 0 <= s["mh_faithful_accept_rate"] <= 1
    # The typed summary is the summary.json, also read back from disk; the rules read it as they read the dict.
    from bootens_core.repro import store

    typed = deep_relu.Summary.of(res)
    assert typed.as_summary() == s
    assert deep_relu.Summary.of(store.load(store.save(res, tmp_path / "r"))) == typed
    assert ({k: str(v) for k, v in deep_relu.verdicts.evaluate(typed).items()}
            == {k: str(v) for k, v in deep_relu.verdicts.evaluate(s).items()})
    assert deep_relu.verdicts.along(typed).equals(deep_relu.verdicts.along(s))
    assert deep_relu.verdicts.reference(typed).equals(deep_relu.verdicts.reference(s))
    # A single-chain reference has no half-vs-half keys: None in the record, absent from summary.json.
    single = dataclasses.replace(typed, **{f.name: None for f in dataclasses.fields(typed)
                                           if f.name.startswith(("reference_split_", "reference_noise_"))})
    assert not any(k.startswith("reference_") for k in single.as_summary())
    assert deep_relu.Summary.of(single.as_summary()) == single
    from tests.repro.test_plots import render

    for fig in (deep_relu.figures.stages(res), deep_relu.figures.agreement(res), deep_relu.figures.faithful(res),
                deep_relu.figures.along(res)):
        assert render(fig).startswith(b"\x89PNG")
