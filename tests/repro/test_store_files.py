"""bootens_core.repro.store: the extra *.csv files of a Result, and source_hash over a chosen set of files."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from bootens_core.repro import store


def _result(files):
    return store.Result(name="t", config={"a": 1}, arrays={"x": np.arange(3.0)}, summary={"s": 1.0},
                        provenance={"p": 2}, files=files)


def test_files_roundtrip(tmp_path):
    files = {"cells.csv": "a,b\n1,2.5\n", "other.csv": "x\n"}
    where = store.save(_result(files), tmp_path / "r")
    assert (where / "cells.csv").read_text() == files["cells.csv"]
    got = store.load(where)
    assert got.files == files
    np.testing.assert_array_equal(got["x"], np.arange(3.0))
    # overwriting with no extra files leaves none behind
    assert store.load(store.save(_result({}), tmp_path / "r")).files == {}


@pytest.mark.parametrize("name", ["cells.txt", "sub/cells.csv", "../cells.csv", "cells"])
def test_bad_file_name(tmp_path, name):
    with pytest.raises(ValueError, match="csv"):
        store.save(_result({name: "x\n"}), tmp_path / "r")
    assert not (tmp_path / "r").exists()  # nothing half-written
    assert list(tmp_path.iterdir()) == []


def test_source_hash_of_chosen_files():
    a = store.source_hash(["repro/harness.py"])
    assert a == store.source_hash(["repro/harness.py"])  # stable
    assert a != store.source_hash(["models.py"])
    assert store.source_hash(["repro/harness.py", "models.py"]) == store.source_hash(["models.py", "repro/harness.py"])
    assert store.source_hash(["repro/harness.py", "models.py"]) not in (a, store.source_hash(["models.py"]))
    assert len(a) == 64


def test_source_hash_changes_only_with_its_files(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    (pkg / "data").mkdir(parents=True)
    (pkg / "repro").mkdir()
    for rel in ("repro/harness.py", "models.py", "data/uci.py"):
        shutil.copy(store._PACKAGE_DIR / rel, pkg / rel)
    monkeypatch.setattr(store, "_PACKAGE_DIR", pkg)
    chosen = ["repro/harness.py", "data/uci.py"]
    before, before_all = store.source_hash(chosen), store.source_hash()

    (pkg / "models.py").write_text((pkg / "models.py").read_text() + "\n# an edit elsewhere\n")
    assert store.source_hash(chosen) == before
    assert store.source_hash() != before_all  # the whole-package hash sees every file

    (pkg / "data" / "uci.py").write_text((pkg / "data" / "uci.py").read_text() + "\n# an edit\n")
    assert store.source_hash(chosen) != before
