"""Published UCI results on the same standard splits (bootens_core/data/published_uci.csv): a few values
against a second transcription typed here from the sources, and the bookkeeping every row needs."""

from __future__ import annotations

import re

import pytest

from bootens_core.repro.experiments.uci.config import UCI_DATASETS
from bootens_core.repro.experiments import uci

# Typed separately from the sources (not from the CSV). Means as printed; LL is the test log-likelihood.
#  Gal & Ghahramani 2016, arXiv:1506.02142v6, Table 1 ("Avg. Test RMSE and Std. Errors", "Avg. Test LL and
#  Std. Errors"): Boston PBP RMSE 3.01 ± 0.18, Dropout LL -2.46 ± 0.06, Yacht Dropout RMSE 1.11 ± 0.09,
#  Kin8nm PBP LL 0.90 ± 0.01.
#  Gal's readme.md at 6eb4497, "Grid Search" columns: Energy RMSE 0.54 ± 0.06, Naval LL 4.45 ± 0.00,
#  Concrete LL -2.93 ± 0.02.
#  Lakshminarayanan et al. 2017, Table 1, "Deep Ensembles": Boston RMSE 3.28 ± 1.00, Kin8nm NLL -1.20 ± 0.02,
#  Yacht NLL 1.18 ± 0.21, Protein RMSE 4.71 ± 0.06.
SECOND = [
    ("gal2016", "PBP", "boston", "rmse", 3.01, 0.18),
    ("gal2016", "MC dropout", "boston", "mnll", 2.46, 0.06),  # LL -2.46
    ("gal2016", "MC dropout", "yacht", "rmse", 1.11, 0.09),
    ("gal2016", "PBP", "kin8nm", "mnll", -0.90, 0.01),  # LL 0.90
    ("gal_repo_2018", "MC dropout, grid search", "energy", "rmse", 0.54, 0.06),
    ("gal_repo_2018", "MC dropout, grid search", "naval", "mnll", -4.45, 0.00),  # LL 4.45
    ("gal_repo_2018", "MC dropout, grid search", "concrete", "mnll", 2.93, 0.02),  # LL -2.93
    ("lakshminarayanan2017", "Deep ensembles", "boston", "rmse", 3.28, 1.00),
    ("lakshminarayanan2017", "Deep ensembles", "kin8nm", "mnll", -1.20, 0.02),  # NLL as printed
    ("lakshminarayanan2017", "Deep ensembles", "yacht", "mnll", 1.18, 0.21),
    ("lakshminarayanan2017", "Deep ensembles", "protein", "rmse", 4.71, 0.06),
]


@pytest.fixture(scope="module")
def rows():
    return uci.published_reference()


@pytest.mark.parametrize(("source", "method", "dataset", "metric", "mean", "pm"), SECOND)
def test_transcription_matches_a_second_one(rows, source, method, dataset, metric, mean, pm):
    hit = [r for r in rows if (r["source"], r["method"], r["dataset"], r["metric"]) == (source, method, dataset, metric)]
    assert len(hit) == 1
    assert (hit[0]["mean"], hit[0]["pm"]) == pytest.approx((mean, pm), abs=1e-12)


def test_every_row_has_a_source_a_convention_and_a_consistent_conversion(rows):
    assert rows
    for r in rows:
        assert r["source"] and r["citation"] and r["url"].startswith("https://"), r
        assert r["pm_convention"] in ("SE", "SD", "unstated"), r
        assert r["n_splits"] == (5 if r["dataset"] == "protein" else 20), r
        assert r["dataset"] in UCI_DATASETS and r["metric"] in ("rmse", "mnll"), r
        printed = re.fullmatch(r"(-?\d+\.\d+) ± (\d+\.\d+)", r["printed"])
        assert printed, r
        sign = -1.0 if r["conversion"] == "MNLL = -LL" else 1.0
        assert r["conversion"] in ("none", "MNLL = -LL", "none (NLL printed)"), r
        assert r["conversion"] != "MNLL = -LL" or r["metric"] == "mnll", r
        assert r["mean"] == pytest.approx(sign * float(printed.group(1)), abs=1e-12), r
        assert r["pm"] == float(printed.group(2)), r
        assert r["metric"] != "rmse" or r["mean"] >= 0, r


def test_each_published_column_covers_every_dataset_and_both_metrics_once(rows):
    keys = [(r["source"], r["method"], r["dataset"], r["metric"]) for r in rows]
    assert len(keys) == len(set(keys))
    for source, method in {(r["source"], r["method"]) for r in rows}:
        got = {(d, m) for s, me, d, m in keys if (s, me) == (source, method)}
        assert got == {(d, m) for d in UCI_DATASETS for m in ("rmse", "mnll")}, (source, method)
    # Gal's numbers are standard errors (his Table 1's header; the readme's note); Deep Ensembles' are unstated
    conv = {(r["source"], r["pm_convention"]) for r in rows}
    assert conv == {("gal2016", "SE"), ("gal_repo_2018", "SE"), ("lakshminarayanan2017", "unstated")}


def test_published_tables_are_labelled_and_carry_the_convention(rows):
    t = uci.verdicts.published()
    assert list(t.columns) == ["RMSE", "MNLL"]
    assert list(t.loc["boston"].index) == list(dict.fromkeys(r["label"] for r in rows))
    assert t.loc[("boston", "PBP (Gal & Ghahramani 2016)"), "RMSE"] == "3.01 ± 0.18 (SE)"
    assert t.loc[("yacht", "Deep ensembles (Lakshminarayanan et al. 2017)"), "MNLL"] == "1.18 ± 0.21 (± not stated)"
    src = uci.verdicts.published_sources()
    assert set(src["±"]) == {"SE", "not stated"} and set(src["splits"]) == {"20 (Protein 5)"}
    assert src.loc["MC dropout (Gal & Ghahramani 2016)", "conversion"] == "MNLL = -LL"


def test_published_table_puts_ours_beside_with_mean_and_se():
    from bootens_core.repro.experiments.uci.config import UCIConfig

    recs = [{"dataset": "yacht", "method": "mcd", "hidden_layers": 1, "split": k, "test_rmse": v, "test_mnll": 1.2,
             "coverage95": 0.95, "wall_s": 1.0, "diverged_particles": 0} for k, v in enumerate([0.5, 0.7, 0.6])]
    s = uci.summarise(recs, UCIConfig(datasets=("yacht",), methods=("mcd-1",)))
    t = uci.verdicts.published(s)
    # mean 0.6, SD 0.1, SE 0.1 / sqrt(3) = 0.0577 (by hand)
    assert t.loc[("yacht", "ours: MCD 1-layer"), "RMSE"] == "0.600 ± 0.058 (3)"
    assert t.loc[("boston", "ours: MCD 1-layer"), "RMSE"] == "not run"
    assert list(t.loc["yacht"].index)[-1] == "ours: MCD 1-layer"  # ours follow the published rows
    assert not any(src.startswith("ours:") and "Ensemble" in src for src in t.index.get_level_values(1))
