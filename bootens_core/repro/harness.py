"""The UCI benchmark protocol: cells, noise-variance selection, test metrics, a resumable cell store.

A *cell* is one dataset x split x method. For a method that needs a likelihood variance (the ensembles),
:func:`run_cell` holds out a validation part of the training split (:func:`validation_rows`), fits the method
on the rest for every ``sigma^2`` of a grid, keeps the ``sigma^2`` with the lowest validation MNLL, refits on
the whole training split and scores the test split. A method that fits its own noise (the GP) is fitted once.
Scores are in original label units: RMSE of the predictive mean, MNLL of the predictive mixture
(log-sum-exp over the components, noise included), and the coverage of the central 95% predictive interval.

Every finished cell is written at once, atomically, to a :class:`CellStore`; :func:`run_cells` skips the cells
already there, so an interrupted run resumes where it stopped. Cells are independent and may run in threads
(JAX and TensorFlow release the GIL while they compute).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from .. import metrics
from ..metrics import Prediction
from ..data import uci

__all__ = [
    "Method",
    "Cell",
    "CELL_FIELDS",
    "validation_rows",
    "evaluate",
    "CALIBRATION_LEVELS",
    "CALIBRATION_FIELDS",
    "PIT_BINS",
    "CRPS_PAIR_COMPONENTS",
    "calibration",
    "run_cell",
    "run_cells_at_once",
    "CellStore",
    "run_cells",
]

# The columns of cells.csv, in order.
CELL_FIELDS = (
    "dataset", "split", "method", "hidden_layers", "noise_var", "noise_var_std_units", "test_rmse",
    "test_mnll", "coverage95", "wall_s", "diverged_particles", "n_components", "selection",
)


class Method(NamedTuple):
    """A method of the benchmark.

    ``fit(key, x_fit, y_fit, x_eval, noise_var)`` trains on standardised data and returns the
    :class:`Prediction` at ``x_eval``. ``select_noise`` methods get each ``noise_var`` of the grid; the
    others get ``None`` and report the variance they fitted in ``Prediction.noise_var``. A ``select_noise``
    method may also give ``fit_grid(key, x_fit, y_fit, x_eval, noise_grid)``: the predictions of ``fit`` for
    every value of the grid, in order, computed together (:func:`run_cell` then uses it for the selection).
    ``fit_many(keys, xs_fit, ys_fit, xs_eval, noise_vars)`` and ``fit_grid_many(keys, xs_fit, ys_fit, xs_eval,
    noise_grid)``, where given: ``fit`` and ``fit_grid`` of several problems of one shape (the splits of a
    dataset) computed together, a list by problem (:func:`run_cells_at_once`).
    """

    name: str
    hidden_layers: int
    select_noise: bool
    fit: Callable[..., Prediction]
    fit_grid: Callable[..., list[Prediction]] | None = None
    fit_many: Callable[..., list[Prediction]] | None = None
    fit_grid_many: Callable[..., list[list[Prediction]]] | None = None

    @property
    def id(self) -> str:
        return self.name if self.hidden_layers == 0 else f"{self.name}-{self.hidden_layers}"


class Cell(NamedTuple):
    """One dataset x split x method."""

    dataset: str
    split: int
    method: str  # a method id, e.g. "ensemble-4" or "gp"

    @property
    def label(self) -> str:
        return f"{self.dataset}/{self.method}/split {self.split}"


def validation_rows(n_train: int, split: int, seed: int, fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of a training split are held out for validation.

    The validation rows are the first ``round(fraction * n_train)`` of
    ``numpy.random.default_rng([seed, split]).permutation(n_train)`` (positions in the training split's row
    order, i.e. in the order of ``index_train_<split>.txt``); the others are fitted. Both are returned sorted.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"validation fraction must lie in (0, 1), got {fraction}")
    n_val = int(round(fraction * n_train))
    if n_val < 1 or n_val >= n_train:
        raise ValueError(f"a training split of {n_train} rows cannot hold out {fraction:.0%} for validation")
    perm = np.random.default_rng([int(seed), int(split)]).permutation(int(n_train))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def evaluate(y: np.ndarray, pred: Prediction, y_std: float) -> dict[str, float]:
    """Test RMSE, MNLL and 95% coverage of ``pred`` against standardised labels ``y``, in original units.

    Standardisation ``y = (y_orig - mean) / y_std`` scales errors by ``y_std`` and shifts every log
    density by ``log y_std``; coverage is unit-free.
    """
    f = np.asarray(pred.f, np.float64)
    if f.shape[0] == 0:
        return {"test_rmse": math.nan, "test_mnll": math.nan, "coverage95": math.nan}
    return {
        "test_rmse": metrics.rmse(y, f.mean(0)) * y_std,
        "test_mnll": metrics.mixture_mnll(y, f, pred.var) + math.log(y_std),
        "coverage95": metrics.mixture_coverage(y, f, pred.var, 0.95),
    }


# Calibration of a cell's test predictive (its record's optional fields; records made before they existed lack
# them): coverage of the central intervals at these nominal levels (95% is ``coverage95``), the PIT histogram's
# counts in PIT_BINS equal bins, and the CRPS in original label units.
CALIBRATION_LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9)
PIT_BINS = 10
CALIBRATION_FIELDS = ("test_crps", *(f"coverage{round(100 * lv)}" for lv in CALIBRATION_LEVELS), "pit_counts")
# The CRPS's pair term of a predictive with more components than this (MC dropout's 10 000 passes) is taken over
# its first CRPS_PAIR_COMPONENTS: i.i.d. draws, so unbiased (metrics.mixture_crps); the work is quadratic.
CRPS_PAIR_COMPONENTS = 2000


def calibration(y: np.ndarray, pred: Prediction, y_std: float) -> dict[str, Any]:
    """Calibration of ``pred`` against standardised labels ``y``: :data:`CALIBRATION_FIELDS` --
    ``test_crps`` (original label units: the CRPS scales with ``y_std``), ``coverage50`` ... ``coverage90``
    (central intervals, :func:`bootens_core.metrics.coverage_levels`) and ``pit_counts`` (labels per PIT bin,
    :data:`PIT_BINS` equal bins of ``[0, 1]``). No component: NaNs and no counts."""
    f = np.asarray(pred.f, np.float64)
    if f.shape[0] == 0:
        return {"test_crps": math.nan, **{f"coverage{round(100 * lv)}": math.nan for lv in CALIBRATION_LEVELS},
                "pit_counts": []}
    pairs = CRPS_PAIR_COMPONENTS if f.shape[0] > CRPS_PAIR_COMPONENTS else None
    pit = metrics.pit_histogram(y, f, pred.var, PIT_BINS)
    cov = metrics.pit_coverage(pit.pit, CALIBRATION_LEVELS)  # the mixture's CDF at the labels, computed once
    return {"test_crps": metrics.mixture_crps(y, f, pred.var, pair_components=pairs) * y_std,
            **{f"coverage{round(100 * lv)}": cov[lv] for lv in CALIBRATION_LEVELS},
            "pit_counts": [int(c) for c in pit.counts]}


def _restandardise(s: uci.UCISplit, fit_rows: np.ndarray, other_rows: np.ndarray):
    """Fit rows and other rows of the training split, standardised with the fit rows' statistics only."""
    x = s.x_train * s.x_std + s.x_mean
    y = s.y_train * s.y_std + s.y_mean
    xm, xs, ym, ys = uci.standardisation(x[fit_rows], y[fit_rows])
    return (x[fit_rows] - xm) / xs, (y[fit_rows] - ym) / ys, (x[other_rows] - xm) / xs, (y[other_rows] - ym) / ys, ys


def run_cell(
    key: jax.Array,
    method: Method,
    data: uci.UCISplit,
    *,
    noise_grid: Sequence[float],
    val_seed: int,
    val_fraction: float = 0.2,
) -> dict[str, Any]:
    """Run one cell: select ``sigma^2`` on validation MNLL (if the method needs it), refit, score the test split.

    ``key`` is split into the validation fits' key (the same for every grid value: common random numbers,
    so the grid is compared on the same replicates) and the final fit's key. Returns the cell's record:
    the :data:`CELL_FIELDS` plus the validation curve.
    """
    k_val, k_fit = jax.random.split(key)
    start = time.perf_counter()
    record: dict[str, Any] = {}
    if method.select_noise:
        grid = _grid(noise_grid)
        x_f, y_f, x_v, y_v, ys_f = _validation_data(data, val_seed, val_fraction)
        if method.fit_grid is not None:
            preds = method.fit_grid(k_val, x_f, y_f, x_v, grid)
        else:
            preds = (method.fit(k_val, x_f, y_f, x_v, nv) for nv in grid)
        noise_var, selection = _select(record, preds, y_v, ys_f, grid, data, method)
        pred = method.fit(k_fit, data.x_train, data.y_train, data.x_test, noise_var)
    else:
        pred = method.fit(k_fit, data.x_train, data.y_train, data.x_test, None)
        noise_var = float(pred.noise_var) if pred.noise_var is not None else math.nan
        selection = (pred.info or {}).get("selection", "fitted with the model")
    return _cell_record(record, data, method, pred, noise_var, selection, start)


def run_cells_at_once(
    keys: Sequence[jax.Array],
    method: Method,
    datas: Sequence[uci.UCISplit],
    *,
    noise_grid: Sequence[float],
    val_seed: int,
    val_fraction: float = 0.2,
) -> list[dict[str, Any]]:
    """:func:`run_cell` of several splits of one dataset at once (``keys[i]`` the key of ``datas[i]``'s cell):
    the validation fits of every split and ``sigma^2`` together (``method.fit_grid_many``), then the final fits
    of every split together (``method.fit_many``), each at its own selected ``sigma^2``. Each record is the
    one :func:`run_cell` makes, up to float rounding; its ``wall_s`` is its share of the whole (the wall
    time over the cells), ``at_once`` says how many cells ran together and in how many seconds.

    Raises ``ValueError`` for a method without ``fit_many``/``fit_grid_many`` or splits of different shapes
    (run those cell by cell).
    """
    if not method.select_noise or method.fit_many is None or method.fit_grid_many is None:
        raise ValueError(f"{method.id} cannot run splits at once (it needs select_noise, fit_many and "
                         "fit_grid_many): run its cells one by one")
    if len(keys) != len(datas) or not datas:
        raise ValueError(f"need one key per split (at least one split), got {len(keys)} keys, {len(datas)} splits")
    if len({(d.name, d.x_train.shape, d.x_test.shape) for d in datas}) != 1:
        raise ValueError("splits run at once must be of one dataset with equal training and test sizes, got "
                         f"{sorted({(d.name, d.x_train.shape, d.x_test.shape) for d in datas})}")
    start = time.perf_counter()
    grid = _grid(noise_grid)
    pairs = [jax.random.split(k) for k in keys]
    val = [_validation_data(d, val_seed, val_fraction) for d in datas]
    preds = method.fit_grid_many([p[0] for p in pairs], [v[0] for v in val], [v[1] for v in val],
                                 [v[2] for v in val], grid)
    records: list[dict[str, Any]] = [{} for _ in datas]
    chosen = [_select(rec, split_preds, v[3], v[4], grid, d, method)
              for rec, split_preds, v, d in zip(records, preds, val, datas, strict=True)]
    finals = method.fit_many([p[1] for p in pairs], [d.x_train for d in datas], [d.y_train for d in datas],
                             [d.x_test for d in datas], [nv for nv, _ in chosen])
    out = [_cell_record(rec, d, method, pred, nv, selection, start)
           for rec, d, pred, (nv, selection) in zip(records, datas, finals, chosen, strict=True)]
    wall = time.perf_counter() - start
    for rec in out:
        rec.update(wall_s=wall / len(out), at_once={"cells": len(out), "wall_s": wall})
    return out


def _grid(noise_grid: Sequence[float]) -> list[float]:
    if not noise_grid:
        raise ValueError("an empty noise_grid: nothing to select sigma^2 from")
    return [float(nv) for nv in noise_grid]


def _validation_data(data: uci.UCISplit, val_seed: int, val_fraction: float):
    fit_rows, val_rows = validation_rows(data.x_train.shape[0], data.split, val_seed, val_fraction)
    return _restandardise(data, fit_rows, val_rows)


def _select(record: dict[str, Any], preds: Any, y_v: np.ndarray, ys_f: float, grid: list[float],
            data: uci.UCISplit, method: Method) -> tuple[float, str]:
    """The grid's sigma^2 with the lowest validation MNLL (written into ``record``), and the selection's text."""
    val_mnll = []
    for pred in preds:
        score = evaluate(y_v, pred, ys_f)["test_mnll"]
        val_mnll.append(score if math.isfinite(score) else math.inf)
    if not any(math.isfinite(v) for v in val_mnll):
        raise RuntimeError(f"{data.name} split {data.split}, {method.id}: every sigma^2 of the grid diverged")
    best = int(np.argmin(val_mnll))
    record["val_mnll"] = val_mnll
    record["noise_grid"] = list(grid)
    return float(grid[best]), f"validation MNLL over {len(grid)} values"


def _cell_record(record: dict[str, Any], data: uci.UCISplit, method: Method, pred: Prediction, noise_var: float,
                 selection: str, start: float) -> dict[str, Any]:
    scores = evaluate(data.y_test, pred, data.y_std)
    scores.update(calibration(data.y_test, pred, data.y_std))
    if pred.info:
        record["info"] = pred.info
    record.update(
        dataset=data.name, split=int(data.split), method=method.name, hidden_layers=int(method.hidden_layers),
        noise_var=noise_var * data.y_std**2, noise_var_std_units=noise_var, **scores,
        wall_s=time.perf_counter() - start, diverged_particles=int(pred.diverged),
        n_components=int(np.asarray(pred.f).shape[0]), selection=selection,
    )
    return record


class CellStore:
    """Finished cells as JSON files ``<root>/<dataset>/<method id>/split-<k>.json``, written atomically."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def path(self, cell: Cell) -> Path:
        return self.root / cell.dataset / cell.method / f"split-{cell.split}.json"

    def get(self, cell: Cell) -> dict[str, Any] | None:
        p = self.path(cell)
        if not p.is_file():
            return None
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            warnings.warn(f"cell record {p} is unreadable: recomputing it", stacklevel=2)
            return None
        if not isinstance(rec, dict) or not all(f in rec for f in CELL_FIELDS):
            warnings.warn(f"cell record {p} is incomplete: recomputing it", stacklevel=2)
            return None
        return rec

    def put(self, cell: Cell, record: dict[str, Any]) -> Path:
        p = self.path(cell)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(_json_ready(record), fh, indent=1, sort_keys=True)
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return p


def _json_ready(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, float | np.floating):
        v = float(obj)
        return v if math.isfinite(v) else str(v)  # "inf"/"nan": JSON has no such numbers
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def run_cells(
    cells: Sequence[Cell],
    compute: Callable[[Cell], dict[str, Any]],
    store: CellStore,
    *,
    workers: int = 1,
    force: bool = False,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Records of ``cells`` (in their order): stored ones are read, the others computed and stored at once.

    With ``workers > 1`` up to that many cells run at the same time in threads. On an interrupt the cells
    still running are abandoned; every finished one is already on disk, so the next call resumes.
    """
    records: dict[int, dict[str, Any]] = {}
    todo = []
    for i, cell in enumerate(cells):
        rec = None if force else store.get(cell)
        if rec is None:
            todo.append(i)
        else:
            records[i] = rec
    bar = None
    if progress and todo:
        from tqdm import tqdm

        bar = tqdm(total=len(cells), initial=len(cells) - len(todo), desc="UCI cells", unit="cell")

    def finish(i: int, rec: dict[str, Any]) -> None:
        store.put(cells[i], rec)
        records[i] = rec
        if bar is not None:
            bar.set_postfix_str(f"{cells[i].label}: {rec['wall_s']:.1f}s")
            bar.update(1)

    try:
        if workers <= 1:
            for i in todo:
                finish(i, compute(cells[i]))
        else:
            with ThreadPoolExecutor(max_workers=int(workers)) as pool:
                pending: dict[Future, int] = {pool.submit(compute, cells[i]): i for i in todo}
                try:
                    while pending:
                        done, _ = wait(pending, return_when=FIRST_COMPLETED)
                        for fut in done:
                            finish(pending.pop(fut), fut.result())
                except BaseException:
                    for fut in pending:
                        fut.cancel()
                    raise
    finally:
        if bar is not None:
            bar.close()
    return [records[i] for i in range(len(cells))]
