"""One device window: the paper-scale cells still missing, in stages, as several processes sharing the device.

A paper-scale ensemble cell keeps a GPU busy for a few percent of its time, so P processes on one device
interleave rather than queue: on an NVIDIA H200, six processes finished 34 cells in the device time in which
one process finishes about 12 (``results/paper/packs/h200-2026-11-28/``). A window therefore runs P worker
processes (``--processes``), worker ``i`` taking shard ``i/P`` of every stage, each stage a
:func:`~bootens_core.repro.experiments.uci.experiment.run_pending` call with what is left of the window's
budget, its cells packed as they finish (``<stage>-<i>.tar.gz``), and its log beside. Before it starts, the
window prints how many cells the cost model (:class:`~bootens_core.repro.cellpack.CellTimes`, on the committed
records' cell times) expects each stage to finish, and at the end everything is put into one
``window.tar`` (a machine that returns few files returns one).

The stages (:data:`STAGES`), in this order:

1. ``ensemble-1``: the paper's 1-layer ensembles the committed records lack;
2. ``fanin-4``: the 4-layer ensembles with the weight prior N(0, 1/fan-in), the named deviation, which its own
   record ``uci-fanin`` lacks;
3. ``prior-4``: the paper's N(0, 1) prior at 4 layers on the first 3 splits of every dataset, the evidence
   that it fails there (cells made with TF32 products are made again);
4. ``tf32``: the other cells of the committed records that a GPU made with TF32 products, again in float32;
5. ``sigma-fine``: the 1-layer ensembles of Power and Kin8nm with the finer grid :data:`FINE_NOISE_GRID`
   (steps of 10^(1/8) from 0.01 to 0.1 instead of the grid's sqrt(10)), the sensitivity of their verdicts to
   the grid's resolution, paired split by split against the paper-scale record's cells.

``python -m bootens_core.repro.experiments.uci.window --budget 480 --processes 6 --out OUT`` (the parent);
the parent starts itself with ``--worker I/P`` for each worker.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "Stage",
    "STAGES",
    "FINE_NOISE_GRID",
    "StagePlan",
    "FLOAT32_BEFORE_FIELD",
    "made_in_float32",
    "tf32_cells",
    "stage_config",
    "plan",
    "main",
]

_RESULTS = Path("results") / "paper"
# The committed records a window reads (cell times, held cells, TF32 cells), as folders of results/paper.
_RECORDS = ("uci", "uci-mcd-sghmc", "uci-fanin")


class Stage(NamedTuple):
    """One stage of a window: the methods it runs, the settings it changes from the profile's (``sets``,
    field names as ``--set`` takes them), the committed records whose cells it passes over (folders under the
    records' root), the splits it is limited to (0: all), and whether the cells a GPU made with TF32 products
    are
    made again although a record holds them."""

    name: str
    methods: tuple[str, ...]
    sets: Mapping[str, Any]
    records: tuple[str, ...]
    max_splits: int = 0
    redo_tf32: bool = True
    datasets: tuple[str, ...] = ()  # the datasets it is limited to (none: the profile's)


# The sigma^2 grid of the sensitivity stage: 9 values from 0.01 to 0.1 in steps of 10^(1/8) (standardised label
# units), around the 0.03 the paper-scale grid picks on Power and Kin8nm where the GP fits about 0.05.
FINE_NOISE_GRID: tuple[float, ...] = tuple(round(10.0 ** (-2.0 + k / 8.0), 6) for k in range(9))

STAGES: tuple[Stage, ...] = (
    Stage("ensemble-1", ("ensemble-1",), {}, ("uci",)),
    Stage("fanin-4", ("ensemble-4",), {"network.scale_by_fan_in": True}, ("uci-fanin",)),
    Stage("prior-4", ("ensemble-4",), {}, ("uci",), max_splits=3),
    Stage("tf32", ("ensemble-4", "ensemble-1", "mcd-4", "mcd-1"), {}, ("uci", "uci-mcd-sghmc")),
    Stage("sigma-fine", ("ensemble-1",), {"noise_grid": FINE_NOISE_GRID}, ("uci-sigma-fine",),
          datasets=("power", "kin8nm")),
)


class StagePlan(NamedTuple):
    """What the cost model expects of a stage: ``pending`` cells (after the records and the store),
    ``expected`` of them finished within the budget over all workers, and their estimated seconds."""

    stage: str
    pending: int
    expected: int
    expected_s: float


# Commits that computed float32 products in float32 (commit 0876b39 and after) but did not yet write the
# setting
# into each cell's provenance (it is there from 89d0172 on); a test checks both with git where a history
# exists.
FLOAT32_BEFORE_FIELD = ("c02399d43fff52499e7496877e6499a23b2ee772",)


def made_in_float32(provenance: Mapping[str, Any]) -> bool:
    """Whether a cell with this ``provenance`` computed float32 products in float32: on a CPU always; elsewhere
    where it records ``matmul_precision`` ``"highest"``, or records none and names a commit of
    :data:`FLOAT32_BEFORE_FIELD`. The one rule of the project for the TF32 question (``uci.coverage`` too)."""
    device = provenance.get("device") or {}
    if device.get("platform") == "cpu" or device.get("kind") == "cpu":
        return True
    precision = provenance.get("matmul_precision")
    if precision is None:
        return provenance.get("git_commit") in FLOAT32_BEFORE_FIELD
    return precision == "highest"


def _identity(rec: dict[str, Any]) -> tuple[str, ...]:
    """What tells one computation of a cell from another: its device and its test RMSE and MNLL as
    ``cells.csv`` writes them (six significant digits)."""
    from .experiment import cell_device

    return (cell_device(rec), *(f"{float(rec[k]):.6g}" for k in ("test_rmse", "test_mnll")))


def tf32_cells(
    root: str | Path, records: Sequence[str] = _RECORDS
) -> dict[str, set[tuple[str, int, str]]]:
    """By record folder under ``root`` (results/paper): (dataset, split, method id) of its cells that a GPU
    made
    with JAX's default TF32 products, to be made again in float32.

    A row of a record's ``cells.csv`` computed on a GPU counts as float32 only where a committed pack (under
    ``root/packs``) holds that very cell -- the same key and settings of its method, the same device, and the
    row's test RMSE and MNLL to ``cells.csv``'s six digits, so a pack not folded into the record (a cell made
    again elsewhere) certifies nothing -- with a provenance that says so:
    ``matmul_precision`` ``"highest"``, or no such field and a commit of :data:`FLOAT32_BEFORE_FIELD`. Any
    other
    GPU row (a pack that says otherwise, or no pack at all) counts as TF32."""
    from ... import cellpack
    from ...config import from_dict
    from .config import UCIConfig
    from .experiment import cell_device, cell_of, record_cells, settings

    root = Path(root)
    packed: dict[tuple[str, int, str], list[tuple[Any, bool]]] = {}
    for path in sorted((root / "packs").rglob("*.tar.gz")):
        manifest, members = cellpack.read_pack(path)
        cfg = from_dict(UCIConfig, manifest["config"])
        for rec in members.values():
            cell = cell_of(rec)
            ok = made_in_float32(rec.get("provenance") or {})
            packed.setdefault((cell.dataset, cell.split, cell.method), []).append((cfg, ok, _identity(rec)))
    out: dict[str, set[tuple[str, int, str]]] = {}
    for name in records:
        folder = root / name
        if not (folder / "cells.csv").is_file():
            continue
        theirs = from_dict(UCIConfig, json.loads((folder / "config.json").read_text()))
        found = set()
        for rec in record_cells(folder):
            if cell_device(rec) in ("", "cpu"):
                continue
            cell = cell_of(rec)
            key = (cell.dataset, cell.split, cell.method)
            mine = settings(theirs, [cell.method])
            if not any(ok and same == _identity(rec) and settings(cfg, [cell.method]) == mine
                       for cfg, ok, same in packed.get(key, [])):
                found.add(key)
        out[name] = found
    return out


def stage_config(stage: Stage, base: Any) -> Any:
    """The :class:`~bootens_core.repro.experiments.uci.config.UCIConfig` of a stage: ``base`` with the stage's
    methods, settings, datasets (those of ``base`` it names) and split limit."""
    from ... import config

    cfg = dataclasses.replace(base, methods=tuple(stage.methods))
    if stage.datasets:
        cfg = dataclasses.replace(cfg, datasets=tuple(d for d in cfg.datasets if d in stage.datasets))
    for name, value in stage.sets.items():
        cfg = config.replace(cfg, name, value)
    if stage.max_splits:
        cfg = dataclasses.replace(cfg, max_splits=int(stage.max_splits))
    return cfg


def _redo(stage: Stage, redo: Mapping[str, set[tuple[str, int, str]]]) -> set[tuple[str, int, str]]:
    return set().union(*(redo.get(r, set()) for r in stage.records))


def _skipped(stage: Stage, cfg: Any, root: Path, redo: Mapping[str, set[tuple[str, int, str]]]) -> set[Any]:
    """The cells a stage passes over: those its records hold at its settings, less their TF32 cells."""
    from .experiment import cells, recorded_cells

    # a record folder not there yet (a fresh checkout, a test) holds nothing
    held = recorded_cells([root / r for r in stage.records if (root / r).is_dir()], cfg)
    again = _redo(stage, redo) if stage.redo_tf32 else set()
    held = {c for c in held if (c.dataset, c.split, c.method) not in again}
    if stage.name == "tf32":  # this stage runs the TF32 cells and nothing else
        held |= {c for c in cells(cfg) if (c.dataset, c.split, c.method) not in again}
    return held


def _record_dirs(root: Path) -> list[Path]:
    return [root / r for r in _RECORDS if (root / r).is_dir()]


def _pending(
    stage: Stage, cfg: Any, root: Path, redo: Mapping[str, set[tuple[str, int, str]]], key: Any
) -> list[Any]:
    from .experiment import cells, priority, stored_cells

    held = _skipped(stage, cfg, root, redo) | stored_cells(key, cfg)
    return [c for c in priority(cells(cfg)) if c not in held]


def _shard_pending(cfg: Any, todo: Sequence[Any], index: int, count: int) -> list[Any]:
    """The cells of ``todo`` that worker ``index`` of ``count`` runs: as run_pending shards them, the whole
    priority order first (so a cell's worker does not depend on what is stored), then what is left to do."""
    from ... import cellpack
    from .experiment import cells, priority

    left = set(todo)
    return [c for c in cellpack.shard(priority(cells(cfg)), index, count) if c in left]


def plan(
    stages: Sequence[Stage],
    base: Any,
    root: str | Path,
    budget_s: float,
    processes: int,
    key: Any = None,
    default_s: float = 600.0,
) -> list[StagePlan]:
    """How many cells of each stage the cost model expects ``processes`` workers to finish in ``budget_s``:
    each worker takes its shard of every stage in order and starts a cell when its estimate (the committed
    records' cell times under ``root``,
    :func:`~bootens_core.repro.experiments.uci.experiment.reference_times`;
    this device's, where measured) fits in what it has left, as :func:`run_pending` does."""
    import functools

    import jax

    from ... import cellpack
    from .experiment import cost_units, reference_times

    if not (math.isfinite(budget_s) and budget_s > 0):
        raise ValueError(f"a window's budget is a positive number of seconds, got {budget_s}")
    if int(processes) < 1:
        raise ValueError(f"a window needs at least one process, got {processes}")
    root = Path(root)
    key = jax.random.key(base.seed) if key is None else key
    redo = tf32_cells(root)
    refs = reference_times(_record_dirs(root))
    device = str(jax.devices()[0].device_kind)
    left = [float(budget_s)] * int(processes)
    out = []
    for stage in stages:
        cfg = stage_config(stage, base)
        times = cellpack.CellTimes(functools.partial(cost_units, cfg=cfg), device=device, default_s=default_s)
        times.add_all(cellpack.Measurement(*m[:5], own=False) for m in refs)
        todo = _pending(stage, cfg, root, redo, key)
        n, secs = 0, 0.0
        for i in range(int(processes)):
            warm: set[tuple[str, str]] = set()
            for cell in _shard_pending(cfg, todo, i, int(processes)):
                est = times.estimate(cell, warm=(cell.method, cell.dataset) in warm)
                if est <= left[i]:
                    left[i] -= est
                    n, secs = n + 1, secs + est
                    warm.add((cell.method, cell.dataset))
        out.append(StagePlan(stage.name, len(todo), n, secs))
    return out


def _worker(args: argparse.Namespace, base: Any) -> int:
    import jax

    from . import experiment

    i, n = (int(v) for v in args.worker.split("/"))
    root = Path(args.records)
    key = jax.random.key(base.seed)
    redo = tf32_cells(root)
    refs = experiment.reference_times(_record_dirs(root))
    for stage in _chosen(args):
        left = args.deadline - time.time()
        if left < 5:
            print(
                f"{stage.name} shard {i}/{n}: not started, {max(left, 0):.0f} s left of the window",
                flush=True,
            )
            continue
        cfg = stage_config(stage, base)
        held = _skipped(stage, cfg, root, redo)
        out = experiment.run_pending(
            key,
            cfg,
            budget_s=left,
            shard=(i, n),
            references=refs,
            recorded=held,
            default_s=args.default_cell_s,
            pack=Path(args.out) / f"{stage.name}-{i}.tar.gz",
            at_once=args.at_once,
        )
        print(
            f"{stage.name} shard {i}/{n}: ran {len(out.ran)} cell(s), {len(out.remaining)} remaining, "
            f"{len(out.failed)} failed",
            flush=True,
        )
        for note in out.notes:
            print(f"  {note}", flush=True)
    return 0


def _chosen(args: argparse.Namespace) -> tuple[Stage, ...]:
    return tuple(s for s in STAGES if args.stages is None or s.name in args.stages)


def _base_config(args: argparse.Namespace) -> Any:
    from ... import config, overrides
    from .config import UCIConfig

    cfg = config.for_profile(UCIConfig, args.profile)
    if args.datasets:
        cfg = dataclasses.replace(cfg, datasets=tuple(args.datasets))
    return overrides.apply_sets(cfg, args.set or [])


def main(argv: Sequence[str] | None = None) -> int:
    """The window's command line (the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m bootens_core.repro.experiments.uci.window", description=__doc__.split("\n")[0]
    )
    p.add_argument("--budget", type=float, required=True, help="seconds the workers may spend on cells")
    p.add_argument("--processes", type=int, default=1, help="worker processes sharing the device")
    p.add_argument("--out", required=True, help="folder of the packs, logs and window.tar")
    p.add_argument("--records", default=str(_RESULTS), help="the committed records' root (results/paper)")
    p.add_argument("--profile", choices=["quick", "paper"], default="paper")
    p.add_argument("--datasets", nargs="+", default=None)
    p.add_argument(
        "--set", action="append", metavar="FIELD=VALUE", help="a setting of every stage (JSON value)"
    )
    p.add_argument(
        "--default-cell-s",
        type=float,
        default=600.0,
        help="estimate of a cell whose method family has no measured time",
    )
    p.add_argument(
        "--stages",
        nargs="+",
        default=None,
        choices=[s.name for s in STAGES],
        help="run only these stages (default: all, in their order)",
    )
    p.add_argument("--plan-only", action="store_true", help="print what the cost model expects, run nothing")
    p.add_argument(
        "--at-once",
        action="store_true",
        help="a worker's pending splits of a dataset and ensemble method as one group (run uci --at-once)",
    )
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")  # as the caller set it, for the workers
    if args.worker is None:
        # the parent only plans: were it to preallocate JAX's default share of the device, the workers' shares
        # would not fit beside it (on one GPU they failed to start, out of memory)
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    import jax

    from ...cli import MATMUL_PRECISION

    jax.config.update("jax_enable_x64", True)  # as the bootens command: the experiments compute in float64
    if not os.environ.get("JAX_DEFAULT_MATMUL_PRECISION"):  # as the bootens command: the variable decides
        jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION)
    try:
        base = _base_config(args)
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        print(f"window: {exc}", file=sys.stderr)
        return 2
    if args.worker is not None:
        return _worker(args, base)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    try:
        stages = plan(
            _chosen(args), base, args.records, args.budget, args.processes, default_s=args.default_cell_s
        )
    except ValueError as exc:
        print(f"window: {exc}", file=sys.stderr)
        return 2
    total = sum(s.expected for s in stages)
    print(
        f"window: {args.processes} process(es), {args.budget:.0f} s each; "
        f"the cost model expects {total} cell(s) "
        f"of {sum(s.pending for s in stages)} pending:",
        flush=True,
    )
    for s in stages:
        print(f"  {s.stage}: {s.expected} of {s.pending} (~{s.expected_s:.0f} s of worker time)", flush=True)
    if args.plan_only:
        return 0
    deadline = start + args.budget
    env = {**os.environ, "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{min(0.8, 0.8 / args.processes):.3f}"}
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE")  # each worker holds its share from the start, unless told not to
    if preallocate is not None:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = preallocate
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    procs = []
    for i in range(args.processes):
        log = open(out / f"worker-{i}.log", "w")
        module = __spec__.name if __spec__ is not None else __name__  # "__main__" under python -m
        cmd = [
            sys.executable,
            "-m",
            module,
            *passed,
            "--worker",
            f"{i}/{args.processes}",
            "--deadline",
            repr(deadline),
        ]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    codes = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.time()) + 120))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
        log.close()
    with tarfile.open(out / "window.tar", "w") as tar:
        for f in sorted(out.iterdir()):
            if f.name != "window.tar":
                tar.add(f, arcname=f.name)
    print(
        f"window: workers exited {codes} after {time.time() - start:.0f} s; wrote {out / 'window.tar'}",
        flush=True,
    )
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
