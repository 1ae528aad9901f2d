"""Shared test set-up.

- Every test session writes results into a fresh temporary cache (``BOOTENS_CACHE_DIR``), so no test ever
  reads a result cached by an earlier run (a stale cache would hide a regression) -- with one exception, a
  chapter's own run at the chapter's own settings, which the tests and the book build share through
  ``BOOTENS_BOOK_CACHE`` (``make test`` sets it to the book's result cache): ``chapter_run`` reads the run
  the book build computed before the tests, or computes it and hands it (``publish``) to a book build that
  follows. Either way it is computed once, as the chapter computes it. The cache key holds the
  configuration, the key and the hash of the package's source, so a run is found only where the same code
  would compute it again.
- Matplotlib draws off-screen (Agg).
- Importing :mod:`bootens_core` first enables JAX's 64-bit mode for every test module.
- XLA compiles on a 2-core CPU are the bulk of the suite's time, and many tests compile the same program
  again (a new closure over the same model); a per-session JAX compilation cache (content-addressed by
  the program, the versions and the flags; never carried over between sessions) compiles each one once.
  A ``JAX_COMPILATION_CACHE_DIR`` set by the caller is respected.
- For the same reason the tests compile with XLA's LLVM backend at optimisation level 0
  (``--xla_backend_optimization_level=0``) and with XLA's older CPU fusion code generator
  (``--xla_cpu_use_fusion_emitters=false``), each unless the caller's ``XLA_FLAGS`` name it: the suite's
  programs are small and run briefly, so compiling them fast matters more than running them fast (measured
  on a 2-core CPU: level 0 took the deep-ReLU and ensemble-grid tests from 144 to 99 s; the older fusion
  code generator halves the XLA compile time of an L-BFGS and an Adam training loop, 23 -> 11 s, and took
  the ensemble, sampler and bench tests from 672 to 405 s). Both change rounding, as another CPU does. The
  book's chapters compile with XLA's defaults, so a chapter's own run that a test computes is computed as
  the chapter computes it: in a subprocess with the caller's ``XLA_FLAGS`` (``chapter_run``), where it also
  runs at full speed.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")

# Read by XLA when JAX first creates its CPU backend, after this file is imported (subprocesses inherit it).
_CALLER_XLA_FLAGS = os.environ.get("XLA_FLAGS")
_TEST_XLA_FLAGS = [flag for flag in ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
                   if flag.split("=")[0] not in (_CALLER_XLA_FLAGS or "")]
os.environ["XLA_FLAGS"] = " ".join([*(_CALLER_XLA_FLAGS or "").split(), *_TEST_XLA_FLAGS])

import jax  # noqa: E402
import pytest  # noqa: E402

# The package changes no JAX setting; the tests, like the experiments, compute in float64 (a subprocess test
# checks that importing the package leaves the mode alone).
jax.config.update("jax_enable_x64", True)

_COMPILE_CACHE: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _COMPILE_CACHE
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    _COMPILE_CACHE = tempfile.mkdtemp(prefix="bootens-jax-cache-")
    jax.config.update("jax_compilation_cache_dir", _COMPILE_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _COMPILE_CACHE is not None:
        shutil.rmtree(_COMPILE_CACHE, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _fresh_result_cache(tmp_path_factory: pytest.TempPathFactory):
    """Point ``BOOTENS_CACHE_DIR`` at a per-session temporary directory, and restore it afterwards."""
    previous = os.environ.get("BOOTENS_CACHE_DIR")
    os.environ["BOOTENS_CACHE_DIR"] = str(tmp_path_factory.mktemp("bootens_cache"))
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("BOOTENS_CACHE_DIR", None)
        else:
            os.environ["BOOTENS_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def publish() -> Callable[..., None]:
    """``publish(result)``: store ``result`` (a :class:`bootens_core.repro.store.Result` a test computed, cache
    off) under its cache key in ``$BOOTENS_BOOK_CACHE``, where a later book build finds it; nothing when
    the variable is unset or the entry exists (two workers computing the same run store identical numbers)."""
    from bootens_core.repro import store

    def _publish(result: store.Result) -> None:
        target = os.environ.get("BOOTENS_BOOK_CACHE")
        if not target:
            return
        where = Path(target) / result.name / result.provenance["cache_key"]
        if not where.is_dir():
            store.save(result, where)

    return _publish


# What a chapter's first cell does before its run, then the run with the cache off, saved for the parent.
_CHAPTER_RUN = """
import pickle, sys
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_default_matmul_precision", "highest")
from bootens_core.repro import experiments, store
name, out = sys.argv[1], sys.argv[2]
with open(out + "/config.pkl", "rb") as f:
    cfg = pickle.load(f)
experiment = experiments.get(name)  # the registry's name ("deep-relu"), not the module's
store.save(experiment.run(jax.random.key(cfg.seed), cfg, use_cache=False), out + "/result")
"""


@pytest.fixture(scope="session")
def book_env() -> dict[str, str]:
    """The environment for a subprocess that should compute as the book does: this one's, with the caller's
    ``XLA_FLAGS`` (without the tests' compile flags)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if _CALLER_XLA_FLAGS is not None:
        env["XLA_FLAGS"] = _CALLER_XLA_FLAGS
    return env


@pytest.fixture(scope="session")
def chapter_run(publish, book_env, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., object]:
    """``chapter_run(name, cfg)``: experiment ``name``'s run at ``cfg`` (key ``cfg.seed``), as the book's chapter
    computes it: read from ``$BOOTENS_BOOK_CACHE`` when the book build (or another test) stored it there under
    its cache key, otherwise computed in a fresh process with the caller's ``XLA_FLAGS`` (float64, cache off),
    read back and published for a book build that follows (``publish``). While the file
    ``$BOOTENS_BOOK_RUNNING`` exists (the book's chapters are executing) it waits for the run to appear."""
    from bootens_core.repro import store

    def _run(name: str, cfg: object) -> store.Result:
        shared = os.environ.get("BOOTENS_BOOK_CACHE")
        if shared:
            where = Path(shared) / name / store.cache_key(name, cfg, jax.random.key(cfg.seed))
            # make test starts the unit tests while the book's last chapters execute: wait for them
            running = os.environ.get("BOOTENS_BOOK_RUNNING")
            start = time.monotonic()
            while running and Path(running).exists() and not where.is_dir():
                if time.monotonic() - start > 3000:
                    raise RuntimeError(f"the {name} run did not appear in {shared} within 3000 s while the "
                                       f"book's chapters were executing ({running} exists)")
                time.sleep(2)
            if where.is_dir():
                return store.load(where)
        out = tmp_path_factory.mktemp(f"chapter-run-{name}")
        with open(out / "config.pkl", "wb") as f:
            pickle.dump(cfg, f)
        proc = subprocess.run([sys.executable, "-c", _CHAPTER_RUN, name, str(out)], env=book_env, capture_output=True,
                              text=True, timeout=3000)
        if proc.returncode != 0:
            raise RuntimeError(f"the {name} run failed in its subprocess:\n{proc.stderr[-4000:]}")
        result = store.load(out / "result")
        publish(result)
        return result

    return _run
