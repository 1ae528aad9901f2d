"""bootens_core.repro.store: result directories, atomic writes, the cache and its keys, provenance."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import jax
import numpy as np
import pytest

from bootens_core.repro import store
from bootens_core.repro.config import as_dict
from bootens_core.repro.experiments.univariate.config import UnivariateConfig

CFG = UnivariateConfig.quick()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private, empty cache directory for one test."""
    d = tmp_path / "cache"
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(d))
    return d


def _result(scale=1.0):
    return store.Result(
        name="demo",
        config=as_dict(CFG),
        arrays={
            "a": np.arange(5) * scale,
            "b": np.linspace(0, 1, 6).reshape(2, 3) * scale,
            "i": np.array([1, 2]),
        },
        summary={"x": 1.5 * scale, "n": 3, "label": "ok", "nested": {"v": [1, 2]}, "none": None},
        provenance={"wall_time_s": 0.25, "note": "test"},
    )


def _leftovers(parent: Path, name: str):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def _assert_same(r1, r2):
    assert r1.name == r2.name
    assert r1.summary == r2.summary
    assert r1.config == r2.config
    assert r1.provenance == r2.provenance
    assert set(r1.arrays) == set(r2.arrays)
    for k in r1.arrays:
        np.testing.assert_array_equal(r1.arrays[k], r2.arrays[k])
        assert r1.arrays[k].dtype == r2.arrays[k].dtype


def test_save_load_round_trip(tmp_path):
    r = _result()
    where = store.save(r, tmp_path / "out" / "demo")
    assert where == tmp_path / "out" / "demo"
    assert sorted(p.name for p in where.iterdir()) == [
        "arrays.npz",
        "config.json",
        "provenance.json",
        "summary.json",
    ]
    _assert_same(r, store.load(where))
    assert r["a"] is r.arrays["a"]
    assert _leftovers(where.parent, "demo") == []


def test_summary_json_is_strict_json(tmp_path):
    r = _result()
    r.summary["bad"] = float("nan")
    where = store.save(r, tmp_path / "demo")

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    json.loads((where / "summary.json").read_text(), parse_constant=refuse)


def test_failing_write_leaves_nothing(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(store.np, "savez_compressed", boom)
    with pytest.raises(OSError, match="disk full"):
        store.save(_result(), tmp_path / "demo")
    assert not (tmp_path / "demo").exists()
    assert _leftovers(tmp_path, "demo") == []


def test_interrupted_write_keeps_the_previous_result(tmp_path, monkeypatch):
    target = tmp_path / "demo"
    store.save(_result(1.0), target)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store.np, "savez_compressed", interrupt)
    with pytest.raises(KeyboardInterrupt):
        store.save(_result(2.0), target)
    monkeypatch.undo()
    _assert_same(_result(1.0), store.load(target))
    assert _leftovers(tmp_path, "demo") == []


def test_overwrite(tmp_path):
    target = tmp_path / "demo"
    store.save(_result(1.0), target)
    store.save(_result(3.0), target)
    _assert_same(_result(3.0), store.load(target))
    assert _leftovers(tmp_path, "demo") == []


def test_overwrite_keeps_what_the_record_does_not_write(tmp_path):
    # a note, a script and a folder beside a record survive its rewrite; the record's own files are replaced,
    # a top-level CSV among them (load reads each as one of the record's files)
    target = tmp_path / "demo"
    store.save(_result(1.0), target)
    (target / "stale.csv").write_text("a\n1\n")
    (target / "NOTES.md").write_text("why the cells diverge\n")
    (target / "probe.py").write_text("print(1)\n")
    (target / "traces").mkdir()
    (target / "traces" / "a.csv").write_text("x\n1\n")
    store.save(_result(3.0), target)
    _assert_same(_result(3.0), store.load(target))
    assert (target / "NOTES.md").read_text() == "why the cells diverge\n"
    assert (target / "probe.py").read_text() == "print(1)\n"
    assert (target / "traces" / "a.csv").read_text() == "x\n1\n"
    assert not (target / "stale.csv").exists()
    assert _leftovers(tmp_path, "demo") == []


@pytest.mark.parametrize("missing", ["summary.json", "config.json", "provenance.json", "arrays.npz"])
def test_load_names_a_missing_file(tmp_path, missing):
    where = store.save(_result(), tmp_path / "demo")
    (where / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing):
        store.load(where)


@pytest.mark.parametrize("broken", ["summary.json", "config.json", "provenance.json"])
def test_load_reports_broken_json_as_corrupt(tmp_path, broken):
    where = store.save(_result(), tmp_path / "demo")
    (where / broken).write_text('{"truncated": ')
    with pytest.raises(ValueError, match="corrupt.*--force"):
        store.load(where)


def test_load_reports_a_broken_npz_as_corrupt(tmp_path):
    where = store.save(_result(), tmp_path / "demo")
    (where / "arrays.npz").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="corrupt"):
        store.load(where)


def test_load_reports_missing_name_as_corrupt(tmp_path):
    where = store.save(_result(), tmp_path / "demo")
    (where / "provenance.json").write_text("{}")
    with pytest.raises(ValueError, match="corrupt"):
        store.load(where)


class Counter:
    def __init__(self, summary=None):
        self.calls = 0
        self.summary = summary if summary is not None else {"value": 0.125, "n": 4}

    def __call__(self):
        self.calls += 1
        return {"a": np.arange(3.0)}, dict(self.summary)


def test_cached_computes_once_then_loads(cache):
    key = jax.random.key(0)
    compute = Counter()
    first = store.cached("demo", key, CFG, compute)
    assert compute.calls == 1
    where = cache / "demo" / store.cache_key("demo", CFG, key)
    assert (where / "summary.json").is_file()
    second = store.cached("demo", key, CFG, compute)
    assert compute.calls == 1  # loaded, not recomputed
    _assert_same(first, second)
    assert first.provenance["cache_key"] == store.cache_key("demo", CFG, key)


def test_cached_force_recomputes(cache):
    key = jax.random.key(0)
    compute = Counter()
    store.cached("demo", key, CFG, compute)
    compute.summary["value"] = 0.5
    again = store.cached("demo", key, CFG, compute, force=True)
    assert compute.calls == 2 and again.summary["value"] == 0.5
    assert store.cached("demo", key, CFG, compute).summary["value"] == 0.5  # the forced result was stored
    assert compute.calls == 2


def test_cached_without_cache_writes_nothing(cache):
    compute = Counter()
    store.cached("demo", jax.random.key(0), CFG, compute, use_cache=False)
    store.cached("demo", jax.random.key(0), CFG, compute, use_cache=False)
    assert compute.calls == 2
    assert not cache.exists() or not any(cache.rglob("*"))


def test_cached_recomputes_a_damaged_entry(cache):
    key = jax.random.key(0)
    compute = Counter()
    first = store.cached("demo", key, CFG, compute)
    where = cache / "demo" / first.provenance["cache_key"]
    (where / "summary.json").write_text("{")
    again = store.cached("demo", key, CFG, compute)
    assert compute.calls == 2 and again.summary == first.summary
    assert store.load(where).summary == first.summary  # and the entry was repaired


def test_cached_result_equals_the_computed_one_for_non_finite_numbers(cache):
    """A summary reads the same whether just computed or loaded from the cache, including inf/nan values
    (e.g. a KL that diverged): a check like ``s["kl"] <= level`` must not break on a cache hit."""
    key = jax.random.key(0)
    compute = Counter({"kl": float("inf"), "ratio": float("nan"), "ok": 1.0})
    fresh = store.cached("demo", key, CFG, compute)
    loaded = store.cached("demo", key, CFG, compute)
    assert compute.calls == 1
    assert loaded.summary["kl"] == fresh.summary["kl"] == math.inf
    assert math.isnan(loaded.summary["ratio"])


def test_cache_key_changes_with_name_config_and_key():
    key = jax.random.key(0)
    base = store.cache_key("demo", CFG, key)
    assert base == store.cache_key("demo", UnivariateConfig.quick(), jax.random.key(0))  # deterministic
    assert len(base) == 20 and int(base, 16) >= 0
    others = {
        store.cache_key("other", CFG, key),
        store.cache_key("demo", dataclasses.replace(CFG, steps=CFG.steps + 1), key),
        store.cache_key("demo", dataclasses.replace(CFG, stages=(0, 1)), key),
        store.cache_key("demo", CFG, jax.random.key(1)),
    }
    assert base not in others and len(others) == 4
    # A legacy uint32 key holds the same key data as the typed key of the same seed: the same result.
    assert store.cache_key("demo", CFG, jax.random.PRNGKey(1)) == store.cache_key(
        "demo", CFG, jax.random.key(1)
    )


def test_source_hash_is_a_stable_digest():
    h = store.source_hash()
    assert h == store.source_hash() and len(h) == 64


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "x"))
    assert store.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("BOOTENS_CACHE_DIR")
    assert store.cache_dir() == Path.home() / ".cache" / "bootens"


def test_tests_use_a_fresh_cache():
    """conftest points the cache at a temporary directory, never the checkout's .bootens_cache."""
    d = Path(os.environ["BOOTENS_CACHE_DIR"]).resolve()
    assert d != (Path(__file__).resolve().parents[2] / ".bootens_cache")
    assert "bootens_cache" in d.name


def test_provenance_fields():
    p = store.provenance(1.25)
    assert p["wall_time_s"] == 1.25
    assert {"jax", "jaxlib", "numpy", "scipy", "optax"} <= set(p["versions"])
    assert p["versions"]["jax"] == jax.__version__
    assert p["device"]["platform"] == jax.devices()[0].platform and p["device"]["count"] >= 1
    assert p["git_commit"] is None or isinstance(p["git_commit"], str) and len(p["git_commit"]) >= 40
    assert p["source_hash"] == store.source_hash()
    json.dumps(p)


def test_cached_records_provenance(cache):
    r = store.cached("demo", jax.random.key(0), CFG, Counter())
    for field in ("versions", "device", "git_commit", "wall_time_s", "source_hash", "cache_key"):
        assert field in r.provenance
    assert r.provenance["wall_time_s"] >= 0
    assert r.config == as_dict(CFG)
    loaded = store.load(cache / "demo" / r.provenance["cache_key"])
    assert loaded.name == "demo" and loaded.provenance == r.provenance


def test_load_record_reads_summary_and_provenance_without_arrays(tmp_path):
    res = store.Result(name="x", config={"a": 1}, arrays={"v": np.arange(3)}, summary={"k": float("inf"), "n": 2},
                       provenance={"device": {"kind": "cpu"}})
    where = store.save(res, tmp_path / "x")
    (where / "arrays.npz").unlink()  # committed records keep only the small files
    summary, prov = store.load_record(where)
    assert summary == {"k": float("inf"), "n": 2}
    assert prov["device"] == {"kind": "cpu"} and prov["name"] == "x"


def test_load_record_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="lacks summary.json, provenance.json"):
        store.load_record(tmp_path)
    (tmp_path / "summary.json").write_text("{")
    (tmp_path / "provenance.json").write_text("{}")
    with pytest.raises(ValueError, match="corrupt"):
        store.load_record(tmp_path)


@dataclasses.dataclass(frozen=True)
class _Typed:
    a: float
    b: str


def test_summary_as_reads_the_fields_and_names_what_is_missing():
    res = store.Result("demo", {}, {}, {"a": 1.5, "b": "x", "extra": 3})
    assert store.summary_as(_Typed, res) == _Typed(1.5, "x")  # other keys stay in the dict only
    assert store.summary_as(_Typed, {"b": "y", "a": 2.0}) == _Typed(2.0, "y")
    with pytest.raises(ValueError, match="the summary has no b: not a _Typed"):
        store.summary_as(_Typed, {"a": 1.0})


@dataclasses.dataclass(frozen=True)
class _TypedOptional:
    a: float
    c: int | None = None


def test_summary_as_lets_fields_with_defaults_be_absent():
    assert store.summary_as(_TypedOptional, {"a": 1.0}) == _TypedOptional(1.0)
    assert store.summary_as(_TypedOptional, {"a": 1.0, "c": 3}) == _TypedOptional(1.0, 3)
    with pytest.raises(ValueError, match="the summary has no a: not a _TypedOptional"):
        store.summary_as(_TypedOptional, {"c": 3})


@dataclasses.dataclass(frozen=True)
class _Record(store.TypedSummary):
    OPTIONAL = (("c", "d"),)
    a: float
    c: int | None = None
    d: str | None = None


def test_typed_summary_drops_an_optional_group_the_run_did_not_compute():
    assert _Record(1.0).as_summary() == {"a": 1.0}
    assert _Record(1.0, 2, "x").as_summary() == {"a": 1.0, "c": 2, "d": "x"}
    assert _Record.of({"a": 1.0}) == _Record(1.0)
    assert _Record.of(_Record(1.0, 2, "x").as_summary()) == _Record(1.0, 2, "x")


def test_summary_dict_takes_the_record_or_the_dict():
    rec = _Record(1.0, 2, "x")
    assert store.summary_dict(rec) == {"a": 1.0, "c": 2, "d": "x"}
    d = {"a": 3.0}
    assert store.summary_dict(d) is d
    assert store.summary_dict(None) is None


def test_cached_record_reads_back_the_record_it_computed(cache):
    key = jax.random.key(0)
    calls = []

    def compute():
        calls.append(1)
        return {"curve": np.array([0.1, 1 / 3, math.pi]), "steps": np.arange(3, dtype=np.int32), "n": 7,
                "final": {"a": 1 / 7, "b": None}, "rows": [{"x": float("nan"), "y": -math.inf}], "name": "z"}

    first = store.cached_record("demo-record", key, CFG, compute)
    again = store.cached_record("demo-record", key, CFG, compute)
    assert len(calls) == 1  # read back, not recomputed
    assert list(again) == list(first) == ["curve", "steps", "n", "final", "rows", "name"]
    for k in ("curve", "steps"):
        assert again[k].dtype == first[k].dtype
        np.testing.assert_array_equal(again[k], first[k])
    assert again["final"] == first["final"] and again["n"] == 7 and again["name"] == "z"
    assert math.isnan(again["rows"][0]["x"]) and again["rows"][0]["y"] == -math.inf
    store.cached_record("demo-record", key, CFG, compute, use_cache=False)
    assert len(calls) == 2
