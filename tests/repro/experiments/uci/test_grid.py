"""An ensemble cell's sigma^2 selection with the grid trained in batches equals the value-by-value selection."""

import dataclasses
import os
from pathlib import Path

import jax
import numpy as np
import pytest

from bootens_core.repro import harness
from bootens_core.repro.config import LBFGSConfig, NetworkConfig
from bootens_core.repro.experiments.uci.config import UCIConfig
from bootens_core.data import uci as uci_data
from bootens_core.repro.experiments import uci


class _Device:
    platform = "gpu"

    def __init__(self, limit):
        self._limit = limit

    def memory_stats(self):
        return {"bytes_limit": self._limit}


def test_grid_batch_rules():
    cfg = UCIConfig()
    assert uci.grid_batch(cfg, 400, 13, 1, 9) == 1  # CPU here: automatic is one value at a time
    assert uci.grid_batch(dataclasses.replace(cfg, noise_grid_batch=4), 400, 13, 1, 9) == 4
    assert uci.grid_batch(dataclasses.replace(cfg, noise_grid_batch=40), 400, 13, 1, 9) == 9
    # An accelerator: the whole grid when it fits in a quarter of the memory, fewer values as rows grow.
    assert uci.grid_batch(cfg, 400, 13, 1, 9, device=_Device(80 * 2**30)) == 9
    mid = uci.grid_batch(cfg, 5_900, 8, 4, 9, device=_Device(80 * 2**30))
    assert 1 < mid < 9
    # The estimate, written out for the 4-layer Kin8nm network in float32 (200 particles, memory 10).
    n_params = 9 * 50 + 3 * 51 * 50 + 51
    per_particle = 4 * (4 * 5_900 * 4 * 50 + 3 * 5_900 + n_params * (2 * 10 + 8))
    assert mid == (80 * 2**30) // 4 // (per_particle * 200)
    # 4-layer Protein: not even one value by this (upper) estimate; one at a time, never zero.
    assert uci.grid_batch(cfg, 36_000, 9, 4, 9, device=_Device(80 * 2**30)) == 1
    assert uci.grid_batch(cfg, 400, 13, 1, 9, device=_Device(1)) == 1
    with pytest.raises(ValueError, match="noise_grid_batch"):
        UCIConfig(noise_grid_batch=-1)


def test_grid_batches_have_one_length():
    grid = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0]
    for size in range(1, 12):
        batches = uci.grid_batches(grid, size)
        lengths = {len(values) for values, _ in batches}
        assert len(lengths) == 1 and max(lengths) <= size  # one compiled shape, within the memory bound
        assert len(batches) == -(-len(grid) // min(size, len(grid)))  # as few batches as the bound allows
        assert [v for values, n in batches for v in values[:n]] == grid  # every value once, in order
        for values, n in batches:
            assert values[n:] == [values[n - 1]] * (len(values) - n)  # padding repeats the last real value
    assert uci.grid_batches(grid, 4) == [(grid[0:3], 3), (grid[3:6], 3), (grid[6:9], 3)]
    assert uci.grid_batches(grid, 5) == [(grid[0:5], 5), (grid[5:9] + [1.0], 4)]
    with pytest.raises(ValueError, match="at least one value"):
        uci.grid_batches(grid, 0)
    with pytest.raises(ValueError, match="empty"):
        uci.grid_batches([], 2)


_MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(Path(__file__).resolve().parents[5] / "shared" / "data" / "uci")


@pytest.mark.skipif(not Path(_MIRROR).is_dir() and not os.environ.get("CI"), reason=f"no UCI mirror at {_MIRROR}")
@pytest.mark.parametrize("linesearch, method_id", [("zoom", "ensemble-1"), ("torch-strong-wolfe", "ensemble-1"),
                                                    ("zoom", "plain-1")])
def test_batched_selection_equals_value_by_value(linesearch, method_id, monkeypatch):
    monkeypatch.setenv("BOOTENS_DATA_DIR", _MIRROR)
    cfg = UCIConfig(n_particles=4, lbfgs=LBFGSConfig(steps=2, iters_per_step=5, linesearch=linesearch),
                    noise_grid=(1e-2, 1e-1, 1.0), network=NetworkConfig(dtype="float64"))
    data = uci_data.load("yacht", 0)
    key = jax.random.key(1)
    records = {}
    for batch in (1, 3, 2):
        c = dataclasses.replace(cfg, noise_grid_batch=batch)
        m = uci.method(method_id, c, "yacht", data.x_train.shape[1], data.y_std)
        assert m.fit_grid is not None
        records[batch] = harness.run_cell(key, m, data, noise_grid=c.noise_grid, val_seed=c.seed,
                                          val_fraction=c.val_fraction)
    for batch in (3, 2):
        np.testing.assert_allclose(records[batch]["val_mnll"], records[1]["val_mnll"], rtol=1e-9)
        assert records[batch]["noise_var"] == records[1]["noise_var"]
        np.testing.assert_allclose(records[batch]["test_rmse"], records[1]["test_rmse"], rtol=1e-9)
