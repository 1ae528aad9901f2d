"""experiments.classification: the agreement statistics by hand, and a tiny run's contract keys."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from bootens_core.repro.config import DropoutGridConfig, NUTSConfig
from bootens_core.repro.experiments.classification.config import ClassificationConfig
from bootens_core.repro.experiments import classification


def test_agreement_of_identical_sets_is_perfect():
    p = np.random.default_rng(0).uniform(size=(300, 9))
    a = classification.agreement(p, p)
    assert a == {"prob_mad": 0.0, "band_mad": 0.0, "band_coverage": 1.0}


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


def test_agreement_shape_errors():
    with pytest.raises(ValueError, match="same grid"):
        classification.agreement(np.zeros((3, 4)), np.zeros((3, 5)))


@pytest.fixture(scope="module")
def tiny():
    cfg = dataclasses.replace(
        ClassificationConfig.quick(), width=8, n_data=20, n_particles=16, steps=30,
        nuts=NUTSConfig(chains=2, warmup=60, draws=30, max_tree_depth=5), x_grid_points=21,
        alpha_eps_study=(0.01, 0.1), datasets=("wine",), n_splits=2, real_particles=4, real_steps=10,
        mcd=DropoutGridConfig(dropout_grid=(0.05, 0.1), epochs=5, samples=20),
    )
    return classification.run(jax.random.key(0), cfg, use_cache=False)


@pytest.mark.slow
def test_tiny_run_has_the_contract_keys(tiny):
    s = tiny.summary
    for k in ("prob_mad_vs_mcmc", "band_mad_vs_mcmc", "rhat_max"):
        assert np.isfinite(s[k])
    entry = s["real"]["wine"]
    assert entry["n_splits"] == 2 and entry["n_classes"] == 3
    for m in ("bootstrap", "plain", "mcd"):
        for k in ("accuracy", "mnll", "ece"):
            assert np.isfinite(entry[m][k]) and entry[m][f"{k}_std"] >= 0
        assert tiny[f"wine_{m}_probs"].shape == (tiny["wine_labels"].size, 3)
        np.testing.assert_allclose(tiny[f"wine_{m}_probs"].sum(1), 1.0, rtol=1e-9)
    assert set(entry["mcd_dropout_chosen"]) <= {0.05, 0.1}
    assert tiny["p_bootstrap"].shape == (16, 21) and tiny["p_nuts"].shape == (60, 21)
    assert s["alpha_eps_best_band_mad"] in (0.01, 0.1)


@pytest.mark.slow
def test_typed_summary_is_the_summary_json(tiny, tmp_path):
    """The typed summary holds exactly the keys the run writes, also read back from disk; the rules and tables
    read it as they read the dict; without an alpha_eps study the best value is None and not written."""
    from bootens_core.repro import store

    typed = classification.Summary.of(tiny)
    assert typed.as_summary() == tiny.summary and typed.alpha_eps_best_band_mad in (0.01, 0.1)
    assert classification.Summary.of(store.load(store.save(tiny, tmp_path / "r"))) == typed
    assert ({k: str(v) for k, v in classification.verdicts.evaluate(typed).items()}
            == {k: str(v) for k, v in classification.verdicts.evaluate(tiny.summary).items()})
    assert classification.verdicts.agreement(typed).equals(classification.verdicts.agreement(tiny.summary))
    assert classification.verdicts.table(typed).equals(classification.verdicts.table(tiny.summary))
    no_study = dataclasses.replace(typed, alpha_eps_study={}, alpha_eps_best_band_mad=None)
    assert "alpha_eps_best_band_mad" not in no_study.as_summary()
    assert classification.Summary.of(no_study.as_summary()) == no_study


@pytest.mark.slow
def test_tiny_run_tables_and_figures(tiny):
    verdicts = classification.verdicts.evaluate(tiny.summary)
    assert set(verdicts) == {"reference", "agreement"}
    assert len(classification.verdicts.agreement(tiny.summary)) == 4  # boot, plain, 1 other alpha, NUTS floor
    assert classification.verdicts.table(tiny.summary).shape == (3, 3)
    paired = classification.verdicts.paired(tiny, "plain")
    assert set(paired["bootstrap is"]) <= {"better", "worse", "no clear difference"}
    for fig in (classification.figures.bands(tiny), classification.figures.latent(tiny), classification.figures.alpha(tiny),
                classification.figures.reliability(tiny, "wine")):
        assert fig.axes
