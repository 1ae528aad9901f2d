"""Every split of a UCI dataset at once (``uci.compute_cells``): each cell's record is the cell-by-cell one
(``uci.compute_cell``) from the same key, in float64 where rounding cannot hide a difference."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import pytest

from bootens_core.repro import config, harness
from bootens_core.repro.experiments import uci
from bootens_core.repro.experiments.uci.config import UCIConfig
from bootens_core.repro.harness import Cell
from bootens_core.repro.overrides import apply_sets

_BESIDE = Path(__file__).resolve().parents[4].parent / "shared" / "data" / "uci"
MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(_BESIDE)
pytestmark = pytest.mark.skipif(not Path(MIRROR).is_dir(), reason=f"no UCI mirror at {MIRROR}")


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("BOOTENS_DATA_DIR", MIRROR)
    with jax.enable_x64(True):
        yield


def _cfg():
    return apply_sets(config.for_profile(UCIConfig, "quick"), [
        "n_particles=3", "lbfgs.steps=1", "lbfgs.iters_per_step=8", "noise_grid=[0.01, 0.1, 1.0]",
        "network.dtype=float64"])


def test_two_splits_at_once_are_the_cells_one_by_one():
    cfg = _cfg()
    cells = [Cell("yacht", 0, "ensemble-1"), Cell("yacht", 3, "ensemble-1")]
    key = jax.random.key(cfg.seed)
    together = uci.compute_cells(key, cfg, cells)
    alone = [uci.compute_cell(key, cfg, c) for c in cells]
    for a, b in zip(together, alone, strict=True):
        for f in ("dataset", "split", "method", "hidden_layers"):
            assert a[f] == b[f]
        assert a["noise_var"] == b["noise_var"] and a["selection"] == b["selection"]
        assert a["val_mnll"] == pytest.approx(b["val_mnll"], rel=1e-7)
        for f in ("test_rmse", "test_mnll", "coverage95", "test_crps", "coverage50"):
            assert a[f] == pytest.approx(b[f], rel=1e-7), f
        assert a["n_components"] == b["n_components"] and a["diverged_particles"] == b["diverged_particles"]
        assert set(harness.CELL_FIELDS) <= set(a)
        assert a["at_once"]["cells"] == 2 and a["wall_s"] == pytest.approx(a["at_once"]["wall_s"] / 2)


def test_cells_of_several_datasets_or_methods_are_refused_and_others_run_one_by_one(monkeypatch):
    cfg = _cfg()
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="share a dataset and a method"):
        uci.compute_cells(key, cfg, [Cell("yacht", 0, "ensemble-1"), Cell("boston", 0, "ensemble-1")])
    assert uci.compute_cells(key, cfg, []) == []
    # a method that cannot run splits together (MC dropout) goes cell by cell, through compute_cell
    seen = []
    monkeypatch.setattr(uci.experiment, "compute_cell",
                        lambda k, c, cell: seen.append(cell) or {"cell": cell})
    cells = [Cell("yacht", 0, "mcd-1"), Cell("yacht", 1, "mcd-1")]
    assert uci.compute_cells(key, cfg, cells) == [{"cell": c} for c in cells] and seen == cells
    with pytest.raises(ValueError, match="cannot run splits at once"):
        harness.run_cells_at_once([key], uci.method("mcd-1", cfg, "yacht", 6), [], noise_grid=[0.1],
                                  val_seed=0)
