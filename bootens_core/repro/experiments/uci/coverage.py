"""How much of the paper's Tables 2-3 the committed paper-scale records hold, and what is left to run.

A **column** is one dataset x method x depth of Tables 2-3 (Boston / bootstrap ensemble / 4 layers); its two
metrics, RMSE and MNLL, share the column's cells (one cell per split). The rules, stated before any record is
read:

* **Counted cells.** A cell counts when it was computed with float32 products: on a CPU, or on a GPU where
  the cell as its returned pack (under ``packs/``) holds it records float32 products
  (:func:`~bootens_core.repro.experiments.uci.window.made_in_float32`: ``matmul_precision`` "highest", or,
  made before cells recorded it, a commit after the one that made float32 products the default). Any other GPU cell was made with JAX's default TF32
  products there, or its precision is not on record (lower precision than the paper's float32; the project's
  repeat of seven such cells in float32 found the TF32 ones worse): it counts neither towards a column nor as
  evidence, and is reported apart.
* **Complete at the paper's setting**: a record made with the paper's settings of the method
  (:func:`differences` is empty) holds a counted cell on every split of the dataset (10, 5 on Protein:
  ``data.uci.PAPER_SPLITS``).
* **Complete with deviations**: complete at the paper's setting, or a named deviation record
  (:data:`DEVIATIONS`) holds a counted cell on every split **and** there is evidence that the paper's setting
  fails on that dataset and depth (:data:`EVIDENCE_RULE`).

Everything is read from disk and computed here; nothing is hard-coded about which cells exist.
``python -m bootens_core.repro.experiments.uci.coverage`` prints the plan of what is left
(:func:`plan_markdown`).
"""

from __future__ import annotations

__all__ = [
    "DEVIATIONS",
    "DEVICES",
    "COST_RECORDS",
    "EVIDENCE_RECORDS",
    "EVIDENCE_RULE",
    "FAMILIES",
    "LABELS",
    "MIN_EVIDENCE_SPLITS",
    "PAPER_RECORDS",
    "Cell",
    "Column",
    "CoverageError",
    "Deviation",
    "Evidence",
    "FamilyCount",
    "PackCell",
    "PlanRow",
    "Record",
    "columns",
    "count_text",
    "counted",
    "deviation_table",
    "device_seconds",
    "differences",
    "evidence",
    "family_counts",
    "family_table",
    "load",
    "main",
    "plan",
    "plan_markdown",
    "PRIOR_RECORDS",
    "PriorRow",
    "prior_rows",
    "read_packs",
    "read_record",
    "tf32_counts",
]

import argparse
import csv
import itertools
import json
import math
import statistics
import sys
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from .window import made_in_float32

# The paper's method columns of Tables 2-3 as (method, hidden layers); the GP has no layers (0).
FAMILIES: tuple[tuple[str, int], ...] = (
    ("ensemble", 1), ("ensemble", 4), ("mcd", 1), ("mcd", 4), ("sghmc", 1), ("gp", 0))
LABELS: dict[tuple[str, int], str] = {
    ("ensemble", 1): "Bootstrap ensemble 1-layer", ("ensemble", 4): "Bootstrap ensemble 4-layer",
    ("mcd", 1): "MC dropout 1-layer", ("mcd", 4): "MC dropout 4-layer", ("sghmc", 1): "SGHMC 1-layer",
    ("gp", 0): "GP",
}
# The devices of cells.csv's `device` column, in the plan's order, with the plan's short names.
DEVICES: dict[str, str] = {"cpu": "CPU", "NVIDIA H100 80GB HBM3": "H100", "NVIDIA H200": "H200"}
# The records of the paper's setting (folders under results/paper/).
PAPER_RECORDS: tuple[str, ...] = ("uci", "uci-mcd-sghmc")
# Records of other settings whose cells cost the work of the paper's, for the plan's seconds per cell: SGHMC
# with the step sqrt(lr) runs the paper's steps, restarts and draws (the step size changes no work).
COST_RECORDS: tuple[str, ...] = ("uci-sghmc-sqrt-lr",)
# Records whose cells may serve as evidence that the paper's setting fails: the paper's records, and the
# paper's prior at 4 layers on fewer particles (uci-4layer-prior/normal-1).
EVIDENCE_RECORDS: tuple[str, ...] = ("uci", "uci-4layer-prior/normal-1")
# Fewest counted splits of the paper's setting on which the evidence test is made: the fewest on which the
# verdict rule of the records gives a verdict (experiment.MIN_SPLITS; with two, one degree of freedom).
MIN_EVIDENCE_SPLITS = 3
EVIDENCE_RULE = (
    "The paper's setting fails on a dataset and depth when its cells there, computed with float32 products "
    f"(at least {MIN_EVIDENCE_SPLITS} splits, from the records of the paper's setting or the paper's prior "
    "on fewer particles), have a mean test RMSE significantly worse than the paper's published mean: the "
    "records' Welch-type t-test (SE = SD/sqrt(n) on both sides, the paper's SD at least 0.005 and its "
    "printed mean +-0.005), two-sided at 0.05, verdict 'worse'. RMSE alone is tested, once per column, so "
    "no correction for multiplicity is needed. Cells made with TF32 products are not evidence.")


class CoverageError(ValueError):
    """A record or pack that cannot be read as the rules need it."""


class Cell(NamedTuple):
    """One row of a record's ``cells.csv``: one dataset x split x method x depth."""

    dataset: str
    split: int
    method: str
    hidden_layers: int
    test_rmse: float
    test_mnll: float
    wall_s: float
    device: str


class Record(NamedTuple):
    """A record folder: its name under the results root, its ``config.json`` and its cells."""

    name: str
    config: Mapping[str, Any]
    cells: tuple[Cell, ...]


class PackCell(NamedTuple):
    """One cell as a returned pack holds it, with what ``cells.csv`` lacks: precision and when it ran."""

    folder: str  # the pack's folder under packs/ (one device call, or its windows)
    dataset: str
    method: str
    hidden_layers: int
    split: int
    wall_s: float
    started: float  # POSIX seconds: finished - elapsed
    finished: float
    device: str
    float32: bool  # float32 products on record (see the module's rules)


class Deviation(NamedTuple):
    """A named deviation record: one field of the configuration away from the paper's, for some columns."""

    record: str
    name: str  # what readers see, e.g. "weight prior N(0, 1/fan-in)"
    field: str  # dotted configuration field
    value: Any
    families: tuple[tuple[str, int], ...]


DEVIATIONS: tuple[Deviation, ...] = (
    Deviation("uci-fanin", "weight prior N(0, 1/fan-in)", "network.scale_by_fan_in", True,
              (("ensemble", 4),)),
)


class Evidence(NamedTuple):
    """The evidence test of one column: the paper's setting's counted RMSEs against the paper's number."""

    n_splits: int
    mean: float
    paper_mean: float
    p: float
    verdict: str  # the verdict rule's word: worse, no significant difference, better, too few splits, failed,
    # no paper number
    holds: bool


class Column(NamedTuple):
    """One dataset x method x depth and how it counts."""

    dataset: str
    method: str
    hidden_layers: int
    n_splits: int
    paper_splits: tuple[int, ...]  # counted splits at the paper's setting
    tf32_splits: tuple[int, ...]  # splits held at the paper's setting only with TF32 products
    deviation: str | None  # the deviation's name, where one applies to the column
    deviation_splits: tuple[int, ...]
    evidence: Evidence | None
    complete_paper: bool
    complete_with_deviations: bool
    why: str  # why the column counts or does not, in words


class FamilyCount(NamedTuple):
    """The two counts of one method family, over the datasets."""

    label: str
    n_columns: int
    paper: int
    with_deviations: int
    tf32_only: int  # columns complete at the paper's setting only when TF32 cells count
    deviation_without_evidence: int  # columns a deviation record completes, without evidence


class PlanRow(NamedTuple):
    """One row of the plan: a column (or a family's total) with what is left and what it costs."""

    label: str
    left: int
    of: int
    seconds: dict[str, tuple[float, float, bool] | None]  # device -> (median, max, scaled)
    cpu_hours: float | None
    gpu_minutes: dict[str, float | None]  # GPU device -> minutes left at the median


# ------------------------------------------------------------------------------------------------------------
# Reading


def _float(row: Mapping[str, str], key: str, where: str) -> float:
    try:
        return float(row[key])
    except (TypeError, ValueError):
        raise CoverageError(f"{where}: column {key!r} is not a number: {row[key]!r}") from None


def read_record(root: str | Path, name: str) -> Record:
    """The record ``root/name``: its ``config.json`` and ``cells.csv``; a missing file or column is one
    error."""
    folder = Path(root) / name
    cfg_path, cells_path = folder / "config.json", folder / "cells.csv"
    for p in (cfg_path, cells_path):
        if not p.is_file():
            raise CoverageError(f"record {name!r}: {p.name} not found in {folder}")
    config = json.loads(cfg_path.read_text())
    need = ("dataset", "split", "method", "hidden_layers", "test_rmse", "test_mnll", "wall_s", "device")
    cells = []
    with cells_path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in need if c not in (reader.fieldnames or ())]
        if missing:
            raise CoverageError(f"record {name!r}: cells.csv lacks the column(s) {', '.join(missing)}")
        for i, row in enumerate(reader, start=2):
            where = f"record {name!r}, cells.csv line {i}"
            cells.append(Cell(row["dataset"], int(_float(row, "split", where)), row["method"],
                              int(_float(row, "hidden_layers", where)), _float(row, "test_rmse", where),
                              _float(row, "test_mnll", where), _float(row, "wall_s", where), row["device"]))
    return Record(name, config, tuple(cells))


def _utc(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=None).timestamp()


def read_packs(packs_root: str | Path) -> tuple[PackCell, ...]:
    """Every cell of every ``*.tar.gz`` pack under ``packs_root`` (each with its ``pack.json``), deduplicated;
    whether each computed float32 products in float32 is :func:`.window.made_in_float32`'s answer."""
    root = Path(packs_root)
    out: dict[tuple[Any, ...], PackCell] = {}
    for pack in sorted(root.rglob("*.tar.gz")):
        folder = pack.parent.relative_to(root).as_posix()
        try:
            with tarfile.open(pack, "r:gz") as tar:
                index = json.load(tar.extractfile("pack.json"))  # type: ignore[arg-type]
                for entry in index["cells"]:
                    cell = json.load(tar.extractfile(entry["path"]))  # type: ignore[arg-type]
                    prov = cell["provenance"]
                    finished = _utc(prov["finished_utc"])
                    elapsed = float(prov.get("elapsed_s", cell["wall_s"]))
                    pc = PackCell(folder, cell["dataset"], cell["method"], int(cell["hidden_layers"]),
                                  int(cell["split"]), float(cell["wall_s"]), finished - elapsed, finished,
                                  prov["device"]["kind"],
                                  made_in_float32(prov))
                    out[(pc.folder, pc.dataset, pc.method, pc.hidden_layers, pc.split, pc.wall_s)] = pc
        except (KeyError, TypeError, tarfile.TarError, json.JSONDecodeError) as err:
            raise CoverageError(
                f"pack {pack}: not a readable cell pack ({type(err).__name__}: {err})") from None
    return tuple(out.values())


# ------------------------------------------------------------------------------------------------------------
# Settings and precision

# The configuration fields that make a method's cells what they are (run-shaping fields such as datasets,
# max_splits or workers excluded). A dotted name is one field, a bare group name all of its fields.
_SETTING_FIELDS: dict[str, tuple[str, ...]] = {
    "ensemble": ("seed", "n_particles", "network", "lbfgs", "noise_grid", "val_fraction"),
    "mcd": ("seed", "network.width", "mcd"),
    "sghmc": ("seed", "network", "sghmc", "noise_grid", "val_fraction"),
    "gp": ("gp",),
}


def _field(cfg: Mapping[str, Any], name: str) -> Any:
    value: Any = cfg
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


_MISSING = object()


def _paper_config() -> dict[str, Any]:
    from ... import config as _config
    from .config import UCIConfig

    return _config.as_dict(UCIConfig.paper())


def differences(config: Mapping[str, Any], method: str, ignore: Iterable[str] = (),
                paper: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The setting fields of ``method`` on which ``config`` (a record's ``config.json``) differs from the
    paper profile's (a field the record lacks differs), less those in ``ignore``; empty: the paper's
    setting."""
    if method not in _SETTING_FIELDS:
        raise CoverageError(f"unknown method {method!r}; expected one of {', '.join(_SETTING_FIELDS)}")
    paper = _paper_config() if paper is None else paper
    names: list[str] = []
    for group in _SETTING_FIELDS[method]:
        value = _field(paper, group)
        names += [f"{group}.{k}" for k in value] if isinstance(value, Mapping) else [group]
    skip = set(ignore)
    return tuple(n for n in names if n not in skip and not _same(_field(config, n), _field(paper, n)))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is not _MISSING and a == b


def _key(c: Cell | PackCell) -> tuple[str, str, int, int]:
    return (c.dataset, c.method, c.hidden_layers, c.split)


def _match(cell: Cell, packs: Sequence[PackCell]) -> PackCell | None:
    """The pack cell that is this record cell: same dataset, method, depth, split and wall time (cells.csv
    keeps 6 significant digits)."""
    for pc in packs:
        if _key(pc) == _key(cell) and abs(pc.wall_s - cell.wall_s) <= 1e-5 * max(abs(pc.wall_s), 1.0) + 1e-3:
            return pc
    return None


def counted(cell: Cell, packs: Sequence[PackCell]) -> bool:
    """Whether ``cell`` counts: computed on a CPU, or on a GPU with a pack recording float32 products."""
    if cell.device == "cpu":
        return True
    pc = _match(cell, packs)
    return pc is not None and pc.float32


def device_seconds(cell: Cell, packs: Sequence[PackCell]) -> float:
    """The device time ``cell`` used: its ``wall_s``, or, for a GPU cell whose pack shows other cells of the
    same device call running on the GPU at the same time, its share, the integral over its run of
    1/(cells running). CPU cells keep their wall time: processes side by side there run on separate cores."""
    pc = _match(cell, packs)
    if pc is None or pc.finished <= pc.started or cell.device == "cpu":
        return cell.wall_s
    others = [q for q in packs if q.folder == pc.folder and q.device == pc.device]
    edges = sorted({pc.started, pc.finished, *(t for q in others for t in (q.started, q.finished)
                                              if pc.started < t < pc.finished)})
    share = 0.0
    for a, b in itertools.pairwise(edges):
        mid = 0.5 * (a + b)
        n = sum(q.started <= mid <= q.finished for q in others)
        share += (b - a) / max(n, 1)
    return cell.wall_s * share / (pc.finished - pc.started)


# ------------------------------------------------------------------------------------------------------------
# Columns and counts


def _splits(records: Iterable[Record], dataset: str, method: str, layers: int,
            packs: Sequence[PackCell]) -> tuple[set[int], set[int]]:
    """(counted splits, splits held only with TF32 products) of one column in ``records``."""
    good, tf32 = set(), set()
    for rec in records:
        for c in rec.cells:
            if (c.dataset, c.method, c.hidden_layers) == (dataset, method, layers):
                (good if counted(c, packs) else tf32).add(c.split)
    return good, tf32 - good


def evidence(records: Sequence[Record], dataset: str, method: str, layers: int, packs: Sequence[PackCell],
             reference: Mapping[tuple[str, str, int, str], tuple[float, float]], n_paper: int,
             paper: Mapping[str, Any] | None = None) -> Evidence:
    """The evidence test (:data:`EVIDENCE_RULE`) of one column over ``records`` (the evidence records):
    their counted cells of the column whose record has the paper's setting but for the number of particles,
    one value a split (the first record's, in ``records`` order), tested on RMSE against ``reference``."""
    from .experiment import compare_with_paper

    values: dict[int, float] = {}
    for rec in records:
        if differences(rec.config, method, ignore=("n_particles",), paper=paper):
            continue
        for c in rec.cells:
            if (c.dataset, c.method, c.hidden_layers) == (dataset, method, layers) and counted(c, packs):
                values.setdefault(c.split, c.test_rmse)
    nan = float("nan")
    ref = reference.get((dataset, method, layers, "rmse"))
    if ref is None:
        return Evidence(len(values), nan, nan, nan, "no paper number", False)
    v = [values[k] for k in sorted(values)]
    if len(v) < MIN_EVIDENCE_SPLITS:
        mean = statistics.fmean(v) if v else nan
        return Evidence(len(v), mean, ref[0], nan, "too few splits", False)
    r = compare_with_paper(v, ref[0], ref[1], n_paper)
    return Evidence(len(v), float(r["mean"]), ref[0], float(r["p"]), str(r["verdict"]),
                    r["verdict"] == "worse")


def columns(paper_records: Sequence[Record], deviation_records: Mapping[str, Record],
            evidence_records: Sequence[Record], packs: Sequence[PackCell],
            reference: Mapping[tuple[str, str, int, str], tuple[float, float]] | None = None,
            n_splits: Mapping[str, int] | None = None, deviations: Sequence[Deviation] = DEVIATIONS,
            paper: Mapping[str, Any] | None = None) -> list[Column]:
    """Every column of Tables 2-3 (:data:`FAMILIES` x datasets) and how it counts.

    ``paper_records``: records checked, per method, to be at the paper's setting (one that is not is refused
    with the fields that differ); ``deviation_records``: record name -> record, for :data:`DEVIATIONS` (each
    checked to differ from the paper's setting in its deviation's field alone); ``evidence_records``: see
    :func:`evidence`; ``reference``: the paper's numbers (default ``experiment.paper_reference()``);
    ``n_splits``: dataset -> splits (default ``data.uci.PAPER_SPLITS``).
    """
    from ....data.uci import PAPER_SPLITS
    from .experiment import paper_reference

    paper = _paper_config() if paper is None else paper
    reference = paper_reference() if reference is None else reference
    n_splits = dict(PAPER_SPLITS) if n_splits is None else dict(n_splits)
    for rec in paper_records:
        for m in sorted({c.method for c in rec.cells}):
            diff = differences(rec.config, m, paper=paper)
            if diff:
                raise CoverageError(f"record {rec.name!r} is not at the paper's setting for {m}: "
                                    f"{', '.join(diff)} differ")
    for dev in deviations:
        rec = deviation_records.get(dev.record)
        if rec is None:
            continue
        for m in sorted({c.method for c in rec.cells}):
            diff = differences(rec.config, m, paper=paper)
            if diff != (dev.field,) or _field(rec.config, dev.field) != dev.value:
                raise CoverageError(f"record {rec.name!r} is not the deviation {dev.name!r} alone: "
                                    f"{', '.join(diff) or 'nothing'} differ(s) from the paper's setting")
    out = []
    for method, layers in FAMILIES:
        for d, n in n_splits.items():
            good, tf32 = _splits(paper_records, d, method, layers, packs)
            good, tf32 = good & set(range(n)), tf32 & set(range(n))
            complete = len(good) == n
            dev = next((x for x in deviations if (method, layers) in x.families), None)
            dev_splits: set[int] = set()
            ev = None
            if complete:
                why = f"all {n} splits at the paper's setting"
            else:
                why = f"{len(good)} of {n} splits at the paper's setting"
                if tf32:
                    why += f", {len(tf32)} more without float32 products"
            with_dev = complete
            if dev is not None and not complete:
                rec = deviation_records.get(dev.record)
                dev_splits = _splits([rec], d, method, layers, packs)[0] & set(range(n)) if rec else set()
                ev = evidence(evidence_records, d, method, layers, packs, reference, n, paper)
                with_dev = len(dev_splits) == n and ev.holds
                if with_dev:
                    why = (f"{dev.name}, all {n} splits; the paper's setting is worse than the paper's RMSE "
                           f"({ev.n_splits} splits)")
                elif len(dev_splits) == n and ev.verdict == "too few splits":
                    why = (f"{dev.name}, all {n} splits, not counted: no evidence, {ev.n_splits} counted "
                           f"split(s) of the paper's setting, {MIN_EVIDENCE_SPLITS} needed")
                elif len(dev_splits) == n:
                    why = (f"{dev.name}, all {n} splits, not counted: the paper's setting is not worse "
                           f"({ev.verdict})")
            out.append(Column(d, method, layers, n, tuple(sorted(good)), tuple(sorted(tf32)),
                              dev.name if dev is not None else None, tuple(sorted(dev_splits)), ev, complete,
                              with_dev, why))
    return out


def family_counts(cols: Sequence[Column]) -> list[FamilyCount]:
    """The two counts per method family of :data:`FAMILIES`, over its datasets."""
    out = []
    for fam in FAMILIES:
        mine = [c for c in cols if (c.method, c.hidden_layers) == fam]
        out.append(FamilyCount(
            LABELS[fam], len(mine), sum(c.complete_paper for c in mine),
            sum(c.complete_with_deviations for c in mine),
            sum(not c.complete_paper and len(c.paper_splits) + len(c.tf32_splits) == c.n_splits
                for c in mine),
            sum(c.deviation is not None and len(c.deviation_splits) == c.n_splits
                and not c.complete_with_deviations for c in mine)))
    return out


def count_text(cols: Sequence[Column]) -> str:
    """The two overall counts, each with its denominator: "7 of 54 columns complete at the paper's setting,
    7 of 54 with deviations"."""
    n = len(cols)
    a = sum(c.complete_paper for c in cols)
    b = sum(c.complete_with_deviations for c in cols)
    return f"{a} of {n} columns complete at the paper's setting, {b} of {n} with deviations"


def family_table(cols: Sequence[Column]) -> Any:
    """The two counts per method family as a table (a ``pandas.DataFrame``, one row per family and one for
    all), each count with its denominator, with the datasets complete and the columns that a deviation or
    TF32 cells would complete but do not count."""
    import pandas as pd

    rows = []
    for fam, f in zip(FAMILIES, family_counts(cols), strict=True):
        mine = [c for c in cols if (c.method, c.hidden_layers) == fam]
        dev = [c for c in mine if c.deviation is not None and len(c.deviation_splits) == c.n_splits
               and not c.complete_paper]
        tf32 = [c for c in mine
                if not c.complete_paper and len(c.paper_splits) + len(c.tf32_splits) == c.n_splits]
        rows.append({
            "method": f.label,
            "complete at the paper's setting": f"{f.paper} of {f.n_columns}",
            "complete with deviations": f"{f.with_deviations} of {f.n_columns}",
            "complete on": ", ".join(c.dataset for c in mine if c.complete_with_deviations) or "—",
            "deviation complete, not counted": ", ".join(
                f"{c.dataset} (evidence: {c.evidence.verdict if c.evidence else '—'})"
                for c in dev if not c.complete_with_deviations) or "—",
            "complete only with TF32 cells": ", ".join(c.dataset for c in tf32) or "—",
        })
    n = len(cols)
    rows.append({"method": "All columns",
                 "complete at the paper's setting": f"{sum(c.complete_paper for c in cols)} of {n}",
                 "complete with deviations": f"{sum(c.complete_with_deviations for c in cols)} of {n}",
                 "complete on": "", "deviation complete, not counted": "",
                 "complete only with TF32 cells": ""})
    return pd.DataFrame(rows).set_index("method")


def deviation_table(cols: Sequence[Column]) -> Any:
    """The columns a deviation applies to and that are not complete at the paper's setting (a
    ``pandas.DataFrame``): the deviation's splits, the evidence test of the paper's setting (its counted
    splits, mean RMSE against the paper's, p, verdict) and whether the column counts, with why."""
    import pandas as pd

    rows = []
    for c in cols:
        if c.deviation is None or c.complete_paper:
            continue
        ev = c.evidence
        rows.append({
            "column": f"{c.dataset}, {LABELS[(c.method, c.hidden_layers)]}",
            "deviation": c.deviation,
            "deviation's splits": f"{len(c.deviation_splits)} of {c.n_splits}",
            f"evidence splits ({MIN_EVIDENCE_SPLITS} needed)": "—" if ev is None else str(ev.n_splits),
            "its RMSE (paper's)": "—" if ev is None or not math.isfinite(ev.mean)
            else f"{ev.mean:.3g} ({ev.paper_mean:.3g})",
            "p": "—" if ev is None or not math.isfinite(ev.p) else f"{ev.p:.2g}",
            "evidence": "—" if ev is None else ev.verdict,
            "counts with deviations": "yes" if c.complete_with_deviations else "no",
        })
    return pd.DataFrame(rows).set_index("column") if rows else pd.DataFrame()


# ------------------------------------------------------------------------------------------------------------
# The plan


def _estimate(cells: Sequence[Cell], dataset: str, method_id: str, device: str, packs: Sequence[PackCell],
              cost: Any) -> tuple[float, float, bool] | None:
    """(median, max, scaled) device seconds a cell of ``dataset`` on ``device``: measured on the dataset, else
    scaled by the cost units from the measured dataset nearest in cost."""
    on = [c for c in cells if c.device == device]
    here = [device_seconds(c, packs) for c in on if c.dataset == dataset]
    if here:
        return statistics.median(here), max(here), False
    if not on:
        return None
    target = cost(method_id, dataset)
    near = min({c.dataset for c in on}, key=lambda d: (abs(math.log(cost(method_id, d) / target)), d))
    ratio = target / cost(method_id, near)
    s = [device_seconds(c, packs) * ratio for c in on if c.dataset == near]
    return statistics.median(s), max(s), True


def _rows(label: str, items: Sequence[tuple[str, int, int]], pool: Sequence[Cell], method_id: str,
          packs: Sequence[PackCell], cost: Any) -> list[PlanRow]:
    """Plan rows of one family (or deviation): one per (dataset, left, of) with cells left, then its total."""
    block = []
    for d, left, of in items:
        if left <= 0:
            continue
        secs = {dev: _estimate(pool, d, method_id, dev, packs, cost) for dev in DEVICES}
        cpu = secs["cpu"]
        block.append(PlanRow(f"{label}, {d.capitalize()}", left, of, secs,
                             left * cpu[0] / 3600 if cpu else None,
                             {dev: (left * s[0] / 60 if s else None)
                              for dev, s in secs.items() if dev != "cpu"}))
    if not block:
        return []

    def add(vals: Sequence[float | None]) -> float | None:
        return None if any(v is None for v in vals) else sum(v for v in vals if v is not None)

    total = PlanRow(f"{label}, all", sum(r.left for r in block), sum(of for _, _, of in items),
                    {dev: None for dev in DEVICES}, add([r.cpu_hours for r in block]),
                    {dev: add([r.gpu_minutes[dev] for r in block]) for dev in DEVICES if dev != "cpu"})
    return [*block, total]


def plan(cols: Sequence[Column], paper_records: Sequence[Record], deviation_records: Mapping[str, Record],
         packs: Sequence[PackCell], deviations: Sequence[Deviation] = DEVIATIONS,
         cost_records: Sequence[Record] = ()) -> list[PlanRow]:
    """The remaining paper-scale cells: one row per column not complete at the paper's setting (cells left:
    splits without a counted cell, TF32 ones included), one per column a deviation record lacks splits of, and
    a total row per family and deviation (its denominator: every split of the family). Seconds per cell by
    device are the device seconds (:func:`device_seconds`) of the committed cells of the same method and depth
    in the same kind of record, every cell measured (TF32 ones too), or in ``cost_records`` (records of other
    settings that cost the same work, :data:`COST_RECORDS`); CPU hours and GPU minutes left are cells left x
    the median."""
    from .config import UCIConfig
    from .experiment import cost_units

    cfg = UCIConfig.paper()

    def cost(method_id: str, dataset: str) -> float:
        return cost_units(method_id, dataset, cfg)

    rows: list[PlanRow] = []
    for method, layers in FAMILIES:
        mid = method if method == "gp" else f"{method}-{layers}"
        mine = [c for c in cols if (c.method, c.hidden_layers) == (method, layers)]
        pool = [c for r in (*paper_records, *cost_records) for c in r.cells
                if (c.method, c.hidden_layers) == (method, layers)]
        items = [(c.dataset, c.n_splits - len(c.paper_splits), c.n_splits) for c in mine]
        rows += _rows(LABELS[(method, layers)], items, pool, mid, packs, cost)
        for dev in deviations:
            rec = deviation_records.get(dev.record)
            if (method, layers) not in dev.families or rec is None:
                continue
            dpool = [c for c in rec.cells if (c.method, c.hidden_layers) == (method, layers)]
            ditems = [(c.dataset, c.n_splits - len(_splits([rec], c.dataset, method, layers, packs)[0]
                                                   & set(range(c.n_splits))), c.n_splits) for c in mine]
            rows += _rows(f"{LABELS[(method, layers)]}, {dev.name}", ditems, dpool, mid, packs, cost)
    return rows


def _num(x: float) -> str:
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def plan_markdown(rows: Sequence[PlanRow]) -> str:
    """The plan as a Markdown table (a scaled estimate is marked with a star)."""
    gpus = [d for d in DEVICES if d != "cpu"]
    head = (["column", "cells left"] + [f"s/cell {DEVICES[d]}: median (max)" for d in DEVICES]
            + ["CPU hours left"] + [f"{DEVICES[d]} minutes left" for d in gpus])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        total = r.label.endswith(", all")
        cells = [f"**{r.label}**" if total else r.label, f"{r.left} of {r.of}"]
        for d in DEVICES:
            s = r.seconds.get(d)
            star = "*" if s and s[2] else ""
            shown = "—" if s is None else f"{_num(s[0])}{star} ({_num(s[1])}{star})"
            cells.append("" if total else shown)
        cells.append("—" if r.cpu_hours is None else _num(r.cpu_hours))
        minutes = [r.gpu_minutes.get(d) for d in gpus]
        cells += ["—" if m is None else _num(m) for m in minutes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# Command


def tf32_counts(cols: Sequence[Column]) -> dict[tuple[str, str, int], int]:
    """(dataset, method, hidden layers) -> how many splits of the column are held at the paper's setting only
    with TF32 products (the marks of the tables: such cells are shown, but not counted)."""
    return {(c.dataset, c.method, c.hidden_layers): len(c.tf32_splits) for c in cols if c.tf32_splits}


# The records holding 4-layer ensemble cells at the paper's weight prior N(0, 1), with what each differs in
# from the paper-scale setting: the paper's records (the zoom line search), the faithful fixed step (the paper's
# literal optimiser), and the prior study on fewer particles.
PRIOR_RECORDS: tuple[tuple[str, str], ...] = (
    ("uci", "paper's setting (zoom line search)"),
    ("uci-fixed-step", "paper's fixed step 0.5"),
    ("uci-4layer-prior/normal-1", "paper's setting, 20 particles"),
)


class PriorRow(NamedTuple):
    """The 4-layer ensemble at the paper's prior N(0, 1) on one dataset in one record."""

    record: str  # what readers see (PRIOR_RECORDS)
    dataset: str
    rmse: tuple[float, ...]  # every split's test RMSE, in split order
    float32: int  # how many of them were computed with float32 products (counted cells)
    paper_rmse: float
    paper_sd: float


def prior_rows(results: str | Path, records: Sequence[tuple[str, str]] = PRIOR_RECORDS) -> list[PriorRow]:
    """Every 4-layer ensemble cell at the paper's weight prior N(0, 1) in the ``records`` under ``results``
    (those present), per record and dataset, with the paper's RMSE for that column; packs decide which cells
    computed float32 products (:func:`counted`)."""
    from .experiment import paper_reference

    root = Path(results)
    packs = read_packs(root / "packs")
    ref = paper_reference()
    out = []
    for name, label in records:
        if not (root / name).is_dir():
            continue
        rec = read_record(root, name)
        if _field(rec.config, "network.scale_by_fan_in") is True:
            raise CoverageError(f"record {name!r} uses the fan-in prior, not the paper's N(0, 1)")
        by_ds: dict[str, list[Cell]] = {}
        for c in rec.cells:
            if (c.method, c.hidden_layers) == ("ensemble", 4):
                by_ds.setdefault(c.dataset, []).append(c)
        for ds, cells in by_ds.items():
            cells.sort(key=lambda c: c.split)
            mean, sd = ref[(ds, "ensemble", 4, "rmse")]
            out.append(PriorRow(label, ds, tuple(c.test_rmse for c in cells),
                                sum(counted(c, packs) for c in cells), mean, sd))
    return out


def load(results: str | Path) -> tuple[list[Record], dict[str, Record], list[Record], tuple[PackCell, ...]]:
    """The records the rules read from a results root (``results/paper``): paper's, deviations', evidence's,
    and the packs' cells."""
    root = Path(results)
    paper_recs = [read_record(root, n) for n in PAPER_RECORDS]
    devs = {d.record: read_record(root, d.record) for d in DEVIATIONS if (root / d.record).is_dir()}
    ev = [read_record(root, n) for n in EVIDENCE_RECORDS if (root / n).is_dir()]
    return paper_recs, devs, ev, read_packs(root / "packs")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bootens_core.repro.experiments.uci.coverage [--results results/paper] [--counts]``: print
    the plan of the remaining paper-scale cells as a Markdown table (``--counts``: the counts per family)."""
    parser = argparse.ArgumentParser(prog="python -m bootens_core.repro.experiments.uci.coverage",
                                     description=main.__doc__)
    parser.add_argument("--results", default="results/paper", help="the results root (default results/paper)")
    parser.add_argument("--counts", action="store_true", help="print the counts per family instead")
    args = parser.parse_args(argv)
    try:
        paper_recs, devs, ev, packs = load(args.results)
    except CoverageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    cols = columns(paper_recs, devs, ev, packs)
    if args.counts:
        for f in family_counts(cols):
            print(f"{f.label}: {f.paper} of {f.n_columns} at the paper's setting, "
                  f"{f.with_deviations} of {f.n_columns} with deviations")
        print(count_text(cols))
    else:
        root = Path(args.results)
        costs = [read_record(root, n) for n in COST_RECORDS if (root / n).is_dir()]
        print(plan_markdown(plan(cols, paper_recs, devs, packs, cost_records=costs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
