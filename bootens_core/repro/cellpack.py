"""Running cells inside a time budget, sharding them over hosts, and packing finished cells into one file.

A short device window (minutes, a few files back) needs three things the plain resumable run
(:func:`bootens_core.repro.harness.run_cells`) does not give:

- **a budget**: :func:`run_budgeted` takes cells in the caller's priority order and starts one only when its
  estimated seconds fit in what is left of the budget (:func:`admissible`, which also counts the cells still
  running when several run at once), so the window ends with finished cells, none cut off. Estimates come from
  measured cell times (:class:`CellTimes`); XLA compile seconds are counted per cell by
  :class:`bootens_core.driver.CompileCounter` (``per_thread=True``).
- **shards**: :func:`shard` splits a cell list deterministically, so N hosts (or N windows) cover every cell
  exactly once (:func:`parse_shard` reads ``I/N``).
- **packs**: :func:`write_pack` puts the finished cells' JSON files, under their store-relative paths, into one
  ``.tar.gz`` with a ``pack.json`` manifest; :func:`read_pack` reads one back (for folding it into a store).

Nothing here knows the UCI benchmark: :mod:`bootens_core.repro.experiments.uci` supplies the order, the cost units
and the store. (This module is apart from :mod:`bootens_core.repro.harness` on purpose: the harness's source is part
of every UCI cell's hash, so an edit there would orphan every stored cell.)
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, NamedTuple

from .harness import Cell, CellStore

__all__ = [
    "PACK_FORMAT",
    "MANIFEST_NAME",
    "parse_shard",
    "shard",
    "Measurement",
    "measurement",
    "CellTimes",
    "admissible",
    "BudgetRun",
    "run_budgeted",
    "write_pack",
    "read_pack",
]

PACK_FORMAT = "bootens-cells/1"
MANIFEST_NAME = "pack.json"

# --------------------------------------------------------------------------------------------------------------
# shards

_SHARD = re.compile(r"^\s*(-?\d+)\s*/\s*(-?\d+)\s*$")


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N``; anything else is a one-line ``ValueError``."""
    m = _SHARD.match(str(text))
    if not m:
        raise ValueError(f"--shard takes I/N with 0 <= I < N (e.g. 0/4), got {text!r}")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1:
        raise ValueError(f"--shard I/N needs N >= 1, got {text!r}")
    if not 0 <= i < n:
        raise ValueError(f"--shard I/N needs 0 <= I < N, got {text!r}")
    return i, n


def shard(cells: Sequence[Cell], index: int, count: int) -> list[Cell]:
    """The cells whose position in ``cells`` is ``index`` modulo ``count`` (order kept).

    The position is in the full list the caller passes (for the UCI run: the priority order of every cell of
    the configuration), never in what is left to do, so the shards ``0/N`` ... ``N-1/N`` are disjoint and cover
    every cell whatever is already stored; taking every N-th cell of a priority order also gives each shard a
    like share of the expensive cells.
    """
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: needs 0 <= index < count")
    return [c for pos, c in enumerate(cells) if pos % count == index]


# --------------------------------------------------------------------------------------------------------------
# cell-time estimates


class Measurement(NamedTuple):
    """One measured cell: its method id, dataset, device kind, wall seconds and compile seconds (``None`` when
    not recorded: the wall time then includes any compilation), and whether it is a cell of the configuration
    being run (``own``: from its cell store) or a reference from elsewhere (another record, another setting)."""

    method: str
    dataset: str
    device: str
    wall_s: float
    compile_s: float | None = None
    own: bool = True


def measurement(
    record: Mapping[str, Any], *, own: bool = True, device: str | None = None
) -> Measurement | None:
    """The :class:`Measurement` of a cell record (``None`` when its ``wall_s`` is not a finite number).

    The method id is ``method`` (family) with ``-<hidden_layers>`` unless the layers are 0; the device kind is
    ``provenance.device.kind`` of the record, else ``device``, else ``"unknown"``.
    """
    try:
        wall = float(record["wall_s"])
        layers = int(record.get("hidden_layers", 0) or 0)
        family = str(record["method"])
        dataset = str(record["dataset"])
    except (KeyError, TypeError, ValueError):
        return None
    if not math.isfinite(wall) or wall < 0:
        return None
    compile_s = record.get("compile_s")
    try:
        compile_s = None if compile_s is None else float(compile_s)
    except (TypeError, ValueError):
        compile_s = None
    if compile_s is not None and not (math.isfinite(compile_s) and compile_s >= 0):
        compile_s = None
    prov = record.get("provenance")
    kind = None
    if isinstance(prov, Mapping) and isinstance(prov.get("device"), Mapping):
        kind = prov["device"].get("kind")
    method = family if layers == 0 or "-" in family else f"{family}-{layers}"
    return Measurement(method, dataset, str(kind or device or "unknown"), wall, compile_s, own)


class CellTimes:
    """Measured cell times, and the rule that estimates the seconds a pending cell will take.

    **The rule.** For a cell of method id ``m`` (family ``f``, e.g. ``ensemble`` for ``ensemble-4``) on dataset
    ``D``, measurements are grouped by (method id, dataset, device, own/reference); a group's compute seconds
    ``t`` are the largest ``wall_s - compile_s`` of its cells and its compile seconds the largest ``compile_s``
    (a cell without ``compile_s`` counts its whole ``wall_s`` as compute). The groups of family ``f`` are taken
    from the first non-empty tier of: own cells on this device; references on this device; own cells on any
    device; references on any device. Then

        estimate = safety * (min over those groups g of t_g * max(1, c(m, D) / c(m_g, D_g)) + compile)

    where ``c`` is the caller's cost units (for UCI: training rows x network parameters, see
    :func:`bootens_core.repro.experiments.uci.cost_units`) and ``compile`` is 0 once a cell of ``(m, D)`` has finished
    in this process (:meth:`warm`), else the largest compile seconds of those groups. Each term of the minimum
    is an upper bound when a cell's time does not decrease as ``c`` grows and grows at most in proportion to
    it (a device is never less efficient on a larger problem); the same method and dataset is the case ratio 1.
    With no measurement of the family at all the estimate is ``default_s``.

    **Probes.** A family with no measurement on this device has only estimates from another device (a CPU
    record, or ``default_s``), and those can overstate an accelerator's time by orders of magnitude, so that
    no cell of the family would ever fit a window. :meth:`probe` therefore lets one cell of such a family
    start although its estimate does not fit: its cheapest pending cell (least cost units; the first of them
    in the given order), once per family and process, while at least ``probe_share`` of the budget and at
    least ``probe_min_s`` seconds are left (a window too short for any cell of a paper-scale family starts
    none). When it finishes the family is measured on this device and the rule above applies.
    :attr:`probed` lists the probes.
    """

    def __init__(
        self,
        cost: Callable[[str, str], float],
        *,
        device: str,
        default_s: float = 600.0,
        safety: float = 1.25,
        family: Callable[[str], str] = lambda method: method.partition("-")[0],
        probe_share: float = 0.5,
        probe_min_s: float = 60.0,
    ) -> None:
        if not (default_s > 0 and math.isfinite(default_s)):
            raise ValueError(f"the default cell time must be a positive number of seconds, got {default_s}")
        if not safety >= 1:
            raise ValueError(f"the safety factor must be >= 1, got {safety}")
        if not 0 <= probe_share <= 1:
            raise ValueError(f"the probe share is the fraction of the budget a probe needs left, in [0, 1], "
                             f"got {probe_share}")
        if not probe_min_s >= 0:
            raise ValueError(f"the least time left for a probe must be >= 0 seconds, got {probe_min_s}")
        self.cost = cost
        self.device = device
        self.default_s = float(default_s)
        self.safety = float(safety)
        self.family = family
        # (method, dataset, device, own) -> [compute seconds, compile seconds or None]
        self._groups: dict[tuple[str, str, str, bool], list[Any]] = {}
        self._warm: set[tuple[str, str]] = set()
        self.probe_share = float(probe_share)
        self.probe_min_s = float(probe_min_s)
        self.probed: list[Cell] = []

    def add(self, m: Measurement) -> None:
        """Take one more measured cell into account."""
        compile_s = m.compile_s
        compute = max(m.wall_s - (compile_s or 0.0), 0.0)
        g = self._groups.setdefault((m.method, m.dataset, m.device, bool(m.own)), [0.0, None])
        g[0] = max(g[0], compute)
        if compile_s is not None:
            g[1] = compile_s if g[1] is None else max(g[1], compile_s)

    def add_all(self, ms: Iterable[Measurement | None]) -> None:
        for m in ms:
            if m is not None:
                self.add(m)

    def warm(self, method: str, dataset: str) -> None:
        """A cell of ``(method, dataset)`` finished in this process: its programs are compiled."""
        self._warm.add((method, dataset))

    def is_warm(self, method: str, dataset: str) -> bool:
        return (method, dataset) in self._warm

    def measured_here(self, method: str) -> bool:
        """Whether a cell of ``method``'s family has been measured on this device (own or reference)."""
        fam = self.family(method)
        return any(self.family(k[0]) == fam and k[2] == self.device for k in self._groups)

    def probe(self, cell: Cell, pending: Sequence[Cell], left_s: float | None,
              budget_s: float | None) -> bool:
        """Whether ``cell`` may start as its family's probe (the rule of the class docstring): its family is
        not measured on this device and has had no probe in this process, ``cell`` is the cheapest of its
        family among ``pending``, and ``left_s`` is at least ``probe_share`` of ``budget_s`` and at least
        ``probe_min_s`` (any, without a budget). A ``True`` answer records the probe."""
        fam = self.family(cell.method)
        if self.measured_here(cell.method) or any(self.family(c.method) == fam for c in self.probed):
            return False
        if left_s is not None and (left_s < self.probe_min_s or (
                budget_s is not None and left_s < self.probe_share * float(budget_s))):
            return False
        same = [c for c in pending if self.family(c.method) == fam]
        cheapest = min(same, key=lambda c: float(self.cost(c.method, c.dataset)), default=None)
        if cheapest != cell:
            return False
        self.probed.append(cell)
        return True

    def estimate(self, cell: Cell, *, warm: bool | None = None) -> float:
        """Estimated seconds of ``cell`` (the rule of the class docstring); ``warm`` overrides whether its
        compilation is already done (default: whether :meth:`warm` was called for its method and dataset)."""
        fam = self.family(cell.method)
        groups = [(k, v) for k, v in self._groups.items() if self.family(k[0]) == fam]
        tiers = (
            [g for g in groups if g[0][2] == self.device and g[0][3]],
            [g for g in groups if g[0][2] == self.device and not g[0][3]],
            [g for g in groups if g[0][3]],
            groups,
        )
        use = next((t for t in tiers if t), None)
        if use is None:
            return self.default_s
        c = float(self.cost(cell.method, cell.dataset))
        compute = min(t * max(1.0, c / float(self.cost(m, d))) for (m, d, _, _), (t, _) in use)
        if warm is None:
            warm = self.is_warm(cell.method, cell.dataset)
        compiles = [cs for _, (_, cs) in use if cs is not None]
        compile_s = 0.0 if warm or not compiles else max(compiles)
        return self.safety * (compute + compile_s)


# --------------------------------------------------------------------------------------------------------------
# the budgeted run


def admissible(
    estimate_s: float,
    now: float,
    deadline: float | None,
    running: Sequence[tuple[float, float]] = (),
    workers: int = 1,
) -> bool:
    """Whether a cell estimated at ``estimate_s`` seconds may start at ``now`` and still end by ``deadline``.

    ``running`` holds ``(estimate_s, started_at)`` of the cells running now. The cells running at once are
    assumed to share one device that is never slower in total than one cell alone (at worst it divides its time
    among them): with at most ``workers`` running, a cell has then done at least ``elapsed / workers`` seconds
    of its own work, and everything started finishes by ``now`` + the sum of what remains. So the cell may start
    when ``now + sum(max(e_i - elapsed_i / workers, 0)) + estimate_s <= deadline``. ``deadline=None``: no
    budget.
    """
    if deadline is None:
        return True
    w = max(int(workers), 1)
    committed = sum(max(e - (now - s) / w, 0.0) for e, s in running)
    return now + committed + float(estimate_s) <= deadline


class BudgetRun(NamedTuple):
    """What :func:`run_budgeted` did: cells computed (in finishing order, with their records), cells already
    stored, cells failed (with a one-line reason; not stored) and cells left (not stored, in the given order:
    never started, or failed)."""

    done: list[tuple[Cell, dict[str, Any]]]
    stored: list[Cell]
    failed: list[tuple[Cell, str]]
    remaining: list[Cell]


def run_budgeted(
    cells: Sequence[Cell],
    compute: Callable[[Cell], dict[str, Any]],
    store: CellStore,
    *,
    estimate: Callable[[Cell], float],
    budget_s: float | None = None,
    workers: int = 1,
    clock: Callable[[], float] = time.monotonic,
    start: float | None = None,
    on_finish: Callable[[Cell, dict[str, Any]], None] | None = None,
    force: bool = False,
    progress: bool = False,
    probe: Callable[[Cell, Sequence[Cell], float | None, float | None], bool] | None = None,
) -> BudgetRun:
    """Compute the cells of ``cells`` not yet in ``store``, in the given order, within ``budget_s`` seconds.

    Whenever a worker is free, the first cell (in the given order) whose ``estimate(cell)`` is
    :func:`admissible`, or that ``probe(cell, pending, seconds left, budget_s)`` lets start anyway (e.g.
    :meth:`CellTimes.probe`), starts; a cell that does neither is passed over (a later, cheaper one may fit)
    and reconsidered after every finished cell (the estimates may fall as measurements arrive). The budget runs
    from ``start`` (a ``clock()`` value; default: now). Each finished cell is stored at once (atomically) and then
    given to ``on_finish`` (in the calling thread). A cell that raises an ``Exception`` is reported in
    ``failed`` and the others go on; an interrupt leaves every finished cell stored. With ``workers > 1`` cells
    run in threads.
    """
    t0 = clock() if start is None else float(start)
    deadline = None if budget_s is None else t0 + float(budget_s)
    stored, todo = [], []
    for cell in cells:
        if not force and store.get(cell) is not None:
            stored.append(cell)
        else:
            todo.append(cell)
    pending = list(todo)
    done: list[tuple[Cell, dict[str, Any]]] = []
    failed: list[tuple[Cell, str]] = []
    bar = None
    if progress and todo:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc="UCI cells", unit="cell")

    def pick(running: list[tuple[float, float]]) -> tuple[Cell, float, float] | None:
        now = clock()
        left = None if deadline is None else deadline - now
        for j, cell in enumerate(pending):
            e = float(estimate(cell))
            if admissible(e, now, deadline, running, workers) or (
                    probe is not None and probe(cell, pending, left, budget_s)):
                return pending.pop(j), e, now
        return None

    def finish(cell: Cell, rec: dict[str, Any]) -> None:
        store.put(cell, rec)
        done.append((cell, rec))
        if on_finish is not None:
            on_finish(cell, rec)
        if bar is not None:
            bar.set_postfix_str(f"{cell.label}: {float(rec['wall_s']):.1f}s")
            bar.update(1)

    def fail(cell: Cell, exc: BaseException) -> None:
        failed.append((cell, f"{type(exc).__name__}: {exc}".splitlines()[0]))
        if bar is not None:
            bar.set_postfix_str(f"{cell.label}: failed")

    try:
        if workers <= 1:
            while (got := pick([])) is not None:
                cell = got[0]
                try:
                    rec = compute(cell)
                except Exception as exc:  # noqa: BLE001 -- one failed cell must not end the window
                    fail(cell, exc)
                    continue
                finish(cell, rec)
        else:
            with ThreadPoolExecutor(max_workers=int(workers)) as pool:
                running: dict[Future, tuple[Cell, float, float]] = {}
                try:
                    while True:
                        while len(running) < workers:
                            got = pick([(e, s) for _, e, s in running.values()])
                            if got is None:
                                break
                            running[pool.submit(compute, got[0])] = got
                        if not running:
                            break
                        finished, _ = wait(running, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            cell = running.pop(fut)[0]
                            exc = fut.exception()
                            if exc is not None and not isinstance(exc, Exception):
                                raise exc
                            if exc is not None:
                                fail(cell, exc)
                            else:
                                finish(cell, fut.result())
                except BaseException:
                    for fut in running:
                        fut.cancel()
                    raise
    finally:
        if bar is not None:
            bar.close()
    finished_cells = {c for c, _ in done}
    return BudgetRun(done, stored, failed, [c for c in todo if c not in finished_cells])


# --------------------------------------------------------------------------------------------------------------
# packs


def _check_pack_name(path: Path) -> None:
    if not (path.name.endswith(".tar.gz") or path.name.endswith(".tgz")):
        raise ValueError(f"a cell pack is a .tar.gz (or .tgz) file, got {str(path)!r}")


def write_pack(path: str | os.PathLike[str], files: Mapping[str, bytes], manifest: Mapping[str, Any]) -> Path:
    """Write ``files`` (store-relative path -> bytes) and ``manifest`` (as ``pack.json``) into one ``.tar.gz``.

    Written to a temporary sibling and renamed into place, so the file is always a whole pack (a run rewrites
    it after every finished cell). Members are sorted, with zero times and owners: the same cells give the same
    bytes.
    """
    target = Path(path)
    _check_pack_name(target)
    for rel in files:
        if rel == MANIFEST_NAME or rel.startswith("/") or ".." in Path(rel).parts:
            raise ValueError(f"a packed file needs a relative path inside the store, got {rel!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    members = {MANIFEST_NAME: (json.dumps(dict(manifest), indent=1, sort_keys=True) + "\n").encode()}
    members.update({rel: files[rel] for rel in sorted(files)})
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_pack(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(manifest, {store-relative path: cell record})`` of a pack written by :func:`write_pack`.

    A file that is not such a pack (not a tar.gz, no manifest, a member that is not a JSON object, a path
    outside the store) is a one-line ``ValueError`` naming it.
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"cell pack {p}: no such file")
    manifest: dict[str, Any] | None = None
    cells: dict[str, dict[str, Any]] = {}
    try:
        with tarfile.open(p, mode="r:gz") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                name = info.name
                if name.startswith("/") or ".." in Path(name).parts:
                    raise ValueError(f"cell pack {p}: member {name!r} lies outside the store")
                fh = tar.extractfile(info)
                data = json.loads(fh.read().decode()) if fh is not None else None
                if not isinstance(data, dict):
                    raise ValueError(f"cell pack {p}: member {name!r} is not a JSON object")
                if name == MANIFEST_NAME:
                    manifest = data
                else:
                    cells[name] = data
    except (tarfile.TarError, OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cell pack {p} is unreadable ({exc})") from exc
    if manifest is None or manifest.get("format") != PACK_FORMAT:
        raise ValueError(f"cell pack {p} has no {MANIFEST_NAME} of format {PACK_FORMAT}: "
                         "not a bootens cell pack")
    return manifest, cells
