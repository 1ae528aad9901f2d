"""What a reader sees speaks of the paper and the project only: no word about how the work was organised
(issues, sessions, follow-ups, machines being lent, internal targets) and no private name of the package
(``module._name``) in the prose of the chapters, the intro, the README files or in the code a chapter shows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORGANISATION = re.compile(
    r"\b(issues?|sessions?|lent|lend|lending|follow-ups?|TODO|FIXME|XXX|sprints?|tickets?|milestones?|"
    r"helpers?|subagents?)\b",
    re.IGNORECASE,
)
# A private name of a module or object: ``something._name`` (not a file name such as ``_build/`` or ``_toc.yml``).
PRIVATE = re.compile(r"\b[A-Za-z][\w]*(?:\.[A-Za-z]\w*)*\._[a-z]\w*")
HIDDEN = {"remove-cell", "remove-input"}


def _texts(path: Path) -> list[tuple[str, str, str]]:
    """(where, kind, text) of what a reader sees: markdown cells and shown code cells of a notebook, or the
    whole of a markdown file."""
    if path.suffix == ".md":
        return [(path.name, "markdown", path.read_text())]
    nb = json.loads(path.read_text())
    out = []
    for i, cell in enumerate(nb["cells"]):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] == "markdown" or (cell["cell_type"] == "code" and not tags & HIDDEN):
            out.append((f"{path.name} cell {i}", cell["cell_type"], "".join(cell["source"])))
    return out


PAGES = sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md")) + [
    ROOT / "README.md", ROOT / "results" / "paper" / "README.md"]


def _problems(path: Path) -> list[str]:
    found = []
    for where, kind, text in _texts(path):
        if kind == "markdown":
            found += [f"{where}: {m.group(0)!r} in {text[max(0, m.start() - 40):m.end() + 40]!r}"
                      for m in ORGANISATION.finditer(text)]
        found += [f"{where}: private name {m.group(0)!r}" for m in PRIVATE.finditer(text)]
    return found


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_speak_of_the_paper_only(path):
    assert _problems(path) == []


def test_the_patterns_catch_what_they_are_for(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("No GPU was lent to the issue; a follow-up will do it (`ensemble._chunk_runner`).\n")
    got = _problems(page)
    assert len(got) == 4 and any("'lent'" in g for g in got) and any("'issue'" in g for g in got)
    assert any("follow-up" in g for g in got) and any("ensemble._chunk_runner" in g for g in got)
    page.write_text("The tissue of reissued lentils; `_build/` and `_toc.yml`; `model.apply` and `x.T`.\n")
    assert _problems(page) == []
