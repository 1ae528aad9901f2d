"""A fitted ensemble on disk: one ``.npz`` file of arrays and a JSON header, versioned.

**The format** (``FORMAT = "bootens-ensemble"``, ``FORMAT_VERSION = 1``). A NumPy ``.npz`` archive (a zip of
``.npy`` files) readable without pickle (``numpy.load(path, allow_pickle=False)``) holding

- ``__header__``: a 0-d unicode array, the JSON text of a mapping with

  - ``format``: ``"bootens-ensemble"``; ``format_version``: an integer (this module writes 1 and reads
    versions up to :data:`FORMAT_VERSION`);
  - ``kind``: what was saved, e.g. ``"BootstrapEnsembleRegressor"``;
  - ``config``: the settings that rebuild it (an estimator's ``get_params()``), JSON values only;
  - ``fitted``: its fitted scalars and lists (selected noise variance, class labels, ...), JSON values only;
  - ``versions``: the versions of bootens, JAX, NumPy and Python that wrote the file (provenance; a file
    is read whatever versions wrote it, as long as its ``format_version`` is readable);

- one array per fitted array, under the names the writer gives them (e.g. ``particles/0/w``: the first
  layer's weights of every particle, leading axis ``k``), in their own dtypes.

A file whose ``format_version`` is larger than :data:`FORMAT_VERSION` was written by a newer bootens with a
format this one cannot read: :func:`read` raises :class:`IncompatibleFileError` saying so, as it does for a
file that is not a bootens ensemble at all. An estimator's ``save``/``load``
(:mod:`bootens_core.estimators`) are the usual way in; :func:`write` and :func:`read` are the layer below.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

__all__ = ["FORMAT", "FORMAT_VERSION", "Saved", "IncompatibleFileError", "write", "read"]

#: The format name every file's header carries.
FORMAT = "bootens-ensemble"
#: The format version this module writes, and the newest it reads.
FORMAT_VERSION = 1
_HEADER = "__header__"


class IncompatibleFileError(ValueError):
    """A file that is not a bootens ensemble, or one in a format version this bootens cannot read."""


class Saved(NamedTuple):
    """What :func:`read` returns: the header's parts and the arrays.

    Attributes:
        kind: what was saved (e.g. ``"BootstrapEnsembleRegressor"``).
        config: the settings that rebuild it.
        fitted: fitted scalars and lists.
        arrays: the fitted arrays by name.
        format_version: the file's format version.
        versions: the versions of the packages that wrote the file.
    """

    kind: str
    config: dict[str, Any]
    fitted: dict[str, Any]
    arrays: dict[str, np.ndarray]
    format_version: int
    versions: dict[str, str]


def _versions() -> dict[str, str]:
    import jax

    from . import __version__

    return {"bootens": __version__, "jax": jax.__version__, "numpy": np.__version__,
            "python": platform.python_version()}


def write(path: str | os.PathLike[str], kind: str, config: dict[str, Any], fitted: dict[str, Any],
          arrays: dict[str, np.ndarray]) -> Path:
    """Write one ensemble file (the format above) atomically; returns its path.

    ``config`` and ``fitted`` must hold JSON values only (``TypeError`` names the first that is not);
    ``arrays`` maps names (not ``__header__``) to numeric or boolean arrays. The path is used as given (a
    ``.npz`` suffix is not added); an existing file is replaced only once the new one is complete.
    """
    path = Path(path)
    if _HEADER in arrays:
        raise ValueError(f"{_HEADER!r} is reserved for the file's header")
    for name, arr in arrays.items():
        a = np.asarray(arr)
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise TypeError(f"array {name!r} has dtype {a.dtype}: only numeric and boolean arrays are saved")
    header = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": str(kind), "versions": _versions()}
    for part, value in (("config", config), ("fitted", fitted)):
        try:
            header[part] = json.loads(json.dumps(value, allow_nan=True))
        except TypeError as err:
            raise TypeError(f"the {part} of a saved ensemble must hold JSON values only: {err}") from None
    if not path.parent.exists():
        raise FileNotFoundError(f"cannot save to {path}: the folder {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **{_HEADER: np.array(json.dumps(header))},
                     **{name: np.asarray(a) for name, a in arrays.items()})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read(path: str | os.PathLike[str], kind: str | None = None) -> Saved:
    """Read a file :func:`write` wrote. With ``kind``, a file of another kind is refused.

    Raises:
        FileNotFoundError: no such file.
        IncompatibleFileError: not a bootens ensemble file, a format version newer than this bootens
            reads, or (with ``kind``) another kind of ensemble.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ensemble file at {path}")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if not magic:
        raise IncompatibleFileError(f"{path} is empty: not a bootens ensemble file")
    if magic != b"PK\x03\x04":  # every .npz is a zip archive
        raise IncompatibleFileError(f"{path} is not a bootens ensemble file (not a NumPy .npz archive)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if _HEADER not in npz.files:
                raise IncompatibleFileError(f"{path} is a NumPy archive but not a bootens ensemble file "
                                            "(no header)")
            header = json.loads(str(npz[_HEADER][()]))
            arrays = {name: npz[name] for name in npz.files if name != _HEADER}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, json.JSONDecodeError) as err:
        if isinstance(err, IncompatibleFileError):
            raise
        raise IncompatibleFileError(
            f"{path} is not a bootens ensemble file ({type(err).__name__}: {err})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise IncompatibleFileError(
            f"{path} is not a bootens ensemble file (its header names no {FORMAT!r} format)")
    version = header.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise IncompatibleFileError(f"{path} has no valid format version (got {version!r})")
    written_by = header.get("versions", {}).get("bootens", "an unknown version")
    if version > FORMAT_VERSION:
        raise IncompatibleFileError(
            f"{path} is in format version {version}, written by bootens {written_by}; this bootens reads "
            f"format versions up to {FORMAT_VERSION}: install a newer bootens to load it"
        )
    if kind is not None and header.get("kind") != kind:
        raise IncompatibleFileError(f"{path} holds a {header.get('kind')}, not a {kind}")
    return Saved(kind=header["kind"], config=header.get("config", {}), fitted=header.get("fitted", {}),
                 arrays=arrays, format_version=version, versions=header.get("versions", {}))
