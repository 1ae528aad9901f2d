"""What "same seed, same numbers" guarantees.

**Same machine, same seed -> identical numbers.** Every experiment draws all its randomness from one key
(``cfg.seed``), and XLA's compiled programs are deterministic on one CPU: a run from the command line and a
run in this process give bit-identical summaries and arrays. The experiment is the linear chapter's (Figures
2/5 and Section 4.1) made small (200 Adagrad steps, fewer exact samples): every part runs, float32 training,
the KL estimator and exact sampling among them. What another CPU computes (agreement within Monte-Carlo error, not identical digits) is
tested on the chapter's own run under another instruction set (``tests/book/test_book_isa.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from bootens_core.repro import store
from bootens_core.repro.experiments.linear.config import LinearConfig
from bootens_core.repro.experiments import linear

# The chapter's experiment made small (about 5 s): every part of it runs, on fewer steps and samples.
SMALL = {"steps": 200, "stages": [0, 200], "gd_steps": 20, "paper_steps": 50, "paper_stages": [0, 50],
         "n_selfdist_populations": 4, "n_map_samples": 200, "n_map_repeats": 4, "x_grid_points": 50}
SETTINGS = [arg for field, value in SMALL.items() for arg in ("--set", f"{field}={json.dumps(value)}")]


@pytest.fixture(scope="module")
def from_the_command_line(tmp_path_factory) -> store.Result:
    """The shortened linear experiment run by the CLI in a fresh process (and a fresh result cache)."""
    root = tmp_path_factory.mktemp("cli")
    env = dict(os.environ, BOOTENS_CACHE_DIR=str(root / "cache"))
    cmd = [sys.executable, "-m", "bootens_core.repro.cli", "run", "linear", "--quiet", "--out", str(root / "out"),
           *SETTINGS]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return store.load(root / "out" / "linear")


def test_same_machine_same_seed_identical_numbers(from_the_command_line, tmp_path):
    """An in-process run with the same seed and settings as the command line's: bit-identical."""
    cfg = LinearConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in SMALL.items()})
    here = store.load(store.save(linear.run(jax.random.key(cfg.seed), cfg, use_cache=False), tmp_path / "here"))
    there = from_the_command_line
    assert here.config == there.config  # the CLI's --set gave the same configuration
    assert json.dumps(here.summary, sort_keys=True) == json.dumps(there.summary, sort_keys=True)
    assert set(here.arrays) == set(there.arrays)
    for k in here.arrays:
        np.testing.assert_array_equal(here.arrays[k], there.arrays[k], err_msg=k)
