"""experiments.classification: the agreement statistics by hand, and the contract of the chapter's own run
(``chapter_run`` in conftest.py: the book build's run, or computed once and handed to it)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bootens_core.repro.experiments import classification
from bootens_core.repro.experiments.classification.config import ClassificationConfig


def test_agreement_of_identical_sets_is_perfect():
    p = np.random.default_rng(0).uniform(size=(300, 9))
    a = classification.agreement(p, p)
    assert a == {"prob_mad": 0.0, "band_mad": 0.0, "band_coverage": 1.0, "width_ratio": 1.0}


def test_agreement_by_hand():
    """Two point masses per grid point: q at 0.3, the reference at 0.5 -> |Δmean| = 0.2, |Δedges| = 0.2."""
    q = np.full((50, 4), 0.3)
    ref = np.full((50, 4), 0.5)
    a = classification.agreement(q, ref)
    assert a["prob_mad"] == pytest.approx(0.2)
    assert a["band_mad"] == pytest.approx(0.2)
    # uniform draws on [0, 1] against uniform draws on [0, 0.5]: bands ~[0.025, 0.975] and ~[0.0125, 0.4875]
    rng = np.random.default_rng(1)
    wide, narrow = rng.uniform(size=(20000, 3)), rng.uniform(0, 0.5, size=(20000, 3))
    b = classification.agreement(narrow, wide)
    assert b["prob_mad"] == pytest.approx(0.25, abs=0.01)
    assert b["band_mad"] == pytest.approx((0.0125 + 0.4875) / 2, abs=0.01)
    assert b["band_coverage"] == pytest.approx((0.4875 - 0.025) / 0.95, abs=0.01)
    assert b["width_ratio"] == pytest.approx(0.5, abs=0.01)
    # point masses: the reference band has no width anywhere, so no ratio
    assert np.isnan(a["width_ratio"])


def test_reference_noise_by_hand():
    """Half-vs-half: four chains give three splits; chains of one law give a small gap and a log width ratio
    near 0; a chain from another law raises both."""
    rng = np.random.default_rng(2)
    same = rng.uniform(0.2, 0.6, size=(4, 2000, 3))
    n = classification.reference_noise(same)
    assert n["partitions"] == 3 and n["prob_mad"] < 0.01 and n["log_width"] < 0.03
    other = same.copy()
    other[3] = rng.uniform(0.5, 0.7, size=(2000, 3))
    m = classification.reference_noise(other)
    assert m["prob_mad"] > 5 * n["prob_mad"] and m["log_width"] > 5 * n["log_width"]
    assert classification.reference_noise(rng.uniform(size=(10, 50, 3)))["partitions"] == 64  # 126 capped
    with pytest.raises(ValueError, match="chains >= 2"):
        classification.reference_noise(same[:1])


def test_agreement_shape_errors():
    with pytest.raises(ValueError, match="same grid"):
        classification.agreement(np.zeros((3, 4)), np.zeros((3, 5)))


CFG = ClassificationConfig.quick()


@pytest.mark.parametrize("profile", ["quick", "paper"])
def test_deep_ensemble_has_the_chapters_network(profile):
    """The deep ensemble's networks are as wide as the other methods' (one hidden layer of ``width``), on the
    protocol's settings."""
    cfg = getattr(ClassificationConfig, profile)()
    assert cfg.deep.width == cfg.width
    assert (cfg.deep.n_networks, cfg.deep.epochs, cfg.deep.batch_size, cfg.deep.lr, cfg.deep.adversarial_eps) == (
        5, 40, 100, 0.1, 0.01)


def test_deep_ensemble_on_a_real_split():
    """One split of Wine (142 training rows, 13 inputs, 3 classes): the deep ensemble's predictive is the mean of
    its networks' softmax (rows sum to 1), it is accurate on this easy problem (the other methods reach about
    0.97), and the same key gives the same probabilities."""
    from bootens_core.baselines import deep_ensemble
    from bootens_core.data import tabular
    from bootens_core.repro.experiments.classification import experiment

    s = tabular.split("wine", 0, seed=CFG.seed, test_fraction=CFG.test_fraction)
    key = jax.random.key(1)
    probs, diverged = experiment._deep(key, CFG, s)
    assert probs.shape == (s.y_test.size, 3) and probs.dtype == np.float64 and diverged == 0
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-6)
    assert np.mean(probs.argmax(1) == s.y_test) > 0.9
    ens = deep_ensemble.fit(key, s.x_train, s.y_train, hidden=(CFG.width,), likelihood="categorical",
                            n_classes=3, dtype=jnp.float32)
    np.testing.assert_array_equal(probs, deep_ensemble.predict_proba(ens, s.x_test).astype(np.float64).mean(0))


@pytest.fixture(scope="module")
def chapter(chapter_run):
    return chapter_run("classification", CFG)  # the chapter's own run: read from the book build's cache


@pytest.mark.slow
def test_chapter_run_has_the_contract_keys(chapter):
    s = chapter.summary
    for k in ("prob_mad_vs_mcmc", "band_mad_vs_mcmc", "rhat_max"):
        assert np.isfinite(s[k])
    assert set(s["real"]) == set(CFG.datasets)
    assert s["deep_ensemble"].startswith(f"{CFG.deep.n_networks} networks of {CFG.width} ReLU units")
    for name, entry in s["real"].items():
        n_classes = chapter[f"{name}_bootstrap_probs"].shape[1]
        assert entry["n_splits"] == CFG.n_splits and entry["n_classes"] == n_classes
        for m in ("bootstrap", "plain", "mcd", "deep"):
            for k in ("accuracy", "mnll", "ece"):
                assert np.isfinite(entry[m][k]) and entry[m][f"{k}_std"] >= 0
            assert chapter[f"{name}_{m}_probs"].shape == (chapter[f"{name}_labels"].size, n_classes)
            np.testing.assert_allclose(chapter[f"{name}_{m}_probs"].sum(1), 1.0, rtol=1e-9)
        assert set(entry["mcd_dropout_chosen"]) <= set(CFG.mcd.dropout_grid)
        assert isinstance(entry["deep_diverged_networks"], int) and entry["deep_diverged_networks"] >= 0
    assert chapter["p_bootstrap"].shape == (CFG.n_particles, CFG.x_grid_points)
    assert chapter["p_nuts"].shape == (CFG.nuts.chains * CFG.nuts.draws, CFG.x_grid_points)
    assert s["alpha_eps_best_band_mad"] in CFG.alpha_eps_study


@pytest.mark.slow
def test_typed_summary_is_the_summary_json(chapter, tmp_path):
    """The typed summary holds exactly the keys the run writes, also read back from disk; the rules and tables
    read it as they read the dict; without an alpha_eps study the best value is None and not written."""
    from bootens_core.repro import store

    typed = classification.Summary.of(chapter)
    assert typed.as_summary() == chapter.summary and typed.alpha_eps_best_band_mad in CFG.alpha_eps_study
    assert classification.Summary.of(store.load(store.save(chapter, tmp_path / "r"))) == typed
    assert ({k: str(v) for k, v in classification.verdicts.evaluate(typed).items()}
            == {k: str(v) for k, v in classification.verdicts.evaluate(chapter.summary).items()})
    assert classification.verdicts.agreement(typed).equals(classification.verdicts.agreement(chapter.summary))
    assert classification.verdicts.table(typed).equals(classification.verdicts.table(chapter.summary))
    no_study = dataclasses.replace(typed, alpha_eps_study={}, alpha_eps_best_band_mad=None)
    assert "alpha_eps_best_band_mad" not in no_study.as_summary()
    assert classification.Summary.of(no_study.as_summary()) == no_study


@pytest.mark.slow
def test_chapter_run_tables_and_figures(chapter):
    verdicts = classification.verdicts.evaluate(chapter.summary)
    assert set(verdicts) == {"reference", "agreement"}
    # bootstrap, plain, the study's other alpha_eps values, and the NUTS floor
    others = sum(a != CFG.alpha_eps for a in CFG.alpha_eps_study)
    assert len(classification.verdicts.agreement(chapter.summary)) == 2 + others + 1
    table = classification.verdicts.table(chapter.summary)
    assert table.shape == (4 * len(CFG.datasets), 3)
    assert set(table.index.get_level_values("method")) == {"Bootstrap ensemble", "Plain ensemble", "MC dropout",
                                                           "Deep ensemble"}
    for other in ("plain", "mcd", "deep"):
        paired = classification.verdicts.paired(chapter, other)
        assert paired.shape[0] == 3 * len(CFG.datasets)
        assert set(paired["bootstrap is"]) <= {"better", "worse", "no clear difference"}
        assert (paired["splits"] == CFG.n_splits).all()
    assert "bootstrap − deep ensemble" in classification.verdicts.paired(chapter, "deep").columns
    stacked = classification.verdicts.paired_all(chapter)
    assert list(stacked.columns) == ["bootstrap − other", "std. error", "splits", "p", "bootstrap is"]
    assert stacked.shape[0] == 3 * 3 * len(CFG.datasets)
    deep = classification.verdicts.paired(chapter, "deep")
    assert (stacked.loc["Deep ensemble", "bootstrap − other"].to_numpy() == deep.iloc[:, 0].to_numpy()).all()
    assert str(classification.verdicts.buys(chapter, "deep")).startswith(f"breast cancer ({CFG.n_splits} splits): ")
    for fig in (classification.figures.bands(chapter), classification.figures.latent(chapter),
                classification.figures.alpha(chapter),
                *(classification.figures.reliability(chapter, name) for name in CFG.datasets)):
        assert fig.axes
