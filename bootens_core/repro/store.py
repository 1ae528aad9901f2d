"""Result store: a cache keyed by experiment + config + PRNG key + package source, with provenance.

A result is a directory holding ``summary.json`` (the numbers other checks rely on), ``arrays.npz``
(everything a figure needs), ``config.json`` and ``provenance.json`` (package versions, device, git commit,
wall time, the cache key). Directories are written to a temporary name and renamed into place, so an
interrupted run never leaves a half-written result that a later run would trust.

The cache lives in ``$BOOTENS_CACHE_DIR`` (the Makefile points it at ``.bootens_cache`` in the checkout),
else ``~/.cache/bootens``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from .config import as_dict

__all__ = [
    "Result",
    "source_hash",
    "cache_dir",
    "cache_key",
    "key_words",
    "save",
    "load",
    "load_record",
    "summary_dict",
    "cached",
    "cached_record",
    "provenance",
    "summary_as",
    "TypedSummary",
]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_T = TypeVar("_T")


@dataclasses.dataclass
class Result:
    """An experiment's output: arrays for figures, a JSON summary, its config and provenance."""

    name: str
    config: dict[str, Any]
    arrays: dict[str, np.ndarray]
    summary: dict[str, Any]
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Extra text files written beside the summary, e.g. ``{"cells.csv": ...}`` (names end in .csv).
    files: dict[str, str] = dataclasses.field(default_factory=dict)

    def __getitem__(self, item: str) -> np.ndarray:
        return self.arrays[item]


def source_hash(files: Sequence[str] | None = None) -> str:
    """sha256 over the path and bytes of every ``.py`` file of the package (or only of ``files``, paths
    relative to the package, for a cache that only those files can change)."""
    h = hashlib.sha256()
    paths = sorted(_PACKAGE_DIR.rglob("*.py")) if files is None else [_PACKAGE_DIR / f for f in sorted(files)]
    for path in paths:
        h.update(str(path.relative_to(_PACKAGE_DIR)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_dir() -> Path:
    """``$BOOTENS_CACHE_DIR`` or ``~/.cache/bootens``."""
    env = os.environ.get("BOOTENS_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "bootens"


def key_words(key: Any) -> list[int]:
    """The words of a JAX PRNG key (typed or raw) as plain integers, for cache keys and manifests."""
    import jax

    try:
        data = jax.random.key_data(key)
    except TypeError:
        data = key
    return np.asarray(data).astype(np.uint64).ravel().tolist()


def cache_key(name: str, cfg: Any, key: Any) -> str:
    """Hex digest identifying a result: experiment name, config, PRNG key and package source."""
    payload = {"name": name, "config": _jsonable(as_dict(cfg)), "key": key_words(key), "source": source_hash()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)
    return obj


_NON_FINITE = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


def _restore_non_finite(obj: Any) -> Any:
    """Undo :func:`_jsonable`'s spelling of non-finite floats, so a cached summary equals a fresh one."""
    if isinstance(obj, dict):
        return {k: _restore_non_finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_restore_non_finite(v) for v in obj]
    if isinstance(obj, str) and obj in _NON_FINITE:
        return _NON_FINITE[obj]
    return obj


def _git_commit() -> str | None:
    # A copy of the tree without .git (a remote GPU machine) names its commit through the environment.
    if os.environ.get("BOOTENS_GIT_COMMIT"):
        return os.environ["BOOTENS_GIT_COMMIT"]
    root = _PACKAGE_DIR.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not commit:
        return None
    return commit + ("-dirty" if dirty else "")


def provenance(wall_time_s: float | None = None) -> dict[str, Any]:
    """Versions, device, git commit, host and time of a run."""
    from importlib import metadata

    import jax

    versions = {}
    for pkg in ("jax", "jaxlib", "numpy", "scipy", "optax", "numpyro", "pandas", "matplotlib"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    dev = jax.devices()[0]
    return {
        "wall_time_s": wall_time_s,
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": {"platform": dev.platform, "kind": dev.device_kind, "count": jax.device_count()},
        # JAX's float32 matmul precision (None: its default, TF32 on NVIDIA GPUs since Ampere)
        "matmul_precision": jax.config.jax_default_matmul_precision,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "versions": versions,
        "git_commit": _git_commit(),
        "source_hash": source_hash(),
    }


def save(result: Result, directory: str | os.PathLike[str]) -> Path:
    """Write ``result`` into ``directory`` atomically (temporary sibling, then rename). The record's files are
    replaced, its ``*.csv`` files among them (:func:`load` reads every one as the record's); whatever else the
    folder holds (a note, a script, a folder of a study beside the record) is kept."""
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        (tmp / "summary.json").write_text(json.dumps(_jsonable(result.summary), indent=2, sort_keys=True) + "\n")
        (tmp / "config.json").write_text(json.dumps(_jsonable(result.config), indent=2, sort_keys=True) + "\n")
        (tmp / "provenance.json").write_text(
            json.dumps(_jsonable({"name": result.name, **result.provenance}), indent=2, sort_keys=True) + "\n"
        )
        np.savez_compressed(tmp / "arrays.npz", **result.arrays)
        for fname, text in result.files.items():
            if "/" in fname or not fname.endswith(".csv"):
                raise ValueError(f"extra result files must be plain *.csv names, got {fname!r}")
            (tmp / fname).write_text(text)
        if target.exists():
            for entry in target.iterdir():  # what the record does not write (a note, a study) stays
                if not (tmp / entry.name).exists() and not (entry.is_file() and entry.suffix == ".csv"):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.copytree(entry, tmp / entry.name, symlinks=True)
                    else:
                        shutil.copy2(entry, tmp / entry.name, follow_symlinks=False)
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def summary_as(cls: type[_T], result: Result | dict[str, Any]) -> _T:
    """The summary of ``result`` (or a summary dict, e.g. a committed ``summary.json``) as the typed record
    ``cls``, a dataclass whose fields are the keys a chapter reads; other keys stay in the dict only.

    A field with a default may be absent (a key the run writes only in some settings).

    Raises ``ValueError`` naming the keys without a default that the summary lacks (a record written before
    a key existed).
    """
    d = result.summary if isinstance(result, Result) else result
    fields = dataclasses.fields(cls)
    missing = [f.name for f in fields if f.name not in d
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"the summary has no {', '.join(missing)}: not a {cls.__name__} (written by other code?)")
    return cls(**{f.name: d[f.name] for f in fields if f.name in d})


class TypedSummary:
    """Base of a chapter's typed summary, a frozen dataclass whose fields are the keys of ``summary.json``.

    ``Cls.of(result)`` reads one from a result or a summary dict (:func:`summary_as`); ``record.as_summary()``
    is the dict the run writes. ``OPTIONAL``: groups of fields that a run writes only in some settings: a
    group whose first field is None is left out of the dict (its fields default to None).
    """

    OPTIONAL: ClassVar[tuple[tuple[str, ...], ...]] = ()

    @classmethod
    def of(cls: type[_T], result: Result | dict[str, Any]) -> _T:
        """The typed summary of a run's result (or of its summary dict, e.g. a committed ``summary.json``)."""
        return summary_as(cls, result)

    def as_summary(self) -> dict[str, Any]:
        """The ``summary.json`` dict: every field, but the optional groups the run did not compute."""
        d = dataclasses.asdict(self)  # type: ignore[call-overload]
        for group in self.OPTIONAL:
            if d[group[0]] is None:
                for name in group:
                    del d[name]
        return d


def summary_dict(s: TypedSummary | dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``summary.json`` dict of a typed summary (``s.as_summary()``); a dict (or None) is returned as is.

    For the rules and tables that take either a chapter's record or a committed summary dict."""
    return s.as_summary() if isinstance(s, TypedSummary) else s


def load(directory: str | os.PathLike[str]) -> Result:
    """Read a result written by :func:`save`; raises ``FileNotFoundError``/``ValueError`` if incomplete."""
    d = Path(directory)
    needed = ["summary.json", "config.json", "provenance.json", "arrays.npz"]
    missing = [f for f in needed if not (d / f).is_file()]
    if missing:
        raise FileNotFoundError(f"result directory {d} lacks {', '.join(missing)}")
    try:
        prov = json.loads((d / "provenance.json").read_text())
        with np.load(d / "arrays.npz", allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        return Result(
            name=prov.pop("name"),
            config=json.loads((d / "config.json").read_text()),
            arrays=arrays,
            summary=_restore_non_finite(json.loads((d / "summary.json").read_text())),
            provenance=prov,
            files={p.name: p.read_text() for p in sorted(d.glob("*.csv"))},
        )
    except (json.JSONDecodeError, KeyError, OSError, ValueError) as exc:
        raise ValueError(f"result directory {d} is corrupt ({exc}); delete it or rerun with --force") from exc


def load_record(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``(summary, provenance)`` of a result directory, without its arrays.

    For the committed records of paper-scale runs under ``results/paper/``, which keep only the small files.
    """
    d = Path(directory)
    missing = [f for f in ("summary.json", "provenance.json") if not (d / f).is_file()]
    if missing:
        raise FileNotFoundError(f"result record {d} lacks {', '.join(missing)}")
    try:
        summary = _restore_non_finite(json.loads((d / "summary.json").read_text()))
        prov = json.loads((d / "provenance.json").read_text())
    except (json.JSONDecodeError, OSError) as exc:
        raise ValueError(f"result record {d} is corrupt ({exc})") from exc
    return summary, prov


def cached(
    name: str,
    key: Any,
    cfg: Any,
    compute: Callable[[], tuple[dict[str, np.ndarray], dict[str, Any]]],
    *,
    use_cache: bool = True,
    force: bool = False,
) -> Result:
    """Return the stored result for ``(name, cfg, key, source)``, computing and storing it if absent.

    ``compute()`` returns ``(arrays, summary)``. With ``force`` the result is recomputed and overwritten;
    with ``use_cache=False`` nothing is read or written.
    """
    ckey = cache_key(name, cfg, key)
    where = cache_dir() / name / ckey
    if use_cache and not force and where.is_dir():
        try:
            return load(where)
        except (FileNotFoundError, ValueError):
            pass  # a damaged entry is recomputed below
    start = time.perf_counter()
    arrays, summary = compute()
    result = Result(
        name=name,
        config=as_dict(cfg),
        arrays={k: np.asarray(v) for k, v in arrays.items()},
        summary=summary,
        provenance={**provenance(time.perf_counter() - start), "cache_key": ckey},
    )
    if use_cache:
        save(result, where)
    return result


def cached_record(
    name: str,
    key: Any,
    cfg: Any,
    compute: Callable[[], dict[str, Any]],
    *,
    use_cache: bool = True,
) -> dict[str, Any]:
    """:func:`cached` for a computation that returns one dict (a study, a check): its top-level array values
    are stored in ``arrays.npz``, everything else in ``summary.json``. A record read back equals the one
    computed (the same keys in the same order, arrays with their dtypes, floats to the last bit), except that
    tuples come back as lists."""

    def _split() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        record = compute()
        arrays = {k: v for k, v in record.items() if isinstance(v, np.ndarray)}
        return arrays, {"keys": list(record), "values": {k: v for k, v in record.items() if k not in arrays}}

    result = cached(name, key, cfg, _split, use_cache=use_cache)
    values = result.summary["values"]
    return {k: result.arrays[k] if k in result.arrays else values[k] for k in result.summary["keys"]}
