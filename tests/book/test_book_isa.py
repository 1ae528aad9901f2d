"""Two chapters re-executed under another XLA instruction set: their checked outputs must not move.

The cheap form of ``.ci/isa_check.py`` (which does this for every chapter): the univariate chapter and the
linear chapter, whose checked output used to print a KL on a rounding boundary (6.15) that another CPU
printed as 6.1 instead of 6.2. Each runs in a fresh result cache, so nothing computed under the default
instruction set is reused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _other_isa() -> str:
    current = [f.split("=", 1)[1] for f in os.environ.get("XLA_FLAGS", "").split()
               if f.startswith("--xla_cpu_max_isa=")]
    return "SSE4_2" if current and current[-1].upper() == "AVX" else "AVX"


def test_checked_outputs_hold_under_another_instruction_set(tmp_path, book_env):
    pytest.importorskip("nbclient")
    isa = _other_isa()
    proc = subprocess.run(  # the chapters compiled as the book compiles them, but for another instruction set
        [sys.executable, str(ROOT / ".ci" / "isa_check.py"), "--isa", isa, "--out", str(tmp_path), "univariate",
         "linear"],
        capture_output=True, text=True, timeout=1500, cwd=ROOT, env=book_env,
    )
    report = (tmp_path / "report.md").read_text() if (tmp_path / "report.md").exists() else proc.stderr[-3000:]
    assert proc.returncode == 0, report
    assert report.count("checked cells: identical") == 2, report
