"""A UCI run that fits a short device window: priority order, cell-time estimates, the time budget (with a fake
clock and injected cell times), shards, GP skipped without TensorFlow (and no TF/GPflow/ArviZ/pooch imported by
the other cells), provenance of new cell records, and packs folded back into a record."""

from __future__ import annotations

import collections
import csv
import io
import dataclasses
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from bootens_core.data import uci as uci_data
from bootens_core.repro import cellpack, cli, config, harness
from bootens_core.repro.config import LBFGSConfig, as_dict
from bootens_core.repro.experiments.uci.config import UCIConfig
from bootens_core.repro.experiments import uci
from bootens_core.repro.harness import CELL_FIELDS, Cell

_BESIDE = Path(__file__).resolve().parents[4].parent / "shared" / "data" / "uci"
MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(_BESIDE)
needs_mirror = pytest.mark.skipif(not Path(MIRROR).is_dir(), reason=f"no UCI mirror at {MIRROR}")
DEVICE = jax.devices()[0].device_kind


def _cfg(**changes) -> UCIConfig:
    return type(UCIConfig.quick())(**{**UCIConfig.quick().__dict__, **changes})


def _fake_record(cell: Cell, wall_s: float, device: str = DEVICE) -> dict:
    family, _, layers = cell.method.partition("-")
    rec = {f: 0.0 for f in CELL_FIELDS}
    rec.update(dataset=cell.dataset, split=cell.split, method=family, hidden_layers=int(layers or 0),
               wall_s=float(wall_s), diverged_particles=0, n_components=1, selection="fake", compile_s=0.0,
               provenance={"device": {"kind": device}})
    return rec


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# --------------------------------------------------------------------------------------------------------------
# priority order and cost units


def test_priority_order_of_the_paper_cells():
    order = uci.priority(uci.cells(UCIConfig.paper()))
    assert sorted(order) == sorted(uci.cells(UCIConfig.paper())) and len(order) == 9 * (8 * 10 + 5)
    # method blocks: ensembles (4 layers first), then MC dropout, SGHMC, GP; the baselines beyond the paper's
    # columns last
    blocks = list(dict.fromkeys(c.method for c in order))
    assert blocks == ["ensemble-4", "ensemble-1", "mcd-4", "mcd-1", "sghmc-1", "gp", "deep-1", "plain-1", "plain-4"]
    # within a method: protein, naval, power, kin8nm, then the rest by decreasing training size; splits
    # ascending
    e4 = [c for c in order if c.method == "ensemble-4"]
    assert list(dict.fromkeys(c.dataset for c in e4)) == [
        "protein", "naval", "power", "kin8nm", "wine", "concrete", "energy", "boston", "yacht"]
    rest = list(uci.PRIORITY_DATASETS[4:])
    assert rest == sorted(rest, key=lambda d: -uci.TRAIN_SHAPES[d][0])
    assert [c.split for c in e4[:5]] == [0, 1, 2, 3, 4] and e4[5] == Cell("naval", 0, "ensemble-4")
    assert order[0] == Cell("protein", 0, "ensemble-4") and order[-1] == Cell("yacht", 9, "plain-4")


@needs_mirror
def test_train_shapes_and_cost_units(monkeypatch):
    from bootens_core.baselines import dropout

    monkeypatch.setenv("BOOTENS_DATA_DIR", MIRROR)
    cfg = UCIConfig.paper()
    for name in ("yacht", "boston"):
        s = uci_data.load(name, 0)
        assert uci.TRAIN_SHAPES[name] == s.x_train.shape
        epochs = dropout.protocol_grid(name).n_epochs
        assert uci.cost_units("mcd-1", name, cfg) == epochs * uci.cost_units("ensemble-1", name, cfg)
    n, d = uci.TRAIN_SHAPES["yacht"]
    assert uci.cost_units("ensemble-1", "yacht", cfg) == n * ((d + 1) * 50 + 51)
    assert uci.cost_units("ensemble-4", "yacht", cfg) == n * ((d + 1) * 50 + 3 * 51 * 50 + 51)
    assert uci.cost_units("sghmc-1", "yacht", cfg) == pytest.approx(
        ((d + 1) * 50 + 51) * (10 * (2000 + 2000 * 20) * 20 + 10 * 20 * 0.2 * n))  # minibatches: ~ flat in n
    assert uci.cost_units("gp", "yacht", cfg) == n**3
    assert uci.cost_units("gp", "protein", cfg) == uci.TRAIN_SHAPES["protein"][0] * 400**2  # SVGP


# --------------------------------------------------------------------------------------------------------------
# the estimate rule


def test_cell_time_estimates_follow_the_documented_rule():
    units = {("ensemble-1", "small"): 1.0, ("ensemble-1", "big"): 8.0, ("ensemble-4", "small"): 4.0}
    times = cellpack.CellTimes(lambda m, d: units[(m, d)], device="cpu", default_s=600.0, safety=1.25)
    small, big = Cell("small", 0, "ensemble-1"), Cell("big", 0, "ensemble-1")
    deep = Cell("small", 0, "ensemble-4")
    assert times.estimate(small) == 600.0  # nothing measured: the default
    times.add(cellpack.Measurement("ensemble-1", "small", "cpu", wall_s=12.0, compile_s=2.0))
    times.add(cellpack.Measurement("ensemble-1", "small", "cpu", wall_s=9.0, compile_s=0.5))  # a faster split
    assert times.estimate(small) == pytest.approx(1.25 * (10.0 + 2.0))  # largest compute + largest compile
    times.warm("ensemble-1", "small")
    assert times.estimate(small) == pytest.approx(1.25 * 10.0)  # compiled already in this process
    assert times.estimate(big) == pytest.approx(1.25 * (10.0 * 8 + 2.0))  # scaled up linearly
    assert times.estimate(deep) == pytest.approx(1.25 * (10.0 * 4 + 2.0))  # across depths of one family
    assert times.estimate(Cell("small", 0, "mcd-1")) == 600.0  # another family: not scaled from ensembles
    # A bigger dataset's time bounds a smaller one's (never scaled down); the tightest bound wins.
    times.add(cellpack.Measurement("ensemble-1", "big", "cpu", wall_s=30.0, compile_s=None))
    assert times.estimate(big) == pytest.approx(1.25 * (30.0 + 2.0))
    assert times.estimate(small) == pytest.approx(1.25 * 10.0)
    # Tiers: own cells on this device, then references on it, then own cells anywhere, then references.
    gpu = cellpack.CellTimes(lambda m, d: units[(m, d)], device="gpu", safety=1.0)
    gpu.add(cellpack.Measurement("ensemble-1", "small", "cpu", 100.0, 0.0, own=True))
    assert gpu.estimate(small) == 100.0
    gpu.add(cellpack.Measurement("ensemble-1", "small", "gpu", 7.0, 0.0, own=False))
    assert gpu.estimate(small) == 7.0
    gpu.add(cellpack.Measurement("ensemble-1", "big", "gpu", 16.0, 0.0, own=True))
    assert gpu.estimate(small) == 16.0 and gpu.estimate(big) == 16.0


def test_a_family_measured_only_on_another_device_gets_one_probe():
    """Estimates from another device (a CPU record) can overstate an accelerator's time so much that no
    cell of the family would ever fit: its cheapest pending cell may start once, as a probe, while enough
    is left."""
    units = {("ensemble-1", "small"): 1.0, ("ensemble-1", "big"): 8.0, ("ensemble-4", "small"): 4.0,
             ("mcd-1", "small"): 1.0}
    small, big = Cell("small", 0, "ensemble-1"), Cell("big", 0, "ensemble-1")
    deep = Cell("small", 0, "ensemble-4")
    pending = [deep, big, small, Cell("small", 1, "ensemble-1"), Cell("small", 0, "mcd-1")]

    def fresh(**kw):
        times = cellpack.CellTimes(lambda m, d: units[(m, d)], device="gpu", **kw)
        times.add(cellpack.Measurement("ensemble-1", "small", "cpu", 1000.0, 0.0, own=False))
        return times

    times = fresh()
    assert not times.measured_here("ensemble-4")
    # only the family's cheapest pending cell (the first of equals), with half the budget and 60 s left
    assert not times.probe(deep, pending, 480.0, 480.0) and not times.probe(big, pending, 480.0, 480.0)
    assert not times.probe(small, pending, 239.0, 480.0) and not times.probe(small, pending, 59.0, 100.0)
    assert times.probed == []
    assert times.probe(small, pending, 240.0, 480.0) and times.probed == [small]
    assert not times.probe(Cell("small", 1, "ensemble-1"), pending[3:], 480.0, 480.0)  # once per family
    assert times.probe(Cell("small", 0, "mcd-1"), pending, 480.0, 480.0)  # another family has its own
    assert fresh().probe(small, pending, 1e9, None) and fresh().probe(small, pending, None, None)  # no budget
    # measured on this device (own or reference): the ordinary rule, no probe
    times = fresh()
    times.add(cellpack.Measurement("ensemble-4", "small", "gpu", 5.0, 1.0, own=False))
    assert times.measured_here("ensemble-1") and not times.probe(small, pending, 480.0, 480.0)
    with pytest.raises(ValueError, match="probe share"):
        fresh(probe_share=1.5)
    with pytest.raises(ValueError, match="least time left for a probe"):
        fresh(probe_min_s=-1.0)


def test_admissible_counts_the_running_cells():
    assert cellpack.admissible(10.0, now=0.0, deadline=None)
    assert cellpack.admissible(10.0, now=5.0, deadline=15.0) and not cellpack.admissible(10.0, 5.1, 15.0)
    # one cell of 10 s started at t=0 and one starting now at t=4, two workers: the running one has done at
    # least 4 / 2 = 2 s of its work, so 8 s are committed
    assert cellpack.admissible(10.0, 4.0, 22.0, running=[(10.0, 0.0)], workers=2)
    assert not cellpack.admissible(10.0, 4.0, 21.9, running=[(10.0, 0.0)], workers=2)
    assert cellpack.admissible(10.0, 30.0, 40.0, running=[(10.0, 0.0)], workers=2)  # over its estimate: 0 left


# --------------------------------------------------------------------------------------------------------------
# budgeted runs with a fake clock and injected cell times


def _budget_setup(tmp_path):
    """Ensembles with 1 and 4 layers on Boston and Yacht, 3 splits; split 2 of each stored already with a time
    proportional to the cell's cost units (so every estimate is exact), splits 0 and 1 pending."""
    cfg = _cfg(datasets=("boston", "yacht"), methods=("ensemble-1", "ensemble-4"), max_splits=3, workers=1)
    key = jax.random.key(cfg.seed)
    secs = {(m, d): uci.cost_units(m, d, cfg) / 1e5 for m in cfg.methods for d in cfg.datasets}
    st = uci.experiment._CellStore(tmp_path / "cells", cfg)
    for (m, d), s in secs.items():
        st.put(Cell(d, 2, m), _fake_record(Cell(d, 2, m), s))
    clock, calls = FakeClock(), []

    def compute(cell):
        calls.append(cell)
        clock.t += secs[(cell.method, cell.dataset)]
        return _fake_record(cell, secs[(cell.method, cell.dataset)])

    def run(budget):
        return uci.run_pending(key, cfg, budget_s=budget, compute=compute, clock=clock, safety=1.0,
                               root=tmp_path / "cells")

    pending = [c for c in uci.priority(uci.cells(cfg)) if c.split < 2]
    return run, calls, clock, secs, pending


def test_budget_runs_the_cells_that_fit_in_priority_order(tmp_path):
    run, calls, clock, secs, pending = _budget_setup(tmp_path)
    assert [c.method for c in pending[:4]] == ["ensemble-4"] * 4 and pending[0].dataset == "boston"
    got = run(83.0)
    # The documented rule by hand: start the first pending cell (priority order) whose time fits in what is
    # left; boston ensemble-4 takes 38.2 s, yacht ensemble-4 22.3 s, boston ensemble-1 3.4 s, yacht 1.1 s.
    expected, t = [], 0.0
    for cell in pending:
        if t + secs[(cell.method, cell.dataset)] <= 83.0:
            expected.append(cell)
            t += secs[(cell.method, cell.dataset)]
    assert calls == got.ran == expected
    assert [(c.dataset, c.method, c.split) for c in expected] == [
        ("boston", "ensemble-4", 0), ("boston", "ensemble-4", 1),  # 76.4 s: yacht ensemble-4 no longer fits
        ("boston", "ensemble-1", 0), ("yacht", "ensemble-1", 0), ("yacht", "ensemble-1", 1)]  # nor boston 1
    assert clock.t <= 83.0
    assert [c for c, _ in got.remaining] == [c for c in pending if c not in expected]
    assert [e for _, e in got.remaining] == pytest.approx(
        [secs[(c.method, c.dataset)] for c, _ in got.remaining])
    # The next window resumes with what is left, in priority order.
    calls.clear()
    again = run(None)
    assert calls == again.ran == [c for c, _ in got.remaining] and again.remaining == []


def test_budget_too_small_for_any_cell_starts_none(tmp_path):
    run, calls, clock, secs, pending = _budget_setup(tmp_path)
    got = run(1.0)  # the cheapest cell takes 1.1 s
    assert calls == [] and got.ran == [] and clock.t == 0.0
    assert [c for c, _ in got.remaining] == pending


def test_a_window_on_a_new_device_probes_then_reaches_the_larger_cells(tmp_path):
    """The only times known are a CPU record's, far above the window (as on a GPU's first window): the
    cheapest ensemble cell starts as a probe, and the cells its measured time bounds follow in priority
    order."""
    cfg = _cfg(datasets=("boston", "yacht"), methods=("ensemble-1", "ensemble-4"), max_splits=2, workers=1)
    secs = {(m, d): uci.cost_units(m, d, cfg) / 1e5 for m in cfg.methods for d in cfg.datasets}
    clock, calls = FakeClock(), []

    def compute(cell):
        calls.append(cell)
        clock.t += secs[(cell.method, cell.dataset)]
        return _fake_record(cell, secs[(cell.method, cell.dataset)])

    cpu = [cellpack.Measurement("ensemble-1", "yacht", "a CPU elsewhere", 1000.0, 0.0)]
    got = uci.run_pending(jax.random.key(cfg.seed), cfg, budget_s=100.0, references=cpu, compute=compute,
                          clock=clock, safety=1.0, root=tmp_path / "cells")
    assert calls[0] == Cell("yacht", 0, "ensemble-1") and calls == got.ran  # the probe: the cheapest cell
    assert any(n.startswith("probe: yacht/ensemble-1") for n in got.notes)
    # then, scaled up from the probe's 1.1 s by cost units (never down), whatever fits in priority order:
    # boston ensemble-4 (38.2 s) twice fits in the 100 s, then the smaller cells
    assert [(c.dataset, c.method) for c in calls[1:3]] == [("boston", "ensemble-4")] * 2
    assert clock.t <= 100.0 and len(calls) > 3
    # without references or any measurement (estimates of 600 s) the same; a window under 60 s starts none
    for budget, first in ((100.0, [Cell("yacht", 0, "ensemble-1")]), (50.0, [])):
        clock.t, calls[:] = 0.0, []
        got = uci.run_pending(jax.random.key(cfg.seed), cfg, budget_s=budget, compute=compute, clock=clock,
                              safety=1.0, root=tmp_path / f"fresh-{budget}")
        assert calls[:1] == first


@needs_mirror
def test_cli_budget_too_small_lists_everything_remaining(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("BOOTENS_DATA_DIR", MIRROR)

    def never(*args, **kwargs):
        raise AssertionError("a cell was started")

    monkeypatch.setattr(uci.experiment, "compute_cell", never)
    pack = tmp_path / "back" / "cells-0.tar.gz"
    argv = ["run", "uci", "--profile", "quick", "--quiet", "--datasets", "yacht", "--methods", "ensemble-1",
            "mcd-1", "--set", "max_splits=2", "--time-budget", "5", "--pack", str(pack),
            "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("bootens: remaining")]
    assert lines == ["bootens: remaining yacht/ensemble-1: 2 cell(s), ~1200 s estimated",
                     "bootens: remaining yacht/mcd-1: 2 cell(s), ~1200 s estimated",
                     "bootens: remaining in all: 4 cell(s), ~2400 s estimated"]
    assert "ran 0 cell(s)" in err and "nothing written" in err and not (tmp_path / "o" / "uci").exists()
    manifest, members = cellpack.read_pack(pack)
    assert members == {} and len(manifest["remaining"]) == 4 and manifest["budget_s"] == 5.0


def test_concurrent_cells_share_the_budget(tmp_path):
    """Two workers, cells estimated at 10 s, a clock that stands still: a budget of 15 s never lets two cells
    run at once (10 + 10 > 15); 25 s does."""
    cells = [Cell("yacht", s, "ensemble-1") for s in range(4)]
    for budget, most in ((15.0, 1), (25.0, 2)):
        lock, now, peak = threading.Lock(), [0], [0]

        def compute(cell, lock=lock, now=now, peak=peak):
            with lock:
                now[0] += 1
                peak[0] = max(peak[0], now[0])
            time.sleep(0.15)
            with lock:
                now[0] -= 1
            return _fake_record(cell, 10.0)

        got = cellpack.run_budgeted(cells, compute, harness.CellStore(tmp_path / str(budget)),
                                    estimate=lambda c: 10.0, budget_s=budget, workers=2, clock=lambda: 0.0)
        assert peak[0] == most
        assert sorted(c for c, _ in got.done) == cells and got.remaining == [] and got.failed == []


def test_a_failing_cell_is_reported_and_the_others_go_on(tmp_path):
    cells = [Cell("yacht", s, "ensemble-1") for s in range(3)]

    def compute(cell):
        if cell.split == 1:
            raise RuntimeError("every sigma^2 of the grid diverged\nmore")
        return _fake_record(cell, 1.0)

    got = cellpack.run_budgeted(cells, compute, harness.CellStore(tmp_path), estimate=lambda c: 1.0)
    assert [c for c, _ in got.done] == [cells[0], cells[2]] and got.remaining == [cells[1]]
    assert got.failed == [(cells[1], "RuntimeError: every sigma^2 of the grid diverged")]


# --------------------------------------------------------------------------------------------------------------
# shards


def _record(folder, cfg, cells_):
    """A committed record folder: ``config.json`` of ``cfg`` and a ``cells.csv`` row per cell."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(as_dict(cfg)))
    rows = [{"dataset": c.dataset, "split": c.split, "method": c.method.partition("-")[0],
             "hidden_layers": int(c.method.partition("-")[2] or 0), "noise_var": 0.1, "noise_var_std_units": 0.01,
             "test_rmse": 1.0, "test_mnll": 1.0, "coverage95": 0.95, "wall_s": 1.0, "diverged_particles": 0,
             "n_components": 200, "selection": "validation"} for c in cells_]
    (folder / "cells.csv").write_text(uci.cells_csv(rows))
    return folder


def test_recorded_cells_are_the_rows_made_at_these_settings(tmp_path):
    cfg = _cfg(datasets=("boston", "yacht"), methods=("ensemble-1", "ensemble-4"), max_splits=3, workers=1)
    same = _record(tmp_path / "uci", cfg, [Cell("boston", 0, "ensemble-1"), Cell("yacht", 1, "ensemble-4"),
                                           Cell("yacht", 7, "ensemble-1"),  # a split outside max_splits
                                           Cell("boston", 0, "mcd-4")])  # a method outside the selection
    # another optimizer: its ensemble rows are other cells; its number of workers decides nothing
    other = _record(tmp_path / "fixed", dataclasses.replace(cfg, lbfgs=LBFGSConfig(linesearch=None), workers=2),
                    [Cell("boston", 1, "ensemble-1")])
    assert uci.recorded_cells([same, other], cfg) == {Cell("boston", 0, "ensemble-1"), Cell("yacht", 1, "ensemble-4")}
    assert uci.recorded_cells([other], dataclasses.replace(cfg, lbfgs=LBFGSConfig(linesearch=None))) == {
        Cell("boston", 1, "ensemble-1")}
    with pytest.raises(ValueError, match="--skip-recorded .*nowhere: no readable config.json"):
        uci.recorded_cells([tmp_path / "nowhere"], cfg)


def test_a_window_passes_over_the_recorded_cells(tmp_path):
    cfg = _cfg(datasets=("boston", "yacht"), methods=("ensemble-1",), max_splits=3, workers=1)
    held = {Cell("yacht", 0, "ensemble-1"), Cell("yacht", 1, "ensemble-1"), Cell("boston", 2, "ensemble-1")}
    calls = []

    def compute(cell):
        calls.append(cell)
        return _fake_record(cell, 1.0)

    got = uci.run_pending(jax.random.key(cfg.seed), cfg, compute=compute, root=tmp_path / "cells", recorded=held)
    assert set(calls) == set(uci.cells(cfg)) - held and got.remaining == []
    assert "passed over 3 cell(s) that the records given already hold at these settings" in got.notes
    # on the command line
    rec = _record(tmp_path / "rec", UCIConfig.quick(), [Cell("boston", 0, "ensemble-1")])
    assert uci.recorded_cells([rec], UCIConfig.quick()) == {Cell("boston", 0, "ensemble-1")}


def test_at_once_runs_the_splits_of_a_dataset_and_method_as_one_group(tmp_path):
    # Yacht and Boston, ensemble-1 and MC dropout, 3 splits: the ensemble's pending splits of a dataset go to
    # the computation together (in the shard's priority order); MC dropout's one by one; every cell is stored
    # and packed; a stored cell is not computed again; the budget admits a group when its estimates' sum fits.
    cfg = _cfg(datasets=("boston", "yacht"), methods=("ensemble-1", "mcd-1"), max_splits=3, workers=1)
    root = tmp_path / "cells"
    pre = uci.run_pending(jax.random.key(0), cfg, budget_s=None, compute=lambda c: _fake_record(c, 1.0),
                          root=root)  # everything, then one cell removed again: 1 stored of boston's 3
    for c in uci.cells(cfg):
        if c != Cell("boston", 1, "ensemble-1"):
            next(root.glob(f"{c.dataset}/{c.method}-*/split-{c.split}.json")).unlink()
    assert len(pre.ran) == 12
    calls = []

    def compute(cells_):
        calls.append(list(cells_))
        return [_fake_record(c, 2.0) for c in cells_]

    pack = tmp_path / "p.tar.gz"
    got = uci.run_pending(jax.random.key(0), cfg, compute=compute, root=root, at_once=True, pack=pack)
    groups = [[(c.dataset, c.split, c.method) for c in g] for g in calls]
    assert [("boston", 0, "ensemble-1"), ("boston", 2, "ensemble-1")] in groups
    assert [("yacht", 0, "ensemble-1"), ("yacht", 1, "ensemble-1"), ("yacht", 2, "ensemble-1")] in groups
    assert all(len(g) == 1 for g in groups if g[0][2] == "mcd-1") and len(groups) == 2 + 6
    assert sorted(got.ran) == sorted(c for c in uci.cells(cfg) if c != Cell("boston", 1, "ensemble-1"))
    assert got.stored_before == [Cell("boston", 1, "ensemble-1")] and got.remaining == []
    assert len(cellpack.read_pack(pack)[1]) == 11
    # a budget that admits the 2-cell group (estimates 2 s each, measured above) but not the 3-cell one
    for c in uci.cells(cfg):
        if c.method == "ensemble-1" and c != Cell("boston", 1, "ensemble-1"):
            next(root.glob(f"{c.dataset}/{c.method}-*/split-{c.split}.json")).unlink()
    calls.clear()
    cfg1 = _cfg(datasets=("boston", "yacht"), methods=("ensemble-1",), max_splits=3, workers=1)
    clock = FakeClock()
    got = uci.run_pending(jax.random.key(0), cfg1, compute=compute, root=root, at_once=True, budget_s=5.0,
                          clock=clock, safety=1.0)
    assert [len(g) for g in calls] == [2] and len(got.remaining) == 3


def test_a_run_keeps_the_cells_of_the_pack_it_rewrites(tmp_path):
    # A background run killed after a cell and resumed from the cell store (which passes over that cell)
    # used to rewrite its pack with only the cells it ran itself, losing the earlier one.
    cfg = _cfg(datasets=("yacht",), methods=("ensemble-1",), max_splits=3, workers=1)
    pack = tmp_path / "packs" / "ensemble-1-yacht.tar.gz"
    clock = FakeClock()

    def one_second(cell):
        clock.t += 1.0
        return _fake_record(cell, 1.0)

    first = uci.run_pending(jax.random.key(0), cfg, budget_s=1.5, compute=one_second, root=tmp_path / "a",
                            pack=pack, safety=1.0, clock=clock, default_s=1.0)
    assert len(first.ran) == 1
    _, before = cellpack.read_pack(pack)
    # resumed from the same store, which passes over the first cell: the pack keeps it beside the new ones
    second = uci.run_pending(jax.random.key(0), cfg, compute=lambda c: _fake_record(c, 2.0), root=tmp_path / "a",
                             pack=pack)
    assert len(second.ran) == 2
    manifest, after = cellpack.read_pack(pack)
    assert len(after) == 3 and len(manifest["cells"]) == 3 and manifest["ran_now"] == 2
    assert sorted(rec["wall_s"] for rec in after.values()) == [1.0, 2.0, 2.0]
    assert all(after[rel] == rec for rel, rec in before.items())
    # with another store (another machine), computing every cell again: the store's cell replaces the carried one
    uci.run_pending(jax.random.key(0), cfg, compute=lambda c: _fake_record(c, 3.0), root=tmp_path / "b", pack=pack)
    assert {rec["wall_s"] for rec in cellpack.read_pack(pack)[1].values()} == {3.0}
    # a pack of other settings at that path: refused before any cell, the pack untouched
    other = _cfg(datasets=("yacht",), methods=("ensemble-1",), max_splits=3, workers=1, n_particles=3)
    data = pack.read_bytes()
    with pytest.raises(ValueError, match=r"already holds 3 cell\(s\) of other settings.*give --pack another path"):
        uci.run_pending(jax.random.key(0), other, compute=lambda c: pytest.fail("computed"), root=tmp_path / "c",
                        pack=pack)
    assert pack.read_bytes() == data


@pytest.mark.parametrize("n", [1, 2, 3])
def test_shards_cover_every_cell_exactly_once(tmp_path, n):
    every = uci.priority(uci.cells(UCIConfig.paper()))
    parts = [cellpack.shard(every, i, n) for i in range(n)]
    assert sorted(c for p in parts for c in p) == sorted(every)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    # End to end: N runs, one per shard, into one store compute every cell once, whatever was stored before.
    cfg = _cfg(datasets=("yacht", "boston"), methods=("ensemble-1", "mcd-4", "gp"), max_splits=3, workers=1)
    counts = collections.Counter()

    def compute(cell):
        counts[cell] += 1
        return _fake_record(cell, 1.0)

    for i in reversed(range(n)):
        got = uci.run_pending(jax.random.key(0), cfg, shard=(i, n), compute=compute, root=tmp_path)
        assert got.remaining == [] and set(got.ran) == set(cellpack.shard(uci.priority(uci.cells(cfg)), i, n))
    assert counts == collections.Counter(uci.cells(cfg))


@pytest.mark.parametrize("value", ["4/4", "0/0", "-1/2", "a/b", "1", "1/2/3", ""])
def test_bad_shard_is_one_line_and_exit_2(tmp_path, capsys, value):
    argv = ["run", "uci", "--quiet", f"--shard={value}", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bootens: --shard") and "I/N" in err[0]


@pytest.mark.parametrize(("extra", "message"), [
    (["--time-budget", "-3"], "--time-budget takes a positive number"),
    (["--pack", "cells.zip"], "a cell pack is a .tar.gz"),
    (["--pack-all"], "give --pack too"),
    (["--stored-only", "--shard", "0/2"], "--stored-only computes nothing"),
    (["--skip-recorded", "/nonexistent-record"], "--skip-recorded /nonexistent-record: no readable config.json"),
])
def test_bad_window_options_are_one_line(tmp_path, capsys, extra, message):
    assert cli.main(["run", "uci", "--quiet", "--out", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_window_options_refused_for_other_experiments(tmp_path, capsys):
    assert cli.main(["run", "univariate", "--quiet", "--time-budget", "60", "--out", str(tmp_path)]) == 2
    assert "for experiments stored cell by cell" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------------
# a real tiny run on a machine without TensorFlow/GPflow, ArviZ and pooch (a subprocess that blocks them)

_BLOCKER = r"""
import importlib.abc, json, sys
BLOCKED = ("tensorflow", "gpflow", "arviz", "pooch")
attempts = []

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in BLOCKED:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name != "_find_and_load":
            frame = frame.f_back
        if frame is not None:  # an import statement, not importlib.util.find_spec probing
            attempts.append(name)
        raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)

sys.meta_path.insert(0, Blocker())
from bootens_core.repro import cli
code = cli.main(sys.argv[2:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
json.dump({"code": code, "attempts": attempts, "loaded": loaded}, open(sys.argv[1], "w"))
"""

TINY = ["--profile", "quick", "--datasets", "yacht", "--methods", "ensemble-1", "mcd-1", "sghmc-1", "gp",
        "--set", "max_splits=1", "--set", "n_particles=4", "--set", "lbfgs.steps=1", "--set",
        "lbfgs.iters_per_step=2", "--set", "noise_grid=[0.01, 0.1]", "--set", "mcd.epochs_x=1", "--set",
        "mcd.samples=10", "--set", "sghmc.restarts=2", "--set", "sghmc.draws=2", "--set", "sghmc.burn_in=5",
        "--set", "sghmc.thin=5"]


@pytest.fixture(scope="module")
def blocked_run(tmp_path_factory):
    if not Path(MIRROR).is_dir():
        pytest.skip(f"no UCI mirror at {MIRROR}")
    tmp = tmp_path_factory.mktemp("blocked")
    (tmp / "blocked.py").write_text(_BLOCKER)
    env = {**os.environ, "BOOTENS_CACHE_DIR": str(tmp / "cache"), "BOOTENS_DATA_DIR": MIRROR,
           "BOOTENS_GIT_COMMIT": "feedface-test", "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    pack = tmp / "device-out" / "cells-0.tar.gz"
    proc = subprocess.run(
        [sys.executable, str(tmp / "blocked.py"), str(tmp / "res.json"), "run", "uci", *TINY, "--workers", "1",
         "--quiet", "--time-budget", "400", "--default-cell-s", "60", "--pack", str(pack),
         "--out", str(tmp / "out")],
        capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[4], timeout=300,
    )
    assert (tmp / "res.json").is_file(), proc.stderr[-3000:]
    return {"tmp": tmp, "pack": pack, "stderr": proc.stderr, "res": json.loads((tmp / "res.json").read_text()),
            "cache": tmp / "cache"}


def test_non_gp_cells_run_without_tensorflow_arviz_pooch(blocked_run):
    res, err = blocked_run["res"], blocked_run["stderr"]
    assert res["code"] == 0, err[-3000:]
    assert res["attempts"] == [] and res["loaded"] == []
    assert err.count("GP cells skipped: GPflow/TensorFlow not installed") == 2  # the note, and on gp's line
    assert "bootens: GP cells skipped: GPflow/TensorFlow not installed" in err.splitlines()
    assert "ran 3 cell(s)" in err
    remaining = [ln for ln in err.splitlines() if ln.startswith("bootens: remaining yacht/")]
    assert len(remaining) == 1 and remaining[0].startswith("bootens: remaining yacht/gp: 1 cell(s), ~")


def test_new_cell_records_carry_provenance(blocked_run):
    files = sorted(blocked_run["cache"].glob("uci-cells/*/yacht/*/split-0.json"))
    assert [f.parent.name.rsplit("-", 1)[0] for f in files] == ["ensemble-1", "mcd-1", "sghmc-1"]
    for f in files:
        rec = json.loads(f.read_text())
        assert set(CELL_FIELDS) <= set(rec) and ("val_mnll" in rec) == (rec["method"] != "mcd")  # fields kept
        prov = rec["provenance"]
        assert prov["device"]["kind"] == DEVICE and prov["git_commit"] == "feedface-test"
        assert {"jax", "numpy", "optax"} <= set(prov["versions"]) and len(prov["source_hash"]) == 64
        assert 0 < rec["compile_s"] <= prov["elapsed_s"] and rec["compiles"] >= 1  # a fresh process compiles
        assert 0 < rec["wall_s"] <= prov["elapsed_s"]
    out_prov = json.loads((blocked_run["tmp"] / "out" / "uci" / "provenance.json").read_text())
    assert out_prov["cell_devices"] == {DEVICE: 3} and out_prov["cells_run_now"] == 3


def test_pack_holds_the_cells_and_a_manifest(blocked_run):
    with tarfile.open(blocked_run["pack"]) as tar:
        names = tar.getnames()
    assert names[0] == "pack.json" and len(names) == 4
    manifest, members = cellpack.read_pack(blocked_run["pack"])
    st = uci.experiment._CellStore(next(blocked_run["cache"].glob("uci-cells/*")), _cfg())
    for rel, rec in members.items():
        family = rel.split("/")[1].rsplit("-", 1)[0].partition("-")[0]
        assert rel.split("/")[1].endswith(manifest["family_hashes"][family])
        assert (st.root / rel).read_bytes() == json.dumps(rec, indent=1, sort_keys=True).encode()
    assert manifest["remaining"] == ["yacht/gp/split 0"] and manifest["shard"] == "0/1"


def test_fold_reproduces_the_stored_only_record(blocked_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(blocked_run["cache"]))
    assert cli.main(["run", "uci", *TINY, "--quiet", "--stored-only", "--out", str(tmp_path / "so")]) == 0
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "home-cache"))  # a machine that ran none of them
    into = tmp_path / "results" / "uci"
    assert cli.main(["fold-cells", str(blocked_run["pack"]), *TINY, "--quiet", "--into", str(into)]) == 0
    assert "folded 3 cell(s) from 1 pack(s)" in capsys.readouterr().err
    for name in ("summary.json", "cells.csv", "config.json"):
        assert (into / name).read_text() == (tmp_path / "so" / "uci" / name).read_text(), name
    summary = json.loads((into / "summary.json").read_text())
    assert summary["n_cells"] == 3 and summary["cells_missing"] == ["yacht/gp/split-0"]
    prov = json.loads((into / "provenance.json").read_text())
    assert prov["assembled_from_stored_cells"] is True and prov["folded_packs"] == ["cells-0.tar.gz"]
    assert prov["cell_devices"] == {DEVICE: 3}
    # folding the same pack again replaces the same cells: same record
    assert cli.main(["fold-cells", str(blocked_run["pack"]), *TINY, "--quiet", "--into", str(into)]) == 0
    assert "3 replaced" in capsys.readouterr().err
    assert (into / "summary.json").read_text() == (tmp_path / "so" / "uci" / "summary.json").read_text()


def test_fold_refuses_cells_of_another_configuration(blocked_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache"))
    into = tmp_path / "rec"
    other = [*TINY, "--set", "n_particles=5"]  # changes the ensemble family's hash only
    assert cli.main(["fold-cells", str(blocked_run["pack"]), *other, "--quiet", "--into", str(into)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 packed cell(s) were made with other settings or code" in err[0]
    assert "ensemble cells of hash" in err[0] and "nothing was folded" in err[0]
    assert not (into / "summary.json").exists() and not list((tmp_path / "cache").rglob("*.json"))
    argv = ["fold-cells", str(blocked_run["pack"]), *other, "--quiet", "--force", "--into", str(into)]
    assert cli.main(argv) == 0
    assert "1 taken with another hash (--force)" in capsys.readouterr().err
    assert json.loads((into / "summary.json").read_text())["n_cells"] == 3


def test_fold_rejects_a_file_that_is_not_a_pack(tmp_path, capsys):
    bad = tmp_path / "cells.tar.gz"
    bad.write_bytes(b"not a tar")
    assert cli.main(["fold-cells", str(bad), "--quiet", "--into", str(tmp_path / "rec")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unreadable" in err[0]


def test_fold_keeps_the_records_own_cells(blocked_run, tmp_path, monkeypatch, capsys):
    # A record extended by a pack on a machine that has none of the record's cell files: its rows stay.
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache-1"))
    into = tmp_path / "rec"
    argv = ["fold-cells", str(blocked_run["pack"]), *TINY, "--quiet", "--into", str(into)]
    assert cli.main(argv) == 0
    capsys.readouterr()
    gp_row = _fake_record(Cell("yacht", 0, "gp"), 1.5, device="another GPU")
    gp_row.update(test_rmse=0.75, test_mnll=1.25)
    table = into / "cells.csv"
    table.write_text(table.read_text() + uci.cells_csv([gp_row]).splitlines()[1] + "\n")
    rows = uci.record_cells(into)
    assert [uci.cell_of(r) for r in rows][-1] == Cell("yacht", 0, "gp") and rows[-1]["test_mnll"] == 1.25
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache-2"))  # another machine, empty store
    assert cli.main(argv) == 0
    assert "kept 1 cell(s) of the record" in capsys.readouterr().err
    summary = json.loads((into / "summary.json").read_text())
    assert summary["n_cells"] == 4 and summary["cells_missing"] == [] and summary["cells_kept"] == 1
    gp = [r for r in summary["rows"] if r["method"] == "gp" and r["metric"] == "rmse"]
    assert gp[0]["mean"] == 0.75
    prov = json.loads((into / "provenance.json").read_text())
    assert prov["cell_devices"] == {DEVICE: 3, "another GPU": 1}  # a kept row keeps its device
    assert [r["device"] for r in uci.record_cells(into)].count("another GPU") == 1
    # A record written before cells.csv had the device column: its kept rows are "not recorded".
    rows_before = list(csv.DictReader(io.StringIO(table.read_text())))
    kept_fields = [f for f in rows_before[0] if f != "device"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=kept_fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows_before)
    table.write_text(buf.getvalue())
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache-3"))
    assert cli.main(argv) == 0
    capsys.readouterr()
    prov = json.loads((into / "provenance.json").read_text())
    assert prov["cell_devices"] == {DEVICE: 3, "not recorded": 1}
    # A record made with other settings is rewritten, not extended.
    old = json.loads((into / "config.json").read_text())
    (into / "config.json").write_text(json.dumps({**old, "n_particles": 7}))
    assert cli.main(argv) == 0
    assert "differs from the one in" in capsys.readouterr().err
    assert json.loads((into / "summary.json").read_text())["n_cells"] == 3


def test_fold_keeps_a_record_whose_config_lacks_fields_of_other_families(blocked_run, tmp_path, monkeypatch, capsys):
    # A record made before fields of other method families existed (the committed results/paper/uci, of
    # ensemble and GP cells, lacks the MC dropout and SGHMC fields) keeps its cells; a changed field of its own
    # cells' families still makes it a record of other settings. Its config.json may be in the flat names of
    # earlier versions.
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache-1"))
    into = tmp_path / "rec"
    argv = ["fold-cells", str(blocked_run["pack"]), *TINY, "--quiet", "--into", str(into)]
    assert cli.main(argv) == 0
    capsys.readouterr()
    old = json.loads((into / "config.json").read_text())
    header, *rows = (into / "cells.csv").read_text().splitlines()
    gp_row = uci.cells_csv([_fake_record(Cell("yacht", 0, "gp"), 1.5)]).splitlines()[1]
    (into / "cells.csv").write_text("\n".join([header, *(r for r in rows if ",ensemble," in r), gp_row]) + "\n")
    assert {uci.cell_of(r).method for r in uci.record_cells(into)} == {"ensemble-1", "gp"}
    flat = {**{k: v for k, v in old.items() if k not in ("network", "lbfgs", "gp", "mcd", "sghmc")},
            **{k: v for k, v in old["network"].items()}, **{f"lbfgs_{k}": v for k, v in old["lbfgs"].items()},
            "gp_max_iter": old["gp"]["max_iter"], "svgp_datasets": old["gp"]["svgp_datasets"],
            "n_inducing": old["gp"]["n_inducing"]}
    (into / "config.json").write_text(json.dumps(flat))
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache-2"))
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "kept 1 cell(s) of the record" in err and "differs" not in err
    assert json.loads((into / "summary.json").read_text())["n_cells"] == 4
    assert "sghmc" in json.loads((into / "config.json").read_text())  # rewritten with this configuration
    bigger = {**old["lbfgs"], "memory": old["lbfgs"]["memory"] + 1}
    (into / "config.json").write_text(json.dumps({**old, "lbfgs": bigger}))
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "differs from the one in" in err and "in lbfgs;" in err
    assert json.loads((into / "summary.json").read_text())["n_cells"] == 3


def test_record_cells_rejects_a_table_that_is_not_cells_csv(tmp_path):
    (tmp_path / "cells.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a cells.csv"):
        uci.record_cells(tmp_path)
    with pytest.raises(ValueError, match="cannot read"):
        uci.record_cells(tmp_path / "nowhere")


@pytest.mark.parametrize("folder", ["uci", "uci-mcd-sghmc", "uci-fixed-step", "uci-deep", "uci-plain"])
def test_committed_records_read_back_from_their_cells_csv(folder, tmp_path):
    # What fold-cells keeps of a committed record gives back that record. cells.csv holds 6 significant
    # digits: each value read back is within half a unit of its 6th digit, 5e-6 |x| (relative), of the one the
    # summary was made from, so a mean moves by at most 5e-6 max|x| and a standard deviation (ddof 1) by at most
    # sqrt(n / (n - 1)) times that (it is Lipschitz in the values with that constant, in the sup norm).
    rec = Path(__file__).resolve().parents[4] / "results" / "paper" / folder
    cfg = config.from_dict(UCIConfig, json.loads((rec / "config.json").read_text()))
    cells = uci.record_cells(rec)
    res = uci.from_cells(tmp_path, cfg, {}, cells)
    assert res.files["cells.csv"] == (rec / "cells.csv").read_text()
    old = json.loads((rec / "summary.json").read_text())
    assert res.summary["cells_missing"] == old.get("cells_missing", []) and res.summary["n_cells"] == old["n_cells"]
    column = {"rmse": "test_rmse", "mnll": "test_mnll", "coverage95": "coverage95"}
    # (the verdicts are not compared: they follow the rule of the code that summarises, not the record)
    for a, b in zip(old["rows"], res.summary["rows"], strict=True):
        assert (a["dataset"], a["method"], a["metric"], a["n_splits"]) == (b["dataset"], b["method"], b["metric"],
                                                                           b["n_splits"])
        xs = [abs(c[column[a["metric"]]]) for c in cells if (c["dataset"], c["method"], c["hidden_layers"])
              == (a["dataset"], a["method"], a["hidden_layers"]) and np.isfinite(c[column[a["metric"]]])]
        rounding = 5e-6 * max(xs, default=0.0)
        n = a["n_splits"]
        if not np.isfinite(float(a["mean"])):  # a column whose splits' metrics are NaN (diverged) stays NaN
            assert not np.isfinite(float(b["mean"]))
            continue
        assert b["mean"] == pytest.approx(a["mean"], rel=0, abs=rounding + 1e-12)
        assert b["std"] == pytest.approx(a["std"], rel=0, abs=np.sqrt(n / max(n - 1, 1)) * rounding + 1e-12)


def test_cli_says_when_the_cells_run_now_are_no_longer_found(tmp_path, monkeypatch, capsys):
    """A run whose cells cannot be read back at its end (the source changed under it, so the store key moved)
    says so, names the pack that holds them, writes no summary and exits 1 -- not "no finished cell yet"."""
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache"))
    pack = tmp_path / "cells.tar.gz"
    done = uci.PendingRun(ran=[Cell("yacht", 0, "gp")], remaining=[], failed=[], skipped=[], notes=[],
                          stored_before=[], store_dir=tmp_path / "empty", pack=pack)
    monkeypatch.setattr(uci, "run_pending", lambda *a, **k: done)
    argv = ["run", "uci", "--profile", "quick", "--quiet", "--datasets", "yacht", "--methods", "gp",
            "--pack", str(pack), "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert ("the 1 cell(s) run now are not under this checkout's cell-store key: the package's source or the "
            f"settings changed while the run went on ({pack} holds the cells); nothing written to") in err
    assert "no finished cell" not in err and not (tmp_path / "o" / "uci").exists()
