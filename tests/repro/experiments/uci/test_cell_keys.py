"""The UCI cell store's keys: every line of package code that computes a family's cells is in its key.

Two checks against the truth rather than against a list: (1) a cell of each family is computed under a profile
hook that records every Python function called; each package file those functions live in must be among the
files the family's key hashes, and each function of the experiment module among the functions whose source it
hashes; (2) a byte of the line search is changed in a copy of the package, and a fresh interpreter on that
copy gives the ensembles a new key and the families that never run the line search their old one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import jax
import pytest

import bootens_core
from bootens_core.repro.experiments.uci import experiment
from bootens_core.repro.experiments.uci.config import UCIConfig
from bootens_core.repro.config import (
    DeepEnsembleConfig,
    GPConfig,
    LBFGSConfig,
    MCDropoutConfig,
    NetworkConfig,
    SGHMCConfig,
)
from bootens_core.repro.harness import Cell

jax.config.update("jax_enable_x64", True)

_BESIDE = Path(__file__).resolve().parents[4].parent / "shared" / "data" / "uci"
MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(_BESIDE)
PKG = Path(bootens_core.__file__).resolve().parent
EXPERIMENT = Path(experiment.__file__).resolve()
MONITORING = os.path.join("jax", "_src", "monitoring.py")

# Small enough to run every family in seconds; the code paths are those of the paper-scale cells.
TINY = UCIConfig(
    datasets=("yacht",),
    n_particles=3,
    noise_grid=(0.01, 0.1),
    network=NetworkConfig(width=8),
    lbfgs=LBFGSConfig(steps=1, iters_per_step=2),
    mcd=MCDropoutConfig(epochs_x=1, samples=10),
    sghmc=SGHMCConfig(restarts=2, draws=2, burn_in=3, thin=3),
    deep=DeepEnsembleConfig(n_networks=2, epochs=1),
    gp=GPConfig(max_iter=3),
)


def _called(fn) -> set[tuple[str, str]]:
    """(file, qualified name) of every Python function called while fn() runs, in this thread and others."""
    seen: set[tuple[str, str]] = set()

    def hook(frame, event, arg):
        if event == "call":
            # A listener that jax.monitoring calls (the compile-time counter a timed cell registers, and
            # which stays registered for the process) is JAX reporting to us, not the cell calling package code.
            if frame.f_back is not None and frame.f_back.f_code.co_filename.endswith(MONITORING):
                return
            code = frame.f_code
            seen.add((code.co_filename, getattr(code, "co_qualname", code.co_name)))

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return seen


def _families():
    out = []
    for fam in experiment._FAMILIES:
        marks = []
        if fam == "gp" and not experiment.gp_available():
            marks.append(pytest.mark.skip(reason="GPflow/TensorFlow not installed"))
        out.append(pytest.param(fam, marks=marks))
    return out


@pytest.mark.skipif(not Path(MIRROR).is_dir(), reason=f"no UCI mirror at {MIRROR}")
@pytest.mark.parametrize("family", _families())
def test_every_module_a_cell_runs_is_in_its_family_key(family, monkeypatch):
    monkeypatch.setenv("BOOTENS_DATA_DIR", MIRROR)
    method_id = next(
        m
        for m in ("ensemble-1", "plain-1", "deep-1", "gp", "mcd-1", "sghmc-1")
        if m.partition("-")[0] == family
    )
    called = _called(lambda: experiment.compute_cell(jax.random.key(0), TINY, Cell("yacht", 0, method_id)))
    code = experiment.family_code(family)
    ours = {(Path(f).resolve(), q) for f, q in called if Path(f).resolve().is_relative_to(PKG)}
    assert ours, "the hook saw no package function: the test would pass vacuously"
    files = {p.relative_to(PKG).as_posix() for p, _ in ours if p != EXPERIMENT}
    missing = sorted(files - set(code.files))
    assert not missing, f"{family}: modules run by a cell but not in its key: {missing}"
    # Functions of the experiment module: by their top-level name (nested functions live in their parent's
    # source).
    hashed = {q.rpartition(":")[2] for q in code.functions}
    run = {q.split(".")[0] for p, q in ours if p == EXPERIMENT}
    assert not run - hashed, (
        f"{family}: functions of the experiment module run but not hashed: {run - hashed}"
    )


_PRINT_KEYS = """
import json
from bootens_core.repro.experiments.uci import experiment
from bootens_core.repro.experiments.uci.config import UCIConfig
print(json.dumps({f: experiment._family_hash(UCIConfig(), f) for f in experiment._FAMILIES}))
"""


def _keys_of(package_parent: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(package_parent), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", _PRINT_KEYS],
        env=env,
        cwd=package_parent,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_byte_of_the_line_search_changes_the_ensemble_keys_only(tmp_path):
    copy = tmp_path / "bootens_core"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    before = _keys_of(tmp_path)
    assert before == {
        f: experiment._family_hash(UCIConfig(), f) for f in experiment._FAMILIES
    }  # a copy keys alike
    path = copy / "ensemble" / "linesearch.py"
    data = bytearray(path.read_bytes())
    i = data.index(b"#")  # a comment's first byte: the code runs the same, the bytes differ
    data[i + 1] = ord("!") if data[i + 1] != ord("!") else ord("?")
    path.write_bytes(bytes(data))
    after = _keys_of(tmp_path)
    changed = {f for f in before if before[f] != after[f]}
    assert changed == {"ensemble", "plain"}, changed


@pytest.mark.parametrize(
    ("backend", "precision", "float32"),
    [("cpu", None, True), ("cpu", "high", True), ("gpu", "highest", True), ("gpu", "float32", True),
     ("gpu", None, False), ("gpu", "high", False), ("gpu", "tensorfloat32", False),
     ("tpu", "bfloat16", False)],
)
def test_cell_keys_keep_reduced_products_apart_and_float32_together(backend, precision, float32, monkeypatch):
    # a GPU set to "highest" computes float32 products in float32, as a CPU does whatever the setting: the
    # same key; TF32 or bf16 passes (a GPU's default, "high", "bfloat16") get keys of their own
    cfg = UCIConfig()
    on_cpu = experiment._family_hash(cfg, "ensemble")  # this test runs on a CPU
    monkeypatch.setattr(experiment.jax, "default_backend", lambda: backend)
    with jax.default_matmul_precision(precision):
        key = experiment._family_hash(cfg, "ensemble")
        assert (key == on_cpu) is float32
