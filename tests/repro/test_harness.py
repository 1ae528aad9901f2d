"""bootens_core.repro.harness: validation rows, scores in original units, sigma^2 selection on a synthetic split
(against a numpy argmin), the cell store and resumable runs."""

from __future__ import annotations

import json
import math
import threading
import time
import warnings

import jax
import numpy as np
import pytest
from scipy import stats

from bootens_core.repro import harness
from bootens_core import metrics
from bootens_core.data import uci
from bootens_core.metrics import Prediction
from bootens_core.repro.harness import CELL_FIELDS, Cell, Method

# --------------------------------------------------------------------------------------------------------------
# validation_rows


@pytest.mark.parametrize("n", [5, 101, 506, 1000])
def test_validation_rows_partition_the_training_split(n):
    fit, val = harness.validation_rows(n, split=3, seed=0)
    assert len(val) == round(0.2 * n) and len(fit) == n - len(val)
    assert not np.intersect1d(fit, val).size
    np.testing.assert_array_equal(np.sort(np.concatenate([fit, val])), np.arange(n))
    assert np.all(np.diff(fit) > 0) and np.all(np.diff(val) > 0)  # both sorted
    # the documented draw: the first round(0.2 n) of default_rng([seed, split]).permutation(n)
    perm = np.random.default_rng([0, 3]).permutation(n)
    np.testing.assert_array_equal(val, np.sort(perm[: round(0.2 * n)]))


def test_validation_rows_other_fractions():
    fit, val = harness.validation_rows(200, 0, 0, fraction=0.35)
    assert len(val) == 70 and len(fit) == 130


def test_validation_rows_deterministic_per_seed_and_split():
    a = harness.validation_rows(455, 2, 7)
    b = harness.validation_rows(455, 2, 7)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)
    others = [harness.validation_rows(455, 3, 7)[1], harness.validation_rows(455, 2, 8)[1]]
    for other in others:
        assert not np.array_equal(a[1], other)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.2, 1.5])
def test_validation_rows_bad_fraction(fraction):
    with pytest.raises(ValueError, match="fraction"):
        harness.validation_rows(100, 0, 0, fraction)


@pytest.mark.parametrize(("n", "fraction"), [(2, 0.2), (1, 0.5), (2, 0.75), (0, 0.2)])
def test_validation_rows_tiny_split(n, fraction):
    with pytest.raises(ValueError, match="cannot hold out"):
        harness.validation_rows(n, 0, 0, fraction)


# --------------------------------------------------------------------------------------------------------------
# evaluate


@pytest.mark.parametrize("per_point_var", [False, True])
def test_evaluate_scores_in_original_units(per_point_var):
    rng = np.random.default_rng(0)
    n, k, m, s = 60, 4, -5.0, 2.7
    y = rng.normal(size=n)
    f = y[None] + rng.normal(0, 0.5, size=(k, n))
    var = rng.uniform(0.1, 0.8, size=n) if per_point_var else 0.3
    got = harness.evaluate(y, Prediction(f, var), s)
    y_o, f_o, var_o = y * s + m, f * s + m, np.asarray(var) * s**2
    assert got["test_rmse"] == pytest.approx(metrics.rmse(y_o, f_o.mean(0)), rel=1e-12)
    assert got["test_mnll"] == pytest.approx(metrics.mixture_mnll(y_o, f_o, var_o), rel=1e-12)
    # and the MNLL once more from scipy's densities, without log-sum-exp
    dens = np.mean(stats.norm.pdf(y_o[None], loc=f_o, scale=np.sqrt(var_o)), axis=0)
    assert got["test_mnll"] == pytest.approx(-np.mean(np.log(dens)), rel=1e-10)
    assert got["coverage95"] == metrics.mixture_coverage(y_o, f_o, var_o, 0.95)


def test_evaluate_without_components_is_nan():
    got = harness.evaluate(np.zeros(3), Prediction(np.zeros((0, 3)), 1.0, diverged=5), 2.0)
    assert set(got) == {"test_rmse", "test_mnll", "coverage95"}
    assert all(math.isnan(v) for v in got.values())


@pytest.mark.parametrize("var_shape", ["scalar", "per point", "per component"])
def test_calibration_in_original_units(var_shape):
    rng = np.random.default_rng(1)
    n, k, m, s = 80, 5, 3.0, 1.9
    y = rng.normal(size=n)
    f = y[None] + rng.normal(0, 0.5, size=(k, n))
    var = {"scalar": 0.3, "per point": rng.uniform(0.1, 0.8, size=n),
           "per component": rng.uniform(0.1, 0.8, size=(k, n))}[var_shape]
    got = harness.calibration(y, Prediction(f, var), s)
    assert set(got) == set(harness.CALIBRATION_FIELDS)
    y_o, f_o, var_o = y * s + m, f * s + m, np.asarray(var) * s**2
    assert got["test_crps"] == pytest.approx(metrics.mixture_crps(y_o, f_o, var_o), rel=1e-10)
    # coverage from scipy's mixture CDF, counted directly
    u = np.mean(stats.norm.cdf(y_o[None], loc=f_o, scale=np.sqrt(var_o)), axis=0)
    for level in harness.CALIBRATION_LEVELS:
        lo = (1 - level) / 2
        assert got[f"coverage{round(100 * level)}"] == np.mean((u >= lo) & (u <= 1 - lo))
    assert got["pit_counts"] == np.histogram(u, bins=harness.PIT_BINS, range=(0, 1))[0].tolist()
    assert sum(got["pit_counts"]) == n


def test_calibration_of_many_draws_takes_the_pair_term_over_the_first():
    rng = np.random.default_rng(2)
    n, k = 10, harness.CRPS_PAIR_COMPONENTS + 7
    y, f = rng.normal(size=n), rng.normal(size=(k, n))
    got = harness.calibration(y, Prediction(f, 0.5), 1.0)
    want = metrics.mixture_crps(y, f, 0.5, pair_components=harness.CRPS_PAIR_COMPONENTS)
    assert got["test_crps"] == pytest.approx(want, rel=1e-12)
    assert got["test_crps"] != metrics.mixture_crps(y, f, 0.5)


def test_calibration_without_components_is_nan():
    got = harness.calibration(np.zeros(3), Prediction(np.zeros((0, 3)), 1.0, diverged=5), 2.0)
    assert got["pit_counts"] == [] and all(math.isnan(v) for k, v in got.items() if k != "pit_counts")


# --------------------------------------------------------------------------------------------------------------
# run_cell on a hand-built split


def _split(seed=0, n_train=250, n_test=40, d=3, name="synthetic", split=1):
    """A UCISplit standardised by hand; raw labels N(4, 0.3) with a drift along the rows, so the fit rows'
    and the whole training split's statistics differ."""
    rng = np.random.default_rng(seed)
    x = rng.normal(2.0, 3.0, size=(n_train + n_test, d))
    y = 4.0 + rng.normal(0.0, np.sqrt(0.3), size=n_train + n_test) * np.linspace(0.6, 1.6, n_train + n_test)
    xtr, ytr, xte, yte = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
    xm, xs, ym, ys = xtr.mean(0), xtr.std(0), float(ytr.mean()), float(ytr.std())
    s = uci.UCISplit(
        name=name, split=split, x_train=(xtr - xm) / xs, y_train=(ytr - ym) / ys, x_test=(xte - xm) / xs,
        y_test=(yte - ym) / ys, x_mean=xm, x_std=xs, y_mean=ym, y_std=ys, train_index=np.arange(n_train),
        test_index=np.arange(n_train, n_train + n_test),
    )
    return s, xtr, ytr, yte


class _ZeroGaussian:
    """A fake method: the predictive N(0, noise_var) at every point, whatever the data; records its calls."""

    def __init__(self, diverge=lambda nv: False):
        self.calls = []
        self.diverge = diverge

    def __call__(self, key, x, y, x_eval, noise_var):
        self.calls.append((np.asarray(jax.random.key_data(key)), np.array(x), np.array(y), np.array(x_eval),
                           noise_var))
        if self.diverge(noise_var):
            return Prediction(np.zeros((0, len(x_eval))), noise_var, diverged=3)
        return Prediction(np.zeros((1, len(x_eval))), noise_var)


GRID = tuple(np.round(np.linspace(0.5, 2.0, 31), 4))


def test_run_cell_selects_sigma2_by_validation_mnll():
    s, xtr, ytr, yte = _split()
    fake = _ZeroGaussian()
    rec = harness.run_cell(jax.random.key(0), Method("fake", 2, True, fake), s, noise_grid=GRID, val_seed=5)

    # Independently: the validation rows, restandardised with the fit rows' raw statistics.
    perm = np.random.default_rng([5, s.split]).permutation(len(ytr))
    val = np.sort(perm[: round(0.2 * len(ytr))])
    fit = np.setdiff1d(np.arange(len(ytr)), val)
    ym, ys = ytr[fit].mean(), ytr[fit].std()
    yv = (ytr[val] - ym) / ys
    mnll = np.array([np.mean(0.5 * np.log(2 * np.pi * nv) + yv**2 / (2 * nv)) + np.log(ys) for nv in GRID])
    best = int(np.argmin(mnll))
    assert 0 < best < len(GRID) - 1  # an interior minimum: the grid brackets the validation variance
    np.testing.assert_allclose(rec["val_mnll"], mnll, rtol=1e-12)
    # (in original units: -mean log N(y_val_raw; fit mean, nv * ys^2))
    np.testing.assert_allclose(
        rec["val_mnll"], [-np.mean(stats.norm.logpdf(ytr[val], ym, np.sqrt(nv) * ys)) for nv in GRID], rtol=1e-10
    )
    assert rec["noise_grid"] == list(GRID)
    assert rec["noise_var_std_units"] == GRID[best]
    assert rec["noise_var"] == pytest.approx(GRID[best] * s.y_std**2, rel=1e-14)

    # The calls: len(GRID) validation fits on the restandardised fit rows with one common key, then the final
    # fit on the whole training split with another key.
    assert len(fake.calls) == len(GRID) + 1
    for (key, x, y, x_eval, nv), g in zip(fake.calls[:-1], GRID, strict=True):
        np.testing.assert_array_equal(key, fake.calls[0][0])
        assert nv == g and x.shape == (len(fit), 3) and x_eval.shape == (len(val), 3)
        np.testing.assert_allclose(y, (ytr[fit] - ym) / ys, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(x.mean(0), 0, atol=1e-12)
        np.testing.assert_allclose(x.std(0), 1, rtol=1e-12)
        np.testing.assert_allclose(x_eval, (xtr[val] - xtr[fit].mean(0)) / xtr[fit].std(0), rtol=1e-10, atol=1e-12)
    key, x, y, x_eval, nv = fake.calls[-1]
    assert not np.array_equal(key, fake.calls[0][0])
    assert nv == GRID[best]
    np.testing.assert_array_equal(x, s.x_train)
    np.testing.assert_array_equal(y, s.y_train)
    np.testing.assert_array_equal(x_eval, s.x_test)

    # Test scores of N(0, best) in standardised units = N(y_mean, best * y_std^2) in original units.
    sd = np.sqrt(GRID[best]) * s.y_std
    assert rec["test_rmse"] == pytest.approx(np.sqrt(np.mean((yte - s.y_mean) ** 2)), rel=1e-12)
    assert rec["test_mnll"] == pytest.approx(-np.mean(stats.norm.logpdf(yte, s.y_mean, sd)), rel=1e-12)
    assert rec["coverage95"] == np.mean(np.abs(yte - s.y_mean) <= 1.959963984540054 * sd)
    assert set(CELL_FIELDS) <= set(rec)
    assert (rec["dataset"], rec["split"], rec["method"], rec["hidden_layers"]) == ("synthetic", 1, "fake", 2)
    assert rec["diverged_particles"] == 0 and rec["n_components"] == 1 and rec["wall_s"] >= 0
    assert "validation" in rec["selection"]


def test_run_cell_skips_diverged_grid_values():
    s, *_ = _split(seed=1)
    small = GRID[: len(GRID) // 2]
    fake = _ZeroGaussian(diverge=lambda nv: nv in small)  # the left half of the grid diverges
    rec = harness.run_cell(jax.random.key(1), Method("fake", 1, True, fake), s, noise_grid=GRID, val_seed=0)
    assert all(v == math.inf for v in rec["val_mnll"][: len(small)])
    assert all(math.isfinite(v) for v in rec["val_mnll"][len(small):])
    assert rec["noise_var_std_units"] == GRID[len(small) + int(np.argmin(rec["val_mnll"][len(small):]))]


def test_run_cell_all_diverged_raises():
    s, *_ = _split(seed=2)
    fake = _ZeroGaussian(diverge=lambda nv: True)
    with pytest.raises(RuntimeError, match="diverged"):
        harness.run_cell(jax.random.key(0), Method("fake", 1, True, fake), s, noise_grid=(0.1, 1.0), val_seed=0)
    with pytest.raises(ValueError, match="empty"):
        harness.run_cell(jax.random.key(0), Method("fake", 1, True, fake), s, noise_grid=(), val_seed=0)


def test_run_cell_method_fitting_its_own_noise():
    s, _, _, yte = _split(seed=3)
    seen = []

    def fit(key, x, y, x_eval, noise_var):
        seen.append(noise_var)
        np.testing.assert_array_equal(x, s.x_train)
        return Prediction(np.full((1, len(x_eval)), 0.25), 0.7, noise_var=0.6, info={"kind": "gpr", "n_iter": 9})

    rec = harness.run_cell(jax.random.key(0), Method("gp", 0, False, fit), s, noise_grid=GRID, val_seed=0)
    assert seen == [None]  # fitted once, given no noise variance
    assert rec["noise_var_std_units"] == 0.6
    assert rec["noise_var"] == pytest.approx(0.6 * s.y_std**2, rel=1e-14)
    assert rec["info"] == {"kind": "gpr", "n_iter": 9}
    assert "val_mnll" not in rec and rec["selection"] == "fitted with the model"
    sd = np.sqrt(0.7) * s.y_std
    mean = 0.25 * s.y_std + s.y_mean
    assert rec["test_mnll"] == pytest.approx(-np.mean(stats.norm.logpdf(yte, mean, sd)), rel=1e-12)

    def fit_without_noise(key, x, y, x_eval, noise_var):
        return Prediction(np.zeros((1, len(x_eval))), 0.7)

    rec = harness.run_cell(jax.random.key(0), Method("gp", 0, False, fit_without_noise), s, noise_grid=GRID,
                           val_seed=0)
    assert math.isnan(rec["noise_var"]) and math.isnan(rec["noise_var_std_units"])


# --------------------------------------------------------------------------------------------------------------
# CellStore and run_cells


def _record(cell, value=1.0):
    rec = {f: 0.0 for f in CELL_FIELDS}
    rec.update(dataset=cell.dataset, split=cell.split, method=cell.method, hidden_layers=1, test_rmse=value,
               diverged_particles=0, n_components=3, selection="fake")
    return rec


def test_cell_store_roundtrip(tmp_path):
    st = harness.CellStore(tmp_path)
    cell = Cell("boston", 3, "ensemble-4")
    assert st.get(cell) is None
    rec = {**_record(cell, np.float64(2.5)), "diverged_particles": np.int64(4), "val_mnll": [1.5, math.inf],
           "info": {"nested": (1, 2)}}
    p = st.put(cell, rec)
    assert p == tmp_path / "boston" / "ensemble-4" / "split-3.json" and p.is_file()
    got = st.get(cell)
    assert got["test_rmse"] == 2.5 and got["diverged_particles"] == 4 and got["info"] == {"nested": [1, 2]}
    assert got["val_mnll"][0] == 1.5 and float(got["val_mnll"][1]) == math.inf  # JSON has no inf: "inf"
    assert {k: got[k] for k in CELL_FIELDS} == {k: rec[k] for k in CELL_FIELDS}
    assert [q.name for q in p.parent.iterdir()] == ["split-3.json"]  # no temporary file left behind
    st.put(cell, _record(cell, 7.0))  # overwrite
    assert st.get(cell)["test_rmse"] == 7.0


def test_cell_store_corrupt_and_incomplete_records(tmp_path):
    st = harness.CellStore(tmp_path)
    cell = Cell("yacht", 0, "gp")
    st.path(cell).parent.mkdir(parents=True)
    st.path(cell).write_text('{"dataset": "yacht", "spl')
    with pytest.warns(UserWarning, match="unreadable"):
        assert st.get(cell) is None
    rec = _record(cell)
    del rec["coverage95"]
    st.path(cell).write_text(json.dumps(rec))
    with pytest.warns(UserWarning, match="incomplete"):
        assert st.get(cell) is None


def test_cell_store_record_that_is_not_an_object(tmp_path):
    st = harness.CellStore(tmp_path)
    cell = Cell("yacht", 0, "gp")
    st.path(cell).parent.mkdir(parents=True)
    st.path(cell).write_text("[]")
    with pytest.warns(UserWarning, match="incomplete"):
        assert st.get(cell) is None


@pytest.mark.parametrize("text", ["null", "0"])
def test_cell_store_scalar_json_is_recomputed(tmp_path, text):
    st = harness.CellStore(tmp_path)
    cell = Cell("yacht", 0, "gp")
    st.path(cell).parent.mkdir(parents=True)
    st.path(cell).write_text(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = st.get(cell)
    assert got is None and any(issubclass(w.category, UserWarning) for w in caught)


CELLS = [Cell("boston", s, m) for m in ("ensemble-1", "gp") for s in range(3)]


class _Counting:
    def __init__(self, fail_on=None, sleep=False):
        self.calls = []
        self.fail_on = fail_on
        self.sleep = sleep
        self.lock = threading.Lock()

    def __call__(self, cell):
        with self.lock:
            self.calls.append(cell)
            n = len(self.calls)
        if n == self.fail_on:
            raise RuntimeError("boom")
        if self.sleep:  # finish out of order
            time.sleep(0.05 * ((cell.split * 7 + len(cell.method)) % 3))
        return _record(cell, value=10.0 * cell.split + len(cell.method))


def test_run_cells_resumes_after_an_error(tmp_path):
    st = harness.CellStore(tmp_path)
    first = _Counting(fail_on=3)
    with pytest.raises(RuntimeError, match="boom"):
        harness.run_cells(CELLS, first, st)
    assert first.calls == CELLS[:3]
    assert [st.get(c) is not None for c in CELLS] == [True, True, False, False, False, False]

    second = _Counting()
    recs = harness.run_cells(CELLS, second, st)
    assert second.calls == CELLS[2:]  # only the cells not stored
    assert [(r["method"], r["split"]) for r in recs] == [(c.method, c.split) for c in CELLS]
    assert [r["test_rmse"] for r in recs] == [10.0 * c.split + len(c.method) for c in CELLS]

    third = _Counting()
    assert harness.run_cells(CELLS, third, st) == recs and third.calls == []  # all stored
    forced = _Counting()
    assert harness.run_cells(CELLS, forced, st, force=True) == recs and forced.calls == CELLS


def test_run_cells_in_threads_keeps_cell_order(tmp_path):
    serial = harness.run_cells(CELLS, _Counting(), harness.CellStore(tmp_path / "a"))
    threaded = _Counting(sleep=True)
    recs = harness.run_cells(CELLS, threaded, harness.CellStore(tmp_path / "b"), workers=2)
    assert sorted(threaded.calls) == sorted(CELLS)
    assert recs == serial
    assert [harness.CellStore(tmp_path / "b").get(c) for c in CELLS] == serial
