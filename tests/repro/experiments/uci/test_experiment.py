"""experiments.uci (Tables 1-3): the paper's reference numbers, verdicts, summaries, the cell list, cells.csv,
the L-BFGS check against scipy, and one tiny end-to-end run through the CLI.

The L-BFGS check and the end-to-end run need the UCI mirror (BOOTENS_DATA_DIR, or ../shared next to the
checkout): without it they skip on a user's machine; in CI (CI=true) the mirror must be there.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import statistics
from pathlib import Path

import jax
import numpy as np
import pytest

from bootens_core.repro import cli, config, harness, store
from bootens_core.repro.config import LBFGSConfig, MCDropoutConfig, NetworkConfig, SGHMCConfig
from bootens_core.repro.experiments.uci.config import UCI_DATASETS, UCI_METHODS
from bootens_core.repro.experiments.uci.config import UCIConfig
from bootens_core.repro.experiments import uci as experiment
from bootens_core.repro.experiments.uci import experiment as uci_experiment
from bootens_core.repro.harness import CELL_FIELDS, Cell

_SHARED = Path(__file__).resolve().parents[4].parent / "shared"
PAPER_CSV = _SHARED / "paper" / "paper_uci_tables.csv"
PACKAGED_CSV = Path(uci_experiment.__file__).resolve().parents[3] / "data" / "paper_uci_tables.csv"
MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(_SHARED / "data" / "uci")
needs_mirror = pytest.mark.skipif(
    not Path(MIRROR).is_dir() and not os.environ.get("CI"), reason=f"no UCI mirror at {MIRROR}"
)


def _read_table(path: Path) -> dict[tuple[str, str, int, str], tuple[float, float]]:
    with open(path, newline="") as fh:
        return {(r["dataset"], r["method"], int(r["hidden_layers"]), r["metric"]): (float(r["mean"]), float(r["std"]))
                for r in csv.DictReader(fh)}


# --------------------------------------------------------------------------------------------------------------
# The paper's numbers


def test_paper_reference_covers_tables_2_and_3():
    ref = experiment.paper_reference()
    assert len(ref) == 108
    expected_keys = {(d, m, layers, metric) for d in UCI_DATASETS for m, layers in experiment.PAPER_METHODS
                     for metric in ("rmse", "mnll")}
    assert set(ref) == expected_keys
    assert all(math.isfinite(m) and s >= 0 for m, s in ref.values())
    assert all(m >= 0 for (*_, metric), (m, _) in ref.items() if metric == "rmse")  # naval prints 0.00
    assert ref == _read_table(PACKAGED_CSV)
    assert ref[("boston", "ensemble", 1, "rmse")] == (3.17, 0.65)


@pytest.mark.skipif(not PAPER_CSV.is_file(), reason=f"no {PAPER_CSV}")
def test_paper_reference_is_the_shared_copy():
    assert experiment.paper_reference() == _read_table(PAPER_CSV)


# --------------------------------------------------------------------------------------------------------------
# verdict against the paper (the statistics themselves: tests/repro/test_uci_stats.py)


@pytest.mark.parametrize(
    ("values", "paper_mean", "paper_std", "expected"),
    [
        ([3.5, 3.4, 3.6, 3.3], 3.17, 0.65, "no significant difference"),  # 0.28 above, SE of the difference 0.23
        ([2.0, 2.1, 1.9, 2.05], 3.17, 0.65, "better"),  # 1.16 below: 5.6 SE
        ([4.5, 4.4, 4.6, 4.5], 3.17, 0.65, "worse"),
        ([-3.0, -3.1, -2.9], -1.0, 0.5, "better"),  # MNLL can be negative; lower is better
        ([0.23, 0.21, 0.25, 0.22, 0.24], 3.82, 4.44, "better"),  # inside the paper's ±1 std, yet 2.6 SE away
        ([0.002, 0.003, 0.001], 0.0, 0.0, "no significant difference"),  # Naval: 0.00 ± 0.00 printed
        ([0.02, 0.021, 0.019], 0.0, 0.0, "worse"),
        ([1.0, math.nan], 1.0, 0.1, "failed"),
        ([1.0, math.inf], 1.0, 0.1, "failed"),
        ([1.0], 1.0, 0.1, "too few splits"),
    ],
)
def test_compare_with_paper_verdicts(values, paper_mean, paper_std, expected):
    assert experiment.compare_with_paper(values, paper_mean, paper_std, 10)["verdict"] == expected


# --------------------------------------------------------------------------------------------------------------
# summarise


def _records(dataset, method, layers, rmse, mnll, cov, diverged=0):
    return [{"dataset": dataset, "split": i, "method": method, "hidden_layers": layers, "test_rmse": r,
             "test_mnll": m, "coverage95": c, "diverged_particles": diverged, "wall_s": 1.5}
            for i, (r, m, c) in enumerate(zip(rmse, mnll, cov, strict=True))]


def test_summarise_hand_made_records():
    ref = _read_table(PACKAGED_CSV)
    (br, brs), (bm, bms) = ref[("boston", "ensemble", 1, "rmse")], ref[("boston", "ensemble", 1, "mnll")]
    (yr, yrs), (ym, yms) = ref[("yacht", "gp", 0, "rmse")], ref[("yacht", "gp", 0, "mnll")]
    wm, _ = ref[("wine", "ensemble", 4, "mnll")]
    groups = {
        # agrees on both metrics: means at the paper's mean + 0.3 std
        ("boston", "ensemble", 1): _records("boston", "ensemble", 1, [br + 0.3 * brs + d for d in (-0.2, 0.0, 0.2)],
                                            [bm + 0.3 * bms + d for d in (-0.05, 0.1, -0.05)], [0.9, 0.95, 1.0], 1),
        # worse RMSE, better MNLL: 3 paper SDs away with a small spread of ours
        ("yacht", "gp", 0): _records("yacht", "gp", 0, [yr + 3 * yrs + 0.1, yr + 3 * yrs + 0.12, yr + 3 * yrs + 0.11],
                                     [ym - 3 * yms - 0.2, ym - 3 * yms - 0.22, ym - 3 * yms - 0.21],
                                     [0.5, 0.75, 0.6], 2),
        # not in the paper: no 2-layer networks
        ("boston", "ensemble", 2): _records("boston", "ensemble", 2, [1.0, 2.0], [3.0, 4.0], [1.0, 1.0]),
        # a failed RMSE, an MNLL that agrees
        ("wine", "ensemble", 4): _records("wine", "ensemble", 4, [0.6, math.nan, 0.6], [wm, wm, wm], [0.9, 0.9, 0.9]),
    }
    records = [r for recs in groups.values() for r in recs]
    cfg = UCIConfig(datasets=("boston", "yacht", "wine"), methods=("ensemble-1", "gp"), n_particles=7)
    s = experiment.summarise(records, cfg)

    rows = {(r["dataset"], r["method"], r["hidden_layers"], r["metric"]): r for r in s["rows"]}
    assert len(rows) == len(s["rows"]) == 4 * 3
    for key, recs in groups.items():
        for metric, col in (("rmse", "test_rmse"), ("mnll", "test_mnll"), ("coverage95", "coverage95")):
            row = rows[(*key, metric)]
            vals = [r[col] for r in recs]
            assert row["n_splits"] == len(recs)
            assert row["diverged_particles"] == sum(r["diverged_particles"] for r in recs)
            if any(math.isnan(v) for v in vals):
                assert math.isnan(row["mean"]) and row["verdict"] == "failed"
                continue
            assert row["mean"] == pytest.approx(statistics.fmean(vals), rel=1e-12)
            assert row["std"] == pytest.approx(statistics.pstdev(vals), rel=1e-9, abs=1e-15)  # ddof = 0
            assert row["sd"] == pytest.approx(statistics.stdev(vals), rel=1e-9, abs=1e-15)  # ddof = 1
            assert row["se"] == pytest.approx(statistics.stdev(vals) / math.sqrt(len(vals)), rel=1e-9, abs=1e-15)
            if metric == "coverage95" or key == ("boston", "ensemble", 2):
                assert row["paper_mean"] is None and row["paper_std"] is None
                assert row["verdict"] == "not in the paper"
            else:
                assert (row["paper_mean"], row["paper_std"]) == ref[(*key, metric)]
                assert row["paper_n_splits"] == 10
                assert row == {**row, **experiment.compare_with_paper(vals, *ref[(*key, metric)], 10),
                               "mean": row["mean"]}
    verdicts = {k: r["verdict"] for k, r in rows.items() if r["paper_mean"] is not None}
    assert verdicts == {
        ("boston", "ensemble", 1, "rmse"): "no significant difference", ("boston", "ensemble", 1, "mnll"): "no significant difference",
        ("yacht", "gp", 0, "rmse"): "worse", ("yacht", "gp", 0, "mnll"): "better",
        ("wine", "ensemble", 4, "rmse"): "failed", ("wine", "ensemble", 4, "mnll"): "no significant difference",
    }
    assert (s["cells_total"], s["cells_no_difference"], s["cells_better"], s["cells_worse"], s["cells_failed"]) == (
        6, 3, 1, 1, 1)
    assert s["cells_too_few"] == 0 and s["level"] == 0.05
    ps = [r["p"] for r in rows.values() if r["paper_mean"] is not None]
    assert s["cells_differ_holm"] == sum(experiment.holm(ps))
    assert s["n_cells"] == len(records) == 11
    assert s["diverged_particles_total"] == 3 * 1 + 3 * 2
    assert s["wall_s_cells_total"] == pytest.approx(1.5 * 11)
    assert (s["datasets"], s["methods"], s["n_particles"]) == (["boston", "yacht", "wine"], ["ensemble-1", "gp"], 7)


# --------------------------------------------------------------------------------------------------------------
# cells and cells.csv


def test_cells_of_the_paper_config():
    cfg = UCIConfig.paper()
    got = experiment.cells(cfg)
    assert len(got) == len(UCI_METHODS) * (10 * 8 + 5)
    for d in UCI_DATASETS:
        for m in UCI_METHODS:
            splits = [c.split for c in got if (c.dataset, c.method) == (d, m)]
            assert splits == list(range(5 if d == "protein" else 10))
    # dataset-major, then method, then split
    assert [(c.dataset, c.method, c.split) for c in got[:3]] == [("boston", "ensemble-1", s) for s in range(3)]
    order = [(UCI_DATASETS.index(c.dataset), UCI_METHODS.index(c.method), c.split) for c in got]
    assert order == sorted(order)
    assert len(set(got)) == len(got)


def test_cells_max_splits_caps():
    got = experiment.cells(UCIConfig(datasets=("protein", "yacht"), methods=("gp",), max_splits=7))
    assert [(c.dataset, c.split) for c in got] == [("protein", s) for s in range(5)] + [("yacht", s) for s in range(7)]
    got = experiment.cells(UCIConfig(datasets=("boston",), methods=("ensemble-4", "gp"), max_splits=2))
    assert [(c.method, c.split) for c in got] == [("ensemble-4", 0), ("ensemble-4", 1), ("gp", 0), ("gp", 1)]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"datasets": ("boston", "atlantis")}, "atlantis"),
        ({"methods": ("gp", "sghmc-4")}, "sghmc-4"),
        ({"datasets": ()}, "no datasets"),
        ({"methods": ()}, "no datasets or no methods"),
        ({"max_splits": -1}, "max_splits"),
    ],
)
def test_cells_bad_config(changes, match):
    with pytest.raises(ValueError, match=match):
        experiment.cells(UCIConfig(**changes))


def test_method_unknown_id():
    with pytest.raises(ValueError, match="sghmc-4"):
        experiment.method("sghmc-4", UCIConfig(), "boston", 13)


def test_cells_csv():
    records = [{f: i + 0.5 for f in CELL_FIELDS} | {"dataset": "yacht", "split": i, "method": "ensemble",
                                                    "hidden_layers": 1, "selection": "x", "val_mnll": [1.0]}
               for i in range(3)]
    records[1]["test_mnll"] = 1 / 3
    records[0]["provenance"] = {"device": {"kind": "NVIDIA H100"}}  # a stored cell names its device
    records[2]["device"] = "cpu"  # a row read back from a cells.csv keeps its own
    text = experiment.cells_csv(records)
    lines = text.splitlines()
    assert lines[0] == ",".join(CELL_FIELDS) + ",device"
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 3 and list(rows[0]) == [*CELL_FIELDS, "device"]  # extra keys (val_mnll) left out
    assert [r["device"] for r in rows] == ["NVIDIA H100", "", "cpu"]
    assert experiment.cell_devices(rows) == {"NVIDIA H100": 1, "cpu": 1, "not recorded": 1}
    assert [int(r["split"]) for r in rows] == [0, 1, 2]
    assert float(rows[1]["test_mnll"]) == pytest.approx(1 / 3, rel=1e-5)
    assert float(rows[2]["test_rmse"]) == 2.5
    assert experiment.cells_csv([]).splitlines() == [",".join(CELL_FIELDS) + ",device"]


# --------------------------------------------------------------------------------------------------------------
# The L-BFGS of the ensembles against scipy (float64)


@needs_mirror
def test_lbfgs_check_against_scipy(monkeypatch):
    monkeypatch.setenv("BOOTENS_DATA_DIR", MIRROR)
    steps = 8
    r = experiment.lbfgs_check(jax.random.key(0), UCIConfig(network=NetworkConfig(width=10)), steps=steps)
    assert r["n_params"] == 13 * 10 + 10 + 10 + 1  # boston: 13 inputs, one hidden layer of 10
    # optax's fixed-step update is -0.5 gamma_k H_k g_k of scipy's inverse-Hessian product, at every step
    assert r["direction_rel_err"].shape == (steps,)
    assert r["direction_rel_err"].max() < 1e-8
    # ensemble.train runs the same particle through the same iterations
    assert r["fixed"].shape == r["train"].shape == (steps,)
    np.testing.assert_allclose(r["train"], r["fixed"], rtol=1e-8)
    # every optimiser starts from the same point
    assert r["scipy"][0] == pytest.approx(r["fixed"][0], rel=1e-12)
    assert r["zoom"][0] == pytest.approx(r["fixed"][0], rel=1e-12)
    # L-BFGS-B's line search enforces sufficient decrease: its curve (start, then one value per iterate)
    # never rises, and its result is its last iterate
    sp = r["scipy"]
    assert 2 <= len(sp) <= steps + 1
    assert np.all(np.diff(sp) <= 1e-12 * np.abs(sp[:-1]))
    assert r["final"]["scipy"] == pytest.approx(sp[-1], rel=1e-12)
    assert r["scipy_nfev"] >= len(sp) - 1
    assert all(np.isfinite(r[k]).all() for k in ("fixed", "zoom", "scipy"))


# --------------------------------------------------------------------------------------------------------------
# End to end through the CLI

ARGV = ["run", "uci", "--profile", "quick", "--datasets", "yacht", "--methods", "ensemble-1", "--set", "max_splits=1",
        "--set", "n_particles=8", "--set", "lbfgs.iters_per_step=1", "--set", "lbfgs.steps=4",
        "--set", "noise_grid=[0.01, 0.1]", "--quiet"]
ROW_KEYS = {"dataset", "method", "hidden_layers", "metric", "mean", "std", "n_splits", "paper_mean", "paper_std",
            "verdict"}


@needs_mirror
def test_cli_run_uci_end_to_end_and_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOTENS_DATA_DIR", MIRROR)
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert cli.main([*ARGV, "--out", str(out)]) == 0

    summary = json.loads((out / "uci" / "summary.json").read_text())
    for k in ("rows", "cells_total", "cells_no_difference", "cells_better", "cells_worse", "cells_too_few"):
        assert k in summary
    rows = summary["rows"]
    assert {r["metric"] for r in rows} == {"rmse", "mnll", "coverage95"}
    for r in rows:
        assert ROW_KEYS <= set(r)
        assert (r["dataset"], r["method"], r["hidden_layers"], r["n_splits"]) == ("yacht", "ensemble", 1, 1)
        assert r["std"] == 0.0  # one split
    assert summary["cells_total"] == 2  # rmse and mnll are in the paper; coverage is not
    assert (summary["cells_no_difference"] + summary["cells_better"] + summary["cells_worse"]
            + summary["cells_failed"] + summary["cells_too_few"]) == 2

    cells = list(csv.DictReader(io.StringIO((out / "uci" / "cells.csv").read_text())))
    assert len(cells) == 1 and list(cells[0]) == [*CELL_FIELDS, "device", *harness.CALIBRATION_FIELDS]
    assert sum(int(c) for c in cells[0]["pit_counts"].split()) == 31  # Yacht's test rows, one PIT value each
    assert cells[0]["device"] == jax.devices()[0].device_kind  # where the cell ran
    assert (cells[0]["dataset"], cells[0]["split"], cells[0]["method"]) == ("yacht", "0", "ensemble")
    assert float(cells[0]["noise_var_std_units"]) in (0.01, 0.1)
    assert store.load(out / "uci").files["cells.csv"] == (out / "uci" / "cells.csv").read_text()

    stored = list((tmp_path / "cache" / "uci-cells").glob("*/yacht/ensemble-1-*/split-0.json"))
    assert len(stored) == 1
    rec = json.loads(stored[0].read_text())
    by_metric = {r["metric"]: r for r in rows}
    assert by_metric["rmse"]["mean"] == pytest.approx(rec["test_rmse"], rel=1e-12)
    assert by_metric["mnll"]["mean"] == pytest.approx(rec["test_mnll"], rel=1e-12)
    assert float(cells[0]["test_rmse"]) == pytest.approx(rec["test_rmse"], rel=1e-5)
    assert rec["noise_grid"] == [0.01, 0.1] and len(rec["val_mnll"]) == 2
    assert rec["n_components"] + rec["diverged_particles"] == 8

    # The same call again reuses the stored cell: nothing recomputed, nothing rewritten.
    mtime = stored[0].stat().st_mtime_ns
    assert cli.main([*ARGV, "--out", str(out)]) == 0
    assert list((tmp_path / "cache" / "uci-cells").glob("*/yacht/ensemble-1-*/split-0.json")) == stored
    assert stored[0].stat().st_mtime_ns == mtime
    assert json.loads((out / "uci" / "summary.json").read_text())["rows"] == rows


def test_cli_run_uci_bad_arguments(capsys):
    assert cli.main(["run", "uci", "--set", "nosuchfield=1", "--quiet"]) == 2
    assert "nosuchfield" in capsys.readouterr().err
    assert cli.main(["run", "uci", "--profile", "quick", "--datasets", "atlantis", "--quiet"]) == 2
    assert "atlantis" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------------
# the cell store: one folder per method family, keyed by what decides that family's numbers


def test_cell_store_paths_follow_only_their_family(tmp_path):
    from bootens_core.repro.harness import Cell

    base = UCIConfig()
    cells = {m: Cell("boston", 3, m) for m in UCI_METHODS}

    def paths(cfg):
        st = uci_experiment._CellStore(tmp_path, cfg)
        return {m: st.path(c) for m, c in cells.items()}

    p0 = paths(base)
    assert p0 == paths(UCIConfig())  # deterministic
    assert p0["ensemble-1"].parent.name.startswith("ensemble-1-") and p0["ensemble-1"].name == "split-3.json"
    # the selection of datasets, methods, splits and the workers change no cell
    assert p0 == paths(UCIConfig(datasets=("boston",), methods=("gp",), max_splits=2, workers=2))
    assert p0 == paths(UCIConfig(workers=0))
    # a family's own setting moves only that family's cells
    for name, value, families in (("n_particles", 7, ("ensemble", "plain")), ("gp.n_inducing", 50, ("gp",)),
                                  ("mcd.samples", 9, ("mcd",)), ("sghmc.lr", 0.1, ("sghmc",)),
                                  ("lbfgs.memory", 5, ("ensemble", "plain")), ("deep.lr", 0.001, ("deep",)),
                                  ("network.width", 7, ("ensemble", "mcd", "sghmc", "plain"))):
        p = paths(config.replace(base, name, value))
        moved = {m for m in UCI_METHODS if p[m] != p0[m]}
        assert moved == {m for m in UCI_METHODS if m.startswith(families)}, name
    # a setting of the protocol moves every cell
    p = paths(UCIConfig(val_fraction=0.25))
    assert all(p[m] != p0[m] for m in UCI_METHODS)
    # a field added to a method's sub-configuration enters its family's key with no list to update
    @dataclasses.dataclass(frozen=True)
    class LBFGSWithKnob(LBFGSConfig):
        knob: int = 0

    off, on = (paths(dataclasses.replace(base, lbfgs=LBFGSWithKnob(knob=v))) for v in (0, 1))
    assert {m for m in UCI_METHODS if on[m] != off[m]} == {"ensemble-1", "ensemble-4", "plain-1", "plain-4"}
    # the run's key chooses the root
    assert experiment.store_dir(jax.random.key(0), base) != experiment.store_dir(jax.random.key(1), base)


def test_each_family_is_keyed_by_the_settings_its_builder_receives():
    """The settings that decide a family's cells are its builder's positional-only parameters, each a field of
    UCIConfig; settings() lists them beside the protocol's."""
    fields = {f.name for f in dataclasses.fields(UCIConfig)}
    names = {f: uci_experiment._setting_names(f) for f in uci_experiment._FAMILIES}
    assert names == {"ensemble": ("network", "lbfgs", "n_particles"), "gp": ("gp",), "mcd": ("network", "mcd"),
                     "sghmc": ("network", "sghmc"), "plain": ("network", "lbfgs", "n_particles"), "deep": ("deep",)}
    assert all(set(v) <= fields for v in names.values())
    cfg = UCIConfig.paper()
    ens = experiment.settings(cfg, ["ensemble-1"])
    assert set(ens) == {"protocol", "network", "lbfgs", "n_particles"} and ens["lbfgs"]["memory"] == 10
    assert ens["protocol"] == {"noise_grid": list(cfg.noise_grid), "val_seed": 0, "val_fraction": 0.2}
    assert set(experiment.settings(cfg, ["gp", "sghmc-1"])) == {"protocol", "gp", "network", "sghmc"}
    assert experiment.settings(cfg, ["ensemble-4", "ensemble-1"]) == ens
    with pytest.raises(ValueError, match="unknown UCI method 'nn-2'"):
        experiment.settings(cfg, ["nn-2"])


@needs_mirror
def test_mcd_cell_on_yacht(monkeypatch):
    """One MC-dropout cell end to end: Gal's grid of the dataset, its selection recorded, scores finite."""
    from bootens_core.baselines import dropout
    from bootens_core.repro import harness
    from bootens_core.data import uci

    monkeypatch.setenv("BOOTENS_DATA_DIR", MIRROR)
    cfg = UCIConfig(mcd=MCDropoutConfig(epochs_x=1, samples=50), network=NetworkConfig(width=8))
    cell = harness.Cell("yacht", 0, "mcd-1")
    rec = experiment.compute_cell(jax.random.key(0), cfg, cell)
    grid = dropout.protocol_grid("yacht")
    info = rec["info"]
    assert info["dropout"] in grid.dropout_rates and info["tau"] in grid.tau_values
    assert (rec["method"], rec["hidden_layers"], rec["n_components"]) == ("mcd", 1, 50)
    assert rec["selection"] == "validation log-likelihood over 4 dropout rates x 3 tau (last 20%)"
    # the likelihood variance is the chosen precision's inverse, in original label units
    assert rec["noise_var"] == pytest.approx(1 / info["tau"], rel=1e-9)
    assert rec["noise_var_std_units"] == pytest.approx(1 / (info["tau"] * uci.load("yacht", 0).y_std ** 2), rel=1e-9)
    assert all(math.isfinite(rec[k]) for k in ("test_rmse", "test_mnll", "coverage95"))


@needs_mirror
def test_sghmc_cell_on_yacht(monkeypatch):
    """One SGHMC cell end to end: sigma^2 selected on the validation grid, restarts x draws as components."""
    from bootens_core.repro import harness

    monkeypatch.setenv("BOOTENS_DATA_DIR", MIRROR)
    cfg = UCIConfig(network=NetworkConfig(width=8), sghmc=SGHMCConfig(restarts=2, draws=3, burn_in=50, thin=5),
                    noise_grid=(0.01, 0.1))
    rec = experiment.compute_cell(jax.random.key(0), cfg, harness.Cell("yacht", 0, "sghmc-1"))
    assert (rec["method"], rec["hidden_layers"]) == ("sghmc", 1)
    assert rec["n_components"] + rec["diverged_particles"] == 2 * 3
    assert rec["noise_var_std_units"] in (0.01, 0.1) and len(rec["val_mnll"]) == 2
    assert rec["info"]["step_size"] == pytest.approx(cfg.sghmc.lr)  # lr_scaling "none": eps = lr
    assert rec["info"]["batch_size"] == cfg.sghmc.batch_size
    assert all(math.isfinite(rec[k]) for k in ("test_rmse", "test_mnll", "coverage95"))


@needs_mirror
def test_sghmc_step_study_rows(monkeypatch):
    monkeypatch.setenv("BOOTENS_DATA_DIR", MIRROR)
    cfg = UCIConfig(network=NetworkConfig(width=8), sghmc=SGHMCConfig(restarts=3, draws=4, burn_in=50, thin=5))
    st = experiment.sghmc_step_study(jax.random.key(0), cfg, dataset="yacht", step_sizes=(1e-3, 1e-2), noise_var=0.01)
    assert [r["step_size"] for r in st["rows"]] == [1e-3, 1e-2]
    assert (st["dataset"], st["split"], st["noise_var_std_units"]) == ("yacht", 0, 0.01)
    for r in st["rows"]:
        assert 0 <= r["diverged_restarts"] <= 3 and r["rhat_mean"] >= 0.9 and r["rhat_max"] >= r["rhat_mean"] * (1 - 1e-12)
        assert math.isfinite(r["test_rmse"]) and 0 <= r["coverage95"] <= 1
    assert st["settings"]["restarts"] == 3


def test_expand_methods():
    assert experiment.expand_methods(["mcd,sghmc"]) == ["mcd-1", "mcd-4", "sghmc-1"]
    assert experiment.expand_methods(["gp", "ensemble-4", "gp"]) == ["gp", "ensemble-4"]
    assert experiment.expand_methods(["ensemble"]) == ["ensemble-1", "ensemble-4"]
    with pytest.raises(ValueError, match="'mc'"):
        experiment.expand_methods(["mc"])
    # the CLI takes families and says what is wrong with an unknown one
    assert cli.main(["run", "uci", "--methods", "dropout", "--out", "/nonexistent"]) == 2


@pytest.mark.parametrize("n,expected", [(2000, {}), (2001, {"gradient": "closed_form"})])
def test_gp_cells_take_the_closed_form_gradient_above_2000_rows(monkeypatch, n, expected):
    """GP cells on more than 2000 training rows (exact GPR on Kin8nm, Naval, Power; SGPR on Protein) ask
    gp.fit_predict for the closed-form gradient; smaller ones call it exactly as before (their committed
    cells stay valid)."""
    from bootens_core.baselines import gp

    calls = []

    def fake(key, x, y, x_eval, **kw):
        calls.append(kw)
        m = len(x_eval)
        return gp.GPFit(np.zeros(m), np.ones(m), 0.1, 1.0, 1.0, 0.0, 1, True, kw["method"], "fake")

    monkeypatch.setattr(gp, "fit_predict", fake)
    cfg = UCIConfig.quick()
    x, xe = np.zeros((n, 2)), np.zeros((3, 2))
    pred = experiment.method("gp", cfg, "kin8nm", 2).fit(jax.random.key(0), x, np.zeros(n), xe, None)
    got = {k: v for k, v in calls[-1].items() if k not in ("method", "n_inducing", "max_iter")}
    assert got == expected and calls[-1]["method"] == "gpr"
    assert pred.info["gradient"] == expected.get("gradient", "autodiff")
    pred = experiment.method("gp", cfg, "protein", 2).fit(jax.random.key(0), x, np.zeros(n), xe, None)
    got = {k: v for k, v in calls[-1].items() if k not in ("method", "n_inducing", "max_iter")}
    assert got == expected and calls[-1]["method"] == "svgp"
    assert pred.info["gradient"] == expected.get("gradient", "autodiff")


def test_workers_zero_runs_a_cell_per_usable_core_at_most_two(monkeypatch):
    """The quick profile's workers = 0: one cell at a time for a process held to one core (the book's build
    holds each chapter to one), two with two cores or more; the run hands that number to the harness."""
    assert UCIConfig.quick().workers == 0 and UCIConfig().workers == 1
    for cores, expected in ((1, 1), (2, 2), (16, 2)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)), raising=False)
        assert UCIConfig(workers=0).cell_workers == expected
    assert UCIConfig(workers=3).cell_workers == 3
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="workers must be a non-negative integer"):
            UCIConfig(workers=bad)

    seen = []

    class Stop(Exception):
        pass

    def run_cells(cells, compute, cell_store, *, workers, **kw):
        seen.append(workers)
        raise Stop

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(uci_experiment.harness, "run_cells", run_cells)
    with pytest.raises(Stop):
        experiment.run(jax.random.key(0), UCIConfig(datasets=("yacht",), methods=("gp",), max_splits=1, workers=0))
    assert seen == [1]



def test_plain_ensemble_is_the_unperturbed_training_of_the_same_particles():
    """plain-1 trains the ensembles' particles on the MAP loss with neither labels nor prior perturbed:
    exactly ensemble.train with both perturbations off, and not the bootstrap ensemble's particles."""
    from bootens_core import ensemble, models

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    cfg = config.replace(config.replace(UCIConfig(n_particles=4), "lbfgs.steps", 2), "lbfgs.iters_per_step", 5)
    key = jax.random.key(3)
    plain = experiment.method("plain-1", cfg, "boston", 3).fit(key, x, y, x[:7], 0.1)
    boot = experiment.method("ensemble-1", cfg, "boston", 3).fit(key, x, y, x[:7], 0.1)
    model = models.mlp(3, (cfg.network.width,), "relu", weight_var=cfg.network.weight_var,
                       bias_var=cfg.network.bias_var, scale_by_fan_in=cfg.network.scale_by_fan_in)
    opt = experiment.ensemble_optimizer(cfg)
    res = ensemble.train(key, model, x, y, noise_var=0.1, n_particles=4, opt=opt, steps=opt.steps_for(10),
                         perturb_labels=False, perturb_prior=False, on_diverged="report",
                         dtype=jax.numpy.dtype(cfg.network.dtype))
    want = np.asarray(models.predict(model, res.params, jax.numpy.asarray(x[:7], cfg.network.dtype)), np.float64)
    np.testing.assert_array_equal(plain.f, want)
    assert plain.f.shape == (4, 7) and not np.allclose(plain.f, boot.f)
    assert experiment.method("plain-1", cfg, "boston", 3).id == "plain-1"


def test_deep_ensemble_method_is_the_baselines_fit_with_a_variance_per_network_and_point():
    from bootens_core.baselines import deep_ensemble

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(60, 3)), rng.normal(size=60)
    cfg = UCIConfig()
    assert cfg.deep.lr == 0.01 and cfg.deep.n_networks == 5  # the harness's deviation: 0.01, not 0.1
    key = jax.random.key(4)
    m = experiment.method("deep-1", cfg, "boston", 3)
    assert (m.id, m.select_noise) == ("deep-1", False)  # learns its variance: no sigma^2 grid
    pred = m.fit(key, x, y, x[:9], None)
    ens = deep_ensemble.fit(key, x, y, hidden=(50,), n_networks=5, epochs=40, batch_size=100, lr=0.01,
                            adversarial_eps=0.01)
    mu, var = deep_ensemble.predict(ens, x[:9])
    np.testing.assert_array_equal(pred.f, mu)
    np.testing.assert_array_equal(pred.var, var)
    assert pred.f.shape == pred.var.shape == (5, 9) and pred.noise_var == pytest.approx(float(np.mean(var)))
    assert pred.info["width"] == 50
    assert experiment.method("deep-1", cfg, "protein", 9).fit(key, x[:, :3].repeat(3, 1), y, x[:2].repeat(3, 1),
                                                              None).info["width"] == 100
    # the cost of a cell grows with rows x the network's parameters x epochs
    assert experiment.cost_units("deep-1", "protein", cfg) / experiment.cost_units("deep-1", "boston", cfg) == \
        pytest.approx(41157 * (10 * 100 + 2 * 101) / (455 * (14 * 50 + 2 * 51)))


def test_deep_lr_check_runs_the_cells_at_each_learning_rate(monkeypatch):
    calls = []

    def fake_cell(key, cfg, cell):
        calls.append((cfg.deep.lr, cell))
        return {"dataset": cell.dataset, "split": cell.split, "test_rmse": 100 * cfg.deep.lr + cell.split,
                "test_mnll": 1.0, "diverged_particles": int(cfg.deep.lr > 0.05)}

    monkeypatch.setattr(uci_experiment, "compute_cell", fake_cell)
    rows = experiment.deep_lr_check(jax.random.key(0), UCIConfig(), learning_rates=(0.1, 0.01),
                                    datasets=("yacht",), splits=3)
    assert [c for _, c in calls] == [Cell("yacht", s, "deep-1") for s in range(3)] * 2
    assert [lr for lr, _ in calls] == [0.1] * 3 + [0.01] * 3 and [r["lr"] for r in rows] == [0.1] * 3 + [0.01] * 3
    t = experiment.verdicts.deep_lr(rows)
    assert t.loc[("0.1", "yacht"), "RMSE"] == "11.00 ± 0.58" and t.loc[("0.1", "yacht"), "networks diverged"] == 3
    assert t.loc[("0.01", "yacht"), "worst split RMSE"] == "3.00"
    with pytest.raises(ValueError, match="at least one learning rate"):
        experiment.deep_lr_check(jax.random.key(0), UCIConfig(), learning_rates=())
