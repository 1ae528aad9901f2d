"""What "same seed, same numbers" guarantees, and what it does not.

- **Same machine, same seed -> identical numbers.** Every experiment draws all its randomness from one key
  (``cfg.seed``), and XLA's compiled programs are deterministic on one CPU: two runs give bit-identical
  summaries and arrays.
- **Across machines -> agreement within Monte-Carlo error, not identical digits.** XLA compiles for the CPU
  it runs on; another instruction set rounds differently, and long trainings amplify the last bits into
  different particles, i.e. other, equally valid draws. The comparison below runs one experiment under the
  default instruction set and under another (``--xla_cpu_max_isa``), the nearest a single machine comes to
  another CPU, and requires every compared statistic to agree within what two independent Monte-Carlo
  draws would: |difference| <= z * sqrt(2) * (the statistic's Monte-Carlo sd), with z the two-sided
  Bonferroni quantile for a family-wise error of 1e-3 over the compared statistics. The two runs share
  their key, so their differences are smaller than independent draws' — the bound is conservative, and it
  fails only if the other instruction set computes something wrong.

The experiment is the linear chapter's (Figures 2/5 and Section 4.1), shortened to 2000 Adagrad steps: it
is fast, and its float32 training, KL estimator and exact sampling all move under another instruction set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from scipy import stats

from bootens_core.repro import store
from bootens_core.repro.experiments.linear.config import LinearConfig
from bootens_core.repro.experiments import linear

SETTINGS = ["--set", "steps=2000", "--set", "stages=[0,2000]", "--set", "gd_steps=100"]


def _other_isa() -> str:
    """An instruction set other than the one this process's XLA_FLAGS may already cap to."""
    current = [f.split("=", 1)[1] for f in os.environ.get("XLA_FLAGS", "").split()
               if f.startswith("--xla_cpu_max_isa=")]
    return "SSE4_2" if current and current[-1].upper() == "AVX" else "AVX"


def _launch(out: Path, cache: Path, isa: str | None) -> subprocess.Popen:
    env = dict(os.environ, BOOTENS_CACHE_DIR=str(cache))
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not (isa and f.startswith("--xla_cpu_max_isa"))]
    if isa:
        flags.append(f"--xla_cpu_max_isa={isa}")
    env["XLA_FLAGS"] = " ".join(flags)
    cmd = [sys.executable, "-m", "bootens_core.repro.cli", "run", "linear", "--quiet", "--out", str(out), *SETTINGS]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The shortened linear experiment: under the default and under another instruction set, at once."""
    root = tmp_path_factory.mktemp("isa")
    procs = {name: _launch(root / name, root / f"cache-{name}", isa)
             for name, isa in (("default", None), ("other", _other_isa()))}
    for name, p in procs.items():
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, f"{name}: {err[-2000:]}"
    return {name: store.load(root / name / "linear") for name in procs}


def test_same_machine_same_seed_identical_numbers(runs, tmp_path):
    """An in-process run with the same seed and settings as the default subprocess: bit-identical."""
    cfg = LinearConfig(steps=2000, stages=(0, 2000), gd_steps=100)
    here = store.load(store.save(linear.run(jax.random.key(cfg.seed), cfg, use_cache=False), tmp_path / "here"))
    there = runs["default"]
    assert here.config == there.config  # the CLI's --set gave the same configuration
    assert json.dumps(here.summary, sort_keys=True) == json.dumps(there.summary, sort_keys=True)
    assert set(here.arrays) == set(there.arrays)
    for k in here.arrays:
        np.testing.assert_array_equal(here.arrays[k], there.arrays[k], err_msg=k)


def _mc_sd(s: dict) -> dict[str, float]:
    """Each compared statistic's Monte-Carlo sd, from the run's own repeated exact sampling."""
    return {
        # The KL estimator's spread over 20 populations of exact posterior samples.
        "kl_final": s["self_distance_sd"],
        "paper_setting_kl_final": s["self_distance_sd"],
        "self_distance_mean": s["self_distance_sd"] / np.sqrt(20),
        # Section 4.1: the spread of the same statistics over repeats of exact sampling.
        "map_cov_rel_error": s["map_cov_rel_error_exact_samples_sd"],
        "map_cov_rel_error_exact_samples_mean": s["map_cov_rel_error_exact_samples_sd"] / np.sqrt(20),
        "map_subspace_kl": s["map_subspace_kl_exact_samples_sd"],
        # A chi-square statistic with D degrees of freedom has sd sqrt(2 D).
        "map_mean_chi2": np.sqrt(2 * s["map_mean_chi2_dof"]),
    }


def test_other_instruction_set_agrees_within_monte_carlo_error(runs):
    a, b = runs["default"].summary, runs["other"].summary
    sd = _mc_sd(a)
    z = stats.norm.isf(1e-3 / (2 * len(sd)))
    report = {k: (a[k], b[k], abs(a[k] - b[k]) / (np.sqrt(2) * sd[k])) for k in sd}
    too_far = {k: v for k, v in report.items() if not v[2] <= z}
    assert not too_far, f"beyond {z:.2f} Monte-Carlo sd: {too_far}"
    # Verdicts of the chapter's rules agree too (their margins are far larger than these differences).
    assert {k: str(v) for k, v in linear.verdicts.evaluate(a).items()} == {
        k: str(v) for k, v in linear.verdicts.evaluate(b).items()}
