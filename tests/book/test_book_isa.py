"""Two chapters re-executed under another XLA instruction set: their checked outputs must not move, and the
linear chapter's run agrees with the book's within Monte-Carlo error.

The cheap form of ``.ci/isa_check.py`` (which does this for every chapter): the univariate chapter and the
linear chapter, whose checked output used to print a KL on a rounding boundary (6.15) that another CPU
printed as 6.1 instead of 6.2. Each runs in a fresh result cache, so nothing computed under the default
instruction set is reused; the caches are kept, and the linear chapter's run in it is compared with the
same run under the default instruction set (the book's, ``chapter_run``).

**Across machines -> agreement within Monte-Carlo error, not identical digits.** XLA compiles for the CPU
it runs on; another instruction set (``--xla_cpu_max_isa``, the nearest a single machine comes to another
CPU) rounds differently, and long trainings amplify the last bits into different particles, i.e. other,
equally valid draws. Every compared statistic must agree within what two independent Monte-Carlo draws
would: |difference| <= z * sqrt(2) * (the statistic's Monte-Carlo sd), with z the two-sided Bonferroni
quantile for a family-wise error of 1e-3 over the compared statistics. The two runs share their key, so
their differences are smaller than independent draws' -- the bound is conservative, and it fails only if
the other instruction set computes something wrong. The linear experiment moves in all its parts under
another instruction set: float32 training, the KL estimator and exact sampling.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bootens_core.repro import store
from bootens_core.repro.experiments import linear
from bootens_core.repro.experiments.linear.config import LinearConfig

ROOT = Path(__file__).resolve().parents[2]


def _other_isa() -> str:
    current = [f.split("=", 1)[1] for f in os.environ.get("XLA_FLAGS", "").split()
               if f.startswith("--xla_cpu_max_isa=")]
    return "SSE4_2" if current and current[-1].upper() == "AVX" else "AVX"


@pytest.fixture(scope="module")
def executed(tmp_path_factory, book_env):
    """The two chapters executed under the other instruction set: (exit status, report, kept result caches)."""
    pytest.importorskip("nbclient")
    out = tmp_path_factory.mktemp("isa")
    proc = subprocess.run(  # the chapters compiled as the book compiles them, but for another instruction set
        [sys.executable, str(ROOT / ".ci" / "isa_check.py"), "--isa", _other_isa(), "--out", str(out),
         "--keep-results", str(out / "results"), "univariate", "linear"],
        capture_output=True, text=True, timeout=1500, cwd=ROOT, env=book_env,
    )
    report = (out / "report.md").read_text() if (out / "report.md").exists() else proc.stderr[-3000:]
    return proc.returncode, report, out / "results"


def test_checked_outputs_hold_under_another_instruction_set(executed):
    code, report, _ = executed
    assert code == 0, report
    assert report.count("checked cells: identical") == 2, report


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


def test_other_instruction_set_agrees_within_monte_carlo_error(executed, chapter_run):
    *_, results = executed
    cfg = LinearConfig.quick()  # the chapter's configuration (the CI profile)
    here = chapter_run("linear", cfg)  # the book's run, under the default instruction set
    # The same run (settings, key and code: its cache key) in the chapter's cache under the other instruction set.
    where = results / "linear" / "linear" / here.provenance["cache_key"]
    assert where.is_dir(), f"the linear chapter's run is not in its kept cache: {sorted(where.parent.glob('*'))}"
    there = store.load(where)
    a, b = here.summary, there.summary
    sd = _mc_sd(a)
    z = stats.norm.isf(1e-3 / (2 * len(sd)))
    report = {k: (a[k], b[k], abs(a[k] - b[k]) / (np.sqrt(2) * sd[k])) for k in sd}
    too_far = {k: v for k, v in report.items() if not v[2] <= z}
    assert not too_far, f"beyond {z:.2f} Monte-Carlo sd: {too_far}"
    # Verdicts of the chapter's rules agree too (their margins are far larger than these differences).
    assert {k: str(v) for k, v in linear.verdicts.evaluate(a).items()} == {
        k: str(v) for k, v in linear.verdicts.evaluate(b).items()}
