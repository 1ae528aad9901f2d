"""The outputs nbval checks state nothing that another machine's rounding can change.

XLA compiles for the CPU it runs on, so the last digits of a computation differ between instruction sets,
and long float32 trainings of non-convex losses turn them into different (equally valid) particles. The
committed notebooks were executed on one machine and nbval re-executes them on another; the cells it checks
(tag ``nbval-check-output``) must therefore print verdicts and structural facts only, never a measured
number, which the chapters show in unchecked cells with their Monte-Carlo precision. These tests read the
committed notebooks; ``test_book_isa.py`` re-executes chapters under another instruction set.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = [
    ROOT / f"{entry['file']}.ipynb"
    for entry in yaml.safe_load((ROOT / "_toc.yml").read_text())["chapters"]
    if (ROOT / f"{entry['file']}.ipynb").exists()
]
CHECK_TAG = "nbval-check-output"
# A decimal fraction ("6.15", "0.07") is a measured value; exponents like "1e-12" are fixed tolerances of a
# rule. Integers pass this pattern: a checked cell may count what is structural (rows, splits, cells computed,
# or counts over committed records); counts of a live computation that can move (cells within a band) stay in
# unchecked cells, which only the re-execution under another instruction set can show (test_book_isa.py).
MEASURED = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")
# Decimals a verdict text may name because they are settings or thresholds, not measurements.
FIXED = {
    "linear": {"0.1", "4.1"},   # the deviation's step size ("Adagrad h = 0.1"); the paper's "Section 4.1"
    "deep_relu": {"1.1"},       # "NOT converged (max R-hat above 1.1)": the rule's R-hat limit
    "classification": {"1.1"},  # same rule
}


def _code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _checked(path: Path) -> list[dict]:
    return [c for c in _code_cells(path) if CHECK_TAG in c.get("metadata", {}).get("tags", [])]


def _text(cell: dict) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            out.append("".join(o["text"]))
        elif "text/plain" in o.get("data", {}):
            out.append("".join(o["data"]["text/plain"]))
    return "".join(out)


def test_every_executable_chapter_is_found():
    assert len(CHAPTERS) >= 8, CHAPTERS


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_each_chapter_has_checked_cells_marked_by_tag_and_hidden(path):
    checked = _checked(path)
    assert checked, f"{path.name}: no cell tagged {CHECK_TAG}"
    for cell in _code_cells(path):
        # The comment marker would show in the rendered page; the tag does the same for nbval.
        assert "NBVAL_CHECK_OUTPUT" not in "".join(cell["source"]), path.name
    for cell in checked:
        tags = cell["metadata"]["tags"]
        assert "remove-cell" in tags or "remove-input" in tags, (path.name, "".join(cell["source"]))
        assert _text(cell).strip(), f"{path.name}: a checked cell has no committed output"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_checked_outputs_carry_no_measured_number(path):
    for cell in _checked(path):
        found = [x for x in MEASURED.findall(_text(cell)) if x not in FIXED.get(path.stem, set())]
        assert not found, f"{path.name}: checked output prints measured values {found}: {_text(cell)!r}"


def test_the_pattern_catches_what_moved_across_machines():
    # The two outputs that differed between an AVX-512 and an AVX2 machine before the checked cells changed.
    assert MEASURED.findall("KL: prior 1.47e+05 -> paper setting 494 -> deviation 6.2") == ["6.2"]
    assert MEASURED.findall("max relative difference below 1e-12: True") == []
    assert MEASURED.findall("|mean p| 0.07, |band edges| 0.12") == ["0.07", "0.12"]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_glued_numbers_are_plain_python_numbers(path):
    """myst-nb formats a glued number from its text: ``np.float64(0.99)`` (a numpy scalar's repr, e.g. from a
    pandas ``.loc``) fails to format and the book build stops on the warning."""
    for cell in _code_cells(path):
        for o in cell.get("outputs", []):
            text = "".join(o.get("data", {}).get("application/papermill.record/text/plain", ""))
            assert not text.startswith(("np.", "numpy.")), f"{path.name}: a glued value {text!r}: glue float(x)"
