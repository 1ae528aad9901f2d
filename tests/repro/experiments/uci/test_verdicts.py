"""bootens_core.repro.report, UCI part: tables, counts and the L-BFGS numbers follow their rules on known inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bootens_core.repro.experiments.uci.config import UCIConfig
from bootens_core.repro.experiments import uci


def _records(values):
    """Cell records as run_cell writes them: {(dataset, method, layers): [(rmse, mnll, coverage), ...]}."""
    out = []
    for (ds, meth, layers), splits in values.items():
        for k, (rmse, mnll, cov) in enumerate(splits):
            out.append({"dataset": ds, "method": meth, "hidden_layers": layers, "split": k, "test_rmse": rmse,
                        "test_mnll": mnll, "coverage95": cov, "wall_s": 1.0, "diverged_particles": k})
    return out


@pytest.fixture
def summary():
    ref = uci.paper_reference()
    p_rmse, p_std = ref[("boston", "ensemble", 1, "rmse")]
    cfg = UCIConfig(datasets=("boston", "yacht"), methods=("ensemble-1", "gp"))
    recs = _records({
        # boston ensemble-1: RMSE exactly the paper's mean (agrees); MNLL far above (worse)
        ("boston", "ensemble", 1): [(p_rmse, 50.0, 0.9), (p_rmse, 50.0, 0.96), (p_rmse, 50.0, 0.93)],
        # yacht gp: one split, so no test of the RMSE (too few splits); MNLL not finite (failed)
        ("yacht", "gp", 0): [(1e-3, float("nan"), 0.95)],
    })
    return uci.summarise(recs, cfg), p_rmse, p_std


def test_uci_table_layout_and_entries(summary):
    s, p_rmse, p_std = summary
    t = uci.verdicts.table(s, "rmse", uci.verdicts.TABLE1)
    # one row per dataset and method column, three entries wide
    assert list(t.columns) == ["ours", "paper", "ours − paper [95% CI]", "verdict", "made with"]
    assert list(t.index.get_level_values(0).unique()) == ["boston (n=506)", "yacht (n=308)"]
    assert list(t.loc["boston (n=506)"].index) == ["Ensemble 1-layer", "Ensemble 4-layer", "MCD 4-layer",
                                                   "SGHMC 1-layer"]
    # ours: mean ± SE (SD, splits); the paper: its mean ± SE = SD / sqrt(10) (its SD, its 10 splits)
    assert t.loc[("boston (n=506)", "Ensemble 1-layer"), "ours"] == f"{p_rmse:.3g} ± 0 (SD 0, 3)"
    se = p_std / np.sqrt(10)
    assert t.loc[("boston (n=506)", "Ensemble 1-layer"), "paper"] == f"{p_rmse:.2f} ± {se:.2g} (SD {p_std:.2f}, 10)"
    # ours equals the paper's mean with no spread: the difference's SE is the paper's (plus its rounding), with
    # the Welch degrees of freedom of the paper's term alone (written out); TOST bound t_0.95 SE < its SD
    from scipy import stats

    var = se**2 + 0.005**2 / 3
    df = var**2 / (se**4 / 9)
    half = stats.t.ppf(0.975, df) * np.sqrt(var)
    assert stats.t.ppf(0.95, df) * np.sqrt(var) < p_std  # the rule's condition for "equivalent", by hand
    assert t.loc[("boston (n=506)", "Ensemble 1-layer"), "ours − paper [95% CI]"] == (
        f"0 [-{half:.2f}, {half:.2f}] (margin {p_std:.2f})")
    assert t.loc[("boston (n=506)", "Ensemble 1-layer"), "verdict"] == "equivalent (p 1), 3 diverged"
    assert t.loc[("boston (n=506)", "Ensemble 1-layer"), "made with"] == ""
    assert t.loc[("boston (n=506)", "Ensemble 4-layer"), "ours"] == "not run"
    assert t.loc[("yacht (n=308)", "MCD 4-layer"), "ours"] == "not run"
    assert t.loc[("yacht (n=308)", "SGHMC 1-layer"), "ours"] == "not run"
    full = uci.verdicts.table(s, "mnll")
    assert len(full) == 2 * 6
    assert full.loc[("yacht (n=308)", "GP"), "ours"].startswith("diverged")
    assert full.loc[("yacht (n=308)", "GP"), "verdict"] == "failed"
    assert full.loc[("boston (n=506)", "Ensemble 1-layer"), "verdict"].startswith("differs (ours higher) (p ")
    assert uci.verdicts.table(s, "rmse").loc[("yacht (n=308)", "GP"), "verdict"] == "too few splits"
    assert uci.verdicts.table(s, "rmse").loc[("yacht (n=308)", "GP"), "ours"] == "0.00100 (1)"


def test_uci_table_prints_significant_digits():
    # Naval's RMSE is about 0.001: two decimals would print 0.00
    recs = _records({("naval", "ensemble", 1): [(0.00123, -5.6, 0.95), (0.00131, -5.5, 0.95), (0.00119, -5.7, 0.9)]})
    s = uci.summarise(recs, UCIConfig(datasets=("naval",), methods=("ensemble-1",)))
    t = uci.verdicts.table(s, "rmse")
    row = ("naval (n=11934)", "Ensemble 1-layer")
    # mean 0.0012433, SD (ddof 1) 6.11e-5, SE 3.53e-5 (by hand)
    assert t.loc[row, "ours"] == "0.00124 ± 0.000035 (SD 0.000061, 3)"
    # the paper's 0.00 ± 0.00 is taken as SD 0.005 (half its last digit): SE 0.005 / sqrt(10)
    assert t.loc[row, "paper"] == "0.00 ± 0.0016 (SD 0.00, 10)"
    # a printed 0.00 is coarser than every value compared: no verdict either way
    assert t.loc[row, "verdict"].startswith("untestable (p ")


def test_uci_verdict_counts(summary):
    s, *_ = summary
    v = uci.verdicts.evaluate(s)
    # boston ens-1: rmse equivalent, mnll higher; yacht gp: rmse too few splits, mnll failed; coverage not counted
    assert str(v["equivalent"]) == "1 of 2 testable"
    assert str(v["counts"]) == ("of 4 RMSE/MNLL entries, 2 testable: 1 equivalent to the paper's within its SD "
                                "(two one-sided tests at 5%), 0 differ with ours lower, 1 differ with ours higher, "
                                "0 inconclusive; not testable: 1 failed, 1 too few splits; at a family-wise 5% "
                                "(Holm) 1 differ; 3 diverged particles")
    table = uci.verdicts.by_column(s, (("ensemble", 1), ("gp", 0)))
    assert table.loc[("bootstrap ensemble", "Ensemble 1-layer"), ["entries", "testable", "equivalent",
                                                                 "ours higher"]].tolist() == [2, 2, 1, 1]
    assert table.loc[("baseline", "GP"), ["entries", "testable", "not testable"]].tolist() == [2, 0, 2]
    assert str(uci.verdicts.by_family(s, (("ensemble", 1), ("gp", 0)))) == (
        "bootstrap ensembles: of 2 entries, 2 testable: 1 equivalent, 0 lower, 1 higher, 0 inconclusive; "
        "baselines: of 2 entries, 0 testable: 0 equivalent, 0 lower, 0 higher, 0 inconclusive")
    # The checked form counts only what rounding cannot change: cells compared and cells that failed.
    assert str(v["computed"]) == "4 RMSE/MNLL entries compared with the paper, 1 failed"
    # The cell that differs at the family-wise level is named, with its side of the paper's mean.
    assert str(v["differ_holm"]) == "Ensemble 1-layer Boston MNLL (above the paper's)"


def test_uci_verdicts_name_the_holm_cells():
    def row(ds, metric, mean, paper, p):
        return {"dataset": ds, "method": "gp", "hidden_layers": 0, "metric": metric, "mean": mean,
                "paper_mean": paper, "p": p, "verdict": "no significant difference" if p >= 0.05 else "better",
                "equivalence": "inconclusive" if p >= 0.05 else "differs (ours lower)"}

    # Holm over 3 p-values at 5%: 0.001 <= 0.05/3 and 0.02 <= 0.05/2 are rejected, then 0.2 > 0.05 stops.
    s = {"rows": [row("wine", "mnll", 0.9, 1.07, 0.02), row("kin8nm", "mnll", -1.2, -0.5, 0.001),
                  row("yacht", "rmse", 0.5, 0.49, 0.2)]}
    assert str(uci.verdicts.evaluate(s)["differ_holm"]) == ("GP Wine MNLL (below the paper's), "
                                                          "GP Kin8nm MNLL (below the paper's)")
    s["rows"][0]["p"] = 0.03  # 0.03 > 0.05/2: only Kin8nm
    assert str(uci.verdicts.evaluate(s)["differ_holm"]) == "GP Kin8nm MNLL (below the paper's)"
    s["rows"][1]["p"] = 0.5
    assert str(uci.verdicts.evaluate(s)["differ_holm"]) == "none"


def test_uci_coverage_pivot(summary):
    s, *_ = summary
    c = uci.verdicts.coverage(s)
    assert c.loc["boston", "Ensemble 1-layer"] == "0.93 ± 0.02"  # SE: SD 0.03 / sqrt(3)
    assert c.loc["yacht", "GP"] == "0.95 ± 0.00"


def test_uci_runs_side_by_side(summary):
    s, *_ = summary
    t = uci.verdicts.runs({"a": s, "b": {"rows": []}}, "rmse")
    assert list(t.columns) == ["a", "b"]
    assert (t["b"] == "not run").all()
    assert t.loc["boston, Ensemble 1-layer", "a"].endswith("(3 splits, 3 diverged)")


def test_uci_size():
    assert uci.verdicts.size("protein") == 45730
    with pytest.raises(KeyError, match="unknown UCI dataset 'nonesuch'"):
        uci.verdicts.size("nonesuch")


def test_uci_lbfgs_summary_rules():
    fixed = np.array([10.0, 8.0, 9.0, 7.0, 7.5, 6.0])
    train = fixed.copy()
    train[4:] += 1e-3
    check = {"fixed": fixed, "train": train, "zoom": fixed - 1, "scipy": fixed - 2,
             "direction_rel_err": np.array([0.0, 1e-16, 3e-15]), "final": {"fixed": 6.0, "zoom": 5.0, "scipy": 4.0},
             "scipy_nfev": 9}
    out = uci.verdicts.lbfgs_summary(check)
    assert out["train_agree_iters"] == 4
    assert out["fixed_rise_fraction"] == pytest.approx(2 / 5)
    assert out["direction_rel_err_max"] == 3e-15
    assert out["loss_at_32"] == {"fixed": 6.0, "zoom": 5.0, "scipy": 4.0}  # shorter than 32: the last
    assert out["n_iters"] == 6 and out["scipy_nfev"] == 9


def test_uci_noise_selection_counts_grid_edges():
    from bootens_core.repro.store import Result

    grid = UCIConfig().noise_grid
    csv_text = "dataset,split,method,hidden_layers,noise_var_std_units\n" + "\n".join([
        "yacht,0,ensemble,1,0.0001", "yacht,1,ensemble,1,0.0001", "yacht,2,ensemble,1,0.001",
        "boston,0,ensemble,1,1.0", "boston,1,ensemble,1,0.03",
        "boston,0,gp,0,0.0000123", "boston,1,gp,0,0.5",
    ])
    res = Result("uci", {"noise_grid": list(grid)}, {}, {}, files={"cells.csv": csv_text})
    t = uci.verdicts.noise_selection(res)
    lo, hi = f"at grid min {min(grid):g}", f"at grid max {max(grid):g}"
    y = t.loc[("yacht", "Ensemble 1-layer")]
    assert (y["splits"], y[lo], y[hi], y["median σ² (std units)"]) == (3, 2, 0, "0.0001")
    b = t.loc[("boston", "Ensemble 1-layer")]
    assert (b[lo], b[hi]) == (0, 1)
    # the GP's noise is fitted: below the grid's minimum is no edge choice
    g = t.loc[("boston", "GP")]
    assert (g[lo], g[hi], g["median σ² (std units)"]) == ("—", "—", "0.25")


def test_uci_noise_selection_uses_the_selection_column():
    from bootens_core.repro.store import Result

    csv_text = "dataset,split,method,hidden_layers,noise_var_std_units,selection\n" + "\n".join([
        "yacht,0,ensemble,1,0.0001,validation MNLL over 9 values",
        "yacht,0,mcd,4,0.0001,validation log-likelihood over 4 dropout rates x 3 tau (last 20%)",
    ])
    t = uci.verdicts.noise_selection(Result("uci", {"noise_grid": [1e-4, 1.0]}, {}, {}, files={"cells.csv": csv_text}))
    assert t.loc[("yacht", "Ensemble 1-layer"), "at grid min 0.0001"] == 1
    # MC dropout's variance is 1/tau of its own grid: the noise grid's edges do not apply
    assert t.loc[("yacht", "MCD 4-layer"), "at grid min 0.0001"] == "—"


def test_uci_sghmc_study_table():
    rows = [{"step_size": s, "test_rmse": r, "test_mnll": 2.0, "coverage95": 0.95, "diverged_restarts": d,
             "rhat_mean": 1.5, "rhat_max": 2.25, "wall_s": 3.0} for s, r, d in ((1e-3, 5.27, 0), (0.0316, 2.31, 1))]
    t = uci.verdicts.sghmc_study({"rows": rows})
    assert list(t.index) == ["0.001", "0.0316"]
    assert t.loc["0.0316", "test RMSE"] == "2.31" and t.loc["0.0316", "diverged restarts"] == 1
    assert t.loc["0.001", "predictive R-hat mean (max)"] == "1.50 (2.25)"


def _stored(records, cfg):
    from types import SimpleNamespace

    from bootens_core.repro.config import as_dict

    return SimpleNamespace(summary=uci.summarise(records, cfg), config=as_dict(cfg))


def test_paper_scale_counts_complete_datasets_at_the_papers_settings():
    paper = UCIConfig.paper()
    full = _records({("yacht", "ensemble", 1): [(1.0, 1.0, 0.9)] * 10, ("boston", "ensemble", 1): [(1.0, 1.0, 0.9)] * 2,
                     ("yacht", "gp", 0): [(1.0, 1.0, 0.9)] * 10, ("protein", "gp", 0): [(1.0, 1.0, 0.9)] * 5})
    for r in full:
        r["noise_var"] = 0.1
    small = type(paper)(**{**paper.__dict__, "n_particles": 50})  # the ensemble's scale differs, GP's does not
    recs = {"a": _stored(full, paper), "b": _stored(_records({("energy", "ensemble", 1): [(1, 1, 1)] * 10,
                                                               ("energy", "gp", 0): [(1, 1, 1)] * 10}), small)}
    table, count = uci.verdicts.paper_scale(recs)
    assert str(count) == "8 of 108 table cells"  # yacht ens-1, yacht/protein/energy GP; x RMSE and MNLL
    row = table.loc["Ensemble 1-layer"]
    assert row["datasets complete (of 9)"] == 1 and row["splits at paper scale (of 85)"] == 12
    assert row["complete on"] == "yacht" and row["record"] == "a"
    gp = table.loc["GP"]
    assert gp["datasets complete (of 9)"] == 3 and gp["record"] == "a, b"
    assert table.loc["Ensemble 4-layer", "table cells (of 18)"] == 0


def test_paper_scale_of_the_committed_records():
    # Counted independently from cells.csv: a (method, layers, dataset) is complete when all its splits are.
    import csv
    from pathlib import Path

    from bootens_core.repro import store
    from bootens_core.data.uci import PAPER_SPLITS

    root = Path(__file__).resolve().parents[4] / "results" / "paper"
    done = 0
    for name in ("uci", "uci-mcd-sghmc"):
        splits: dict[tuple[str, str, str], int] = {}
        for r in csv.DictReader(open(root / name / "cells.csv")):
            k = (r["method"], r["hidden_layers"], r["dataset"])
            splits[k] = splits.get(k, 0) + 1
        done += 2 * sum(n == PAPER_SPLITS[k[2]] for k, n in splits.items())
    _, count = uci.verdicts.paper_scale({n: store.load(root / n) for n in ("uci", "uci-mcd-sghmc")})
    assert str(count) == f"{done} of 108 table cells"


def test_lbfgs_variants_table_from_synthetic_cells():
    from bootens_core.repro import report

    def cell(opt, ds, split, div, layers=1, nv=1e-4):
        return {"optimizer": opt, "dataset": ds, "split": split, "hidden_layers": layers,
                "noise_var_std_units": nv, "diverged_particles": div, "n_components": 200 - div}

    cells = [cell("A", "yacht", 1, 3), cell("A", "yacht", 0, 5), cell("B", "yacht", 0, 0),
             cell("A", "boston", 0, 0, layers=4), cell("B", "energy", 0, 1, nv=1e-3)]
    t = uci.verdicts.lbfgs_variants(cells)
    assert list(t.columns) == ["A", "B"]
    assert t.loc[("0.0001", "yacht", 1), "A"] == "5, 3 of 200"  # split order, not input order
    assert t.loc[("0.0001", "yacht", 1), "B"] == "0 of 200"
    assert t.loc[("0.0001", "boston", 4), "B"] == "not run"
    assert t.loc[("0.001", "energy", 1), "B"] == "1 of 200"
    assert list(t.index.get_level_values(0)) == ["0.0001", "0.0001", "0.001"]  # by sigma^2, then layers


def test_lbfgs_variant_cells_read_the_committed_records():
    """The committed L-BFGS variant records: every cells.csv row comes back, labelled by its config.json."""
    import csv
    import json

    from bootens_core.repro.experiments import uci

    root = Path(__file__).resolve().parents[4] / "results" / "paper" / "uci-lbfgs"
    cells = uci.lbfgs_variant_cells(root)
    folders = [p for p in sorted(root.iterdir()) if (p / "cells.csv").is_file()]
    assert len(cells) == sum(len(list(csv.DictReader((p / "cells.csv").open()))) for p in folders)
    for p in folders:
        c = json.loads((p / "config.json").read_text())
        mine = [r for r in cells if r["record"] == p.name]
        assert {r["optimizer"] for r in mine} == {uci.lbfgs_label(c["lbfgs_linesearch"], c["lbfgs_memory"])}
    labels = {r["optimizer"] for r in cells}
    assert "torch.optim.LBFGS, fixed step (history 100)" in labels and "optax, fixed step (memory 10)" in labels
    with pytest.raises(ValueError, match="unknown L-BFGS linesearch 'bfgs'"):
        uci.lbfgs_label("bfgs", 10)


def _cells_csv(folder: Path, rows):
    folder.mkdir(parents=True)
    recs = []
    for ds, split, meth, layers, rmse, mnll in rows:
        recs.append({"dataset": ds, "split": split, "method": meth, "hidden_layers": layers, "noise_var": 0.1,
                     "noise_var_std_units": 0.01, "test_rmse": rmse, "test_mnll": mnll, "coverage95": 0.95,
                     "wall_s": 1.0, "diverged_particles": 0, "n_components": 200, "selection": "validation"})
    (folder / "cells.csv").write_text(uci.cells_csv(recs))


def test_paper_scale_summary_joins_records(tmp_path):
    # two records on the same splits: ensembles on Yacht and Boston, MC dropout on Yacht only
    _cells_csv(tmp_path / "a", [("yacht", k, "ensemble", 1, 1.0 + k, 2.0) for k in range(3)]
               + [("boston", 0, "ensemble", 1, 3.0, 2.5)])
    _cells_csv(tmp_path / "b", [("yacht", k, "mcd", 4, 0.5, 1.5) for k in range(2)])
    s, cells = uci.paper_scale_summary(tmp_path / "a", tmp_path / "b")
    assert len(cells) == 6
    assert s["datasets"] == ["boston", "yacht"]  # the datasets with a cell, in the paper's order
    by = {(r["dataset"], r["method"], r["hidden_layers"], r["metric"]): r for r in s["rows"]}
    assert by[("yacht", "ensemble", 1, "rmse")]["mean"] == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert by[("yacht", "ensemble", 1, "rmse")]["n_splits"] == 3
    assert by[("yacht", "mcd", 4, "mnll")]["n_splits"] == 2
    t = uci.verdicts.table(s, "rmse")
    assert len(t) == 2 * 6 and t.loc[("yacht (n=308)", "GP"), "ours"] == "not run"
    # the same cell in two records is an error naming it
    _cells_csv(tmp_path / "c", [("yacht", 1, "ensemble", 1, 9.0, 9.0)])
    with pytest.raises(ValueError, match=r"\('yacht', 'ensemble', 1, 1\) is in both"):
        uci.paper_scale_summary(tmp_path / "a", tmp_path / "c")
    with pytest.raises(ValueError, match="at least one record"):
        uci.paper_scale_summary()


def test_gaussian_mnll_is_the_mnll_of_a_gaussian_at_the_rmse():
    from scipy import stats

    errors = np.random.default_rng(0).standard_t(3, size=1000) * 0.7
    rmse = float(np.sqrt(np.mean(errors**2)))
    # A Gaussian centred on the predictions with variance rmse**2, scored on the same errors: closed form.
    direct = -np.mean(stats.norm.logpdf(errors, scale=rmse))
    assert uci.verdicts.gaussian_mnll(rmse) == pytest.approx(direct, rel=1e-12)
    # ... and rmse**2 is the constant variance that minimises it.
    for scale in (0.9 * rmse, 1.1 * rmse):
        assert -np.mean(stats.norm.logpdf(errors, scale=scale)) > direct
    np.testing.assert_allclose(uci.verdicts.gaussian_mnll([1.0, np.e]), [0.5 * np.log(2 * np.pi * np.e)] * 2 + np.array([0, 1]))
    with pytest.raises(ValueError, match="positive RMSEs"):
        uci.verdicts.gaussian_mnll([1.0, 0.0])


def test_uci_mnll_excess_paper_and_ours():
    g = uci.verdicts.gaussian_mnll
    # Ours on Power's GP: splits whose MNLL is exactly their own Gaussian level, and Yacht's 1-layer ensemble 1
    # nat above it on every split.
    rm = np.array([3.8, 4.0, 4.1, 3.9])
    recs = _records({("power", "gp", 0): [(r, g(r), 0.95) for r in rm],
                     ("yacht", "ensemble", 1): [(r, g(r) + 1.0, 0.95) for r in (0.6, 0.8, 0.7)],
                     ("wine", "gp", 0): [(0.6, 0.9, 0.95)],
                     ("concrete", "gp", 0): [(5.0, float("nan"), 0.95), (5.1, 3.0, 0.95)]})
    table, text = uci.verdicts.mnll_excess(recs)
    assert len(table) == 54
    # The paper's GP on Power: 6.92 against the level of RMSE 3.90, its SE from the published SD 2.94 over 10 splits
    # (the RMSE's SD 0.11 adds little).
    e, se = 6.92 - g(3.90), np.hypot(2.94 / np.sqrt(10), 0.11 / np.sqrt(10) / 3.90)
    got_e, got_se = (float(v) for v in table.loc[("power", "GP"), "paper: excess"].split(" ± "))
    assert got_e == pytest.approx(e, abs=0.05) and got_se == pytest.approx(se, abs=0.005)
    assert abs(e - 4.14) < 0.01
    assert table.loc[("power", "GP"), "paper: RMSE, MNLL"] == "3.90, 6.92"
    # Splits at their own level lie at or below the level of the mean RMSE (the log is concave), never above.
    ours = table.loc[("power", "GP"), "ours: excess"]
    want = g(rm).mean() - g(rm.mean())
    assert want < 0 and ours.startswith(f"{want:.2g}") and ours.endswith("(4)")
    assert table.loc[("yacht", "Ensemble 1-layer"), "ours: excess"].startswith("0.99")
    assert table.loc[("wine", "GP"), "ours: excess"] == "— (1 split)"
    assert table.loc[("boston", "GP"), "ours: excess"] == "not run"
    assert table.loc[("concrete", "GP"), "ours: excess"] == "— (not finite on a split of 2)"
    assert table.loc[("naval", "GP"), "paper: excess"] == "— (RMSE rounds to 0)"
    assert "GP: paper 5 above, 0 below of 8, ours 0 above, 0 below of 1" in str(text)
    assert "Ensemble 1-layer: paper" in str(text) and "ours 1 above, 0 below of 1" in str(text)
    assert "Ensemble 4-layer: paper 2 above, 1 below of 8, ours not run" in str(text)


def _calibrated(ds, meth, layers, split, crps, coverages, pit):
    rec = {"dataset": ds, "method": meth, "hidden_layers": layers, "split": split, "test_rmse": 1.0 + split,
           "test_mnll": 2.0, "coverage95": coverages[-1], "test_crps": crps, "pit_counts": pit,
           "wall_s": 1.0, "diverged_particles": 0}
    rec.update({f"coverage{round(100 * lv)}": c for lv, c in zip(uci.verdicts.LEVELS[:-1], coverages[:-1])})
    return rec


def test_calibration_table_pools_the_pit_counts_and_averages_coverage():
    from scipy import stats

    flat, u_shape = [5, 5, 5, 5, 5, 5, 5, 5, 5, 5], [12, 6, 3, 2, 1, 1, 2, 3, 8, 12]
    recs = [_calibrated("boston", "ensemble", 1, s, 1.0 + s, [0.5, 0.6, 0.7, 0.8, 0.9, 0.95], flat)
            for s in range(3)]
    recs += [_calibrated("boston", "deep", 1, s, 2.0, [0.3, 0.4, 0.5, 0.6, 0.7, 0.8 + 0.04 * s], u_shape)
             for s in range(2)]
    recs.append({"dataset": "boston", "method": "gp", "hidden_layers": 0, "split": 0, "test_rmse": 1.0,
                 "test_mnll": 1.0, "coverage95": 0.9})  # a cell made before the calibration fields: left out
    t = uci.verdicts.calibration(recs)
    assert list(t.index) == [("boston", "Ensemble 1-layer"), ("boston", "Deep ensemble")]
    assert list(t.columns) == ["splits", "50%", "60%", "70%", "80%", "90%", "95%", "CRPS", "PIT uniform, p"]
    ens, deep = t.loc[("boston", "Ensemble 1-layer")], t.loc[("boston", "Deep ensemble")]
    assert ens["splits"] == 3 and ens["50%"] == "0.50" and ens["95%"] == "0.95"
    assert ens["CRPS"] == "2.00 ± 0.58"  # mean of 1, 2, 3 and SD 1 / sqrt(3)
    assert ens["PIT uniform, p"] == "1"  # flat pooled counts
    assert deep["95%"] == "0.82" and deep["CRPS"] == "2.00 ± 0"
    assert deep["PIT uniform, p"] == f"{stats.chisquare(np.asarray(u_shape) * 2).pvalue:.2g}"


def test_paired_against_the_practitioners_baselines_on_the_crps():
    recs = [_calibrated("yacht", "ensemble", 1, s, 1.0 + 0.1 * s, [0.5] * 6, [1] * 10) for s in range(4)]
    recs += [_calibrated("yacht", "plain", 1, s, 1.5 + 0.1 * s + 0.01 * (s % 2), [0.5] * 6, [1] * 10)
             for s in range(4)]
    t = uci.verdicts.paired(recs, baselines=uci.PRACTICE_IDS, metrics=("crps",))
    row = t.loc[("yacht", "CRPS", "Ensemble 1-layer", "Plain ensemble 1-layer")]
    assert row["ensemble is"] == "better" and row["splits"] == 4
    # the paper's baselines are not the practitioners': no pair with them here
    assert uci.verdicts.paired(recs, metrics=("crps",)).empty
    with pytest.raises(ValueError, match="unknown metric"):
        uci.verdicts.paired(recs, metrics=("mae",))


def test_paired_for_chosen_ensembles_only():
    recs = [_calibrated("yacht", meth, layers, s, 1.0, [0.5] * 6, [1] * 10)
            for meth, layers in (("ensemble", 1), ("ensemble", 4), ("deep", 1)) for s in range(3)]
    both = uci.verdicts.paired(recs, baselines=uci.PRACTICE_IDS)
    one = uci.verdicts.paired(recs, baselines=uci.PRACTICE_IDS, ensembles=("ensemble-1",))
    assert set(both.index.get_level_values(2)) == {"Ensemble 1-layer", "Ensemble 4-layer"}
    assert set(one.index.get_level_values(2)) == {"Ensemble 1-layer"} and len(one) == 2


def test_marks_name_deviations_artefacts_dropped_restarts_and_tf32():
    cfg = UCIConfig.paper()
    recs = _records({("naval", "gp", 0): [(0.001, -5.0, 0.95)] * 3,
                     ("boston", "sghmc", 1): [(3.0, 2.5, 0.95)] * 4,
                     ("boston", "ensemble", 4): [(20.0, 9.0, 0.5)] * 2})
    s = uci.summarise(recs, UCIConfig(datasets=("boston", "naval"), methods=("gp", "sghmc-1", "ensemble-4")))
    # _records gives split k k diverged particles: 0+1+2+3 = 6 draws of SGHMC, one restart keeps cfg.sghmc.draws
    dropped = 6 // cfg.sghmc.draws
    tf32 = {("boston", "ensemble", 4): 2}
    rmse, mnll = (uci.verdicts.marks(s, m, cfg, tf32) for m in ("rmse", "mnll"))
    assert rmse[("naval", "gp", 0)] == ""  # the GPflow noise bound shapes the MNLL, not the RMSE
    assert mnll[("naval", "gp", 0)] == "noise at GPflow's lower bound"
    # SGHMC at the paper's step (eps = lr) is no deviation: only its dropped restarts are marked
    assert rmse[("boston", "sghmc", 1)] == f"{dropped} of {4 * cfg.sghmc.restarts} restarts dropped (diverged)"
    assert rmse[("boston", "ensemble", 4)] == "zoom line search; TF32 products on 2 of 2 splits"
    t = uci.verdicts.table(s, "mnll", marks=mnll)
    assert t.loc[("naval (n=11934)", "GP"), "made with"] == "noise at GPflow's lower bound"


def _prior_row(ds, rmse, float32=0):
    from bootens_core.repro.experiments.uci.coverage import PriorRow

    mean, sd = uci.paper_reference()[(ds, "ensemble", 4, "rmse")]
    return PriorRow("paper's setting", ds, tuple(rmse), float32, mean, sd)


def test_paper_prior_verdict_follows_its_rule():
    far = _prior_row("boston", [20.0, 25.0, 18.0, 30.0])  # six times the paper's 3.17, every split
    near = _prior_row("yacht", [0.76, 0.74, 0.78, 0.75, 0.77, 0.76, 0.75, 0.77, 0.76, 0.76])
    low = _prior_row("energy", [0.20, 0.21, 0.19, 0.2, 0.21])  # far below the paper's 0.65
    few = _prior_row("concrete", [13.0, 15.0])
    v, t = uci.verdicts.paper_prior([far, few])
    assert str(v).startswith("NOT reproduced") and "1 of 1 testable" in v.evidence
    assert t.loc[("boston", "paper's setting"), "verdict"].startswith("differs (ours higher)")
    assert t.loc[("concrete", "paper's setting"), "verdict"] == "too few splits"
    assert str(uci.verdicts.paper_prior([near])[0]) == "reproduced"
    # a failing dataset beside one where ours is lower: not a clean failure of the setting
    assert str(uci.verdicts.paper_prior([far, low])[0]) == "inconclusive"
    assert str(uci.verdicts.paper_prior([few])[0]) == "too few splits"


def test_grid_sensitivity_pairs_the_finer_cells_with_the_records_on_their_splits():
    """Power: the grid's ensemble is worse than the GP by 0.5 on every split (significantly worse); on the
    finer grid's splits 0-2 it is within ±0.1 of the GP (competitive): that pair moves. MNLL: worse under both
    (does not move). Yacht has no finer cell, so no pair of its appears; split 3 of Power is left out."""
    gp = [(1.0 + 0.1 * k, 2.0 + 0.1 * k, 0.95) for k in range(4)]
    grid = [(r + 0.5 + 0.01 * k, m + 0.5 + 0.02 * k, c) for k, (r, m, c) in enumerate(gp)]
    records = _records({("power", "ensemble", 1): grid, ("power", "gp", 0): gp,
                        ("yacht", "ensemble", 1): grid, ("yacht", "gp", 0): gp})
    for r in records:
        r["noise_var_std_units"] = 0.0316
    finer = [{**r, "test_rmse": r["test_rmse"] - 0.5 + (0.1 if r["split"] % 2 else -0.1),
              "noise_var_std_units": 0.042}
             for r in records if r["dataset"] == "power" and r["method"] == "ensemble" and r["split"] < 3]
    selected, pairs, text = uci.verdicts.grid_sensitivity(records, finer)
    assert list(selected.index) == [("power", "Ensemble 1-layer", s) for s in range(3)]
    assert (selected["σ² (grid)"] == 0.0316).all() and (selected["σ² (finer)"] == 0.042).all()
    assert selected.loc[("power", "Ensemble 1-layer", 1), "RMSE (finer)"] == pytest.approx(1.21)
    assert list(pairs.index) == [("Ensemble 1-layer", "power", "MNLL"), ("Ensemble 1-layer", "power", "RMSE")]
    assert list(pairs["splits"]) == [3, 3]
    assert pairs.loc[("Ensemble 1-layer", "power", "RMSE"), ["grid", "finer", "moves"]].tolist() == [
        "significantly worse", "competitive", "yes"]
    assert pairs.loc[("Ensemble 1-layer", "power", "MNLL"), ["grid", "finer", "moves"]].tolist() == [
        "significantly worse", "significantly worse", "no"]
    assert str(text) == "the verdict moves on 1 of 2 pairs tested on the finer grid's splits"
    # Fewer than 3 splits: no pair, said so; a finer cell without its counterpart is refused.
    _, none, few = uci.verdicts.grid_sensitivity(records, finer[:2])
    assert none.empty and str(few).startswith("no pair yet")
    with pytest.raises(ValueError, match="power/ensemble-1/split 7"):
        uci.verdicts.grid_sensitivity(records, [{**finer[0], "split": 7}])
