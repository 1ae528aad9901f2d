"""Every chapter opens in Google Colab: a launch button (``_config.yml``) and a first cell, hidden in the
book, that installs the package from the book's repository with extras that exist, on Colab only."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
CHAPTERS = [ROOT / f"{e['file']}.ipynb" for e in yaml.safe_load((ROOT / "_toc.yml").read_text())["chapters"]
            if (ROOT / f"{e['file']}.ipynb").exists()]


def test_launch_button_opens_colab():
    assert CONFIG["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert CONFIG["repository"]["url"].startswith("https://github.com/")
    assert len(CHAPTERS) >= 8


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_first_cell_installs_the_package_on_colab_only(path):
    cells = json.loads(path.read_text())["cells"]
    first, source = cells[0], "".join(cells[0]["source"])
    assert first["cell_type"] == "code" and "remove-cell" in first["metadata"].get("tags", [])
    assert first["outputs"] == []
    lines = source.splitlines()
    assert lines[0].startswith("#@title") and 'if "google.colab" in sys.modules:' in lines
    install = [line for line in lines if "%pip install" in line]
    assert len(install) == 1 and install[0].startswith("    "), "the install runs inside the Colab guard only"
    match = re.search(r'"bootens\[([a-z,]+)\] @ git\+(\S+)"', install[0])
    assert match and match.group(2) == CONFIG["repository"]["url"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(match.group(1).split(",")) <= set(extras) and "repro" in match.group(1).split(",")
    assert "myst-nb" in install[0]  # the chapters glue their numbers with myst_nb
    assert not any("google.colab" in "".join(c["source"]) for c in cells[1:])
