"""Shared test set-up.

- Every test session writes results into a fresh temporary cache (``BOOTENS_CACHE_DIR``), so no test ever
  reads a result cached by an earlier run or by the book build (a stale cache would hide a regression).
- The other way round is allowed: a test that computes a whole experiment at a chapter's own settings hands
  the result to the book build that follows (the ``publish`` fixture writes it into ``BOOTENS_PUBLISH_DIR``,
  which ``make test-unit`` sets to the book's result cache). The cache key holds the configuration, the key
  and the hash of the package's source, so the chapter finds it only when the same code would compute it
  again; ``make test`` then computes the linear chapter's two runs once instead of twice.
- Matplotlib draws off-screen (Agg).
- Importing :mod:`bootens_core` first enables JAX's 64-bit mode for every test module.
- XLA compiles on a 2-core CPU are the bulk of the suite's time, and many tests compile the same program
  again (a new closure over the same model); a per-session JAX compilation cache (content-addressed by
  the program, the versions and the flags; never carried over between sessions) compiles each one once.
  A ``JAX_COMPILATION_CACHE_DIR`` set by the caller is respected.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")

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
    off) under its cache key in ``$BOOTENS_PUBLISH_DIR``, where a later book build finds it; nothing when
    the variable is unset or the entry exists (two workers computing the same run store identical numbers)."""
    from bootens_core.repro import store

    def _publish(result: store.Result) -> None:
        target = os.environ.get("BOOTENS_PUBLISH_DIR")
        if not target:
            return
        where = Path(target) / result.name / result.provenance["cache_key"]
        if not where.is_dir():
            store.save(result, where)

    return _publish
