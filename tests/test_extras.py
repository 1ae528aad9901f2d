"""The install hints: they name packages of the package index that the named extra of pyproject.toml holds."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from bootens_core.extras import install_hint

ROOT = Path(__file__).parents[1]


def test_hint_names_the_packages_then_the_checkouts_extra():
    assert install_hint("sklearn", ["scikit-learn"]) == (
        'pip install scikit-learn (in a checkout of bootens: pip install ".[sklearn]")')
    assert install_hint("repro", ["pandas", "matplotlib"]).startswith("pip install pandas matplotlib (")
    with pytest.raises(ValueError, match="names of the packages"):
        install_hint("sklearn", [])


def test_every_hint_in_the_package_names_packages_its_extra_installs():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {extra: {re.split(r"[<>=!~ \[]", dep)[0].lower() for dep in deps} for extra, deps in extras.items()}
    calls, required = [], []
    for path in (ROOT / "bootens_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "install_hint":
                calls.append((path.name, node))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_require":  # adapters'
                required.append([ast.literal_eval(a) for a in node.args])
    assert len(calls) >= 4  # estimators, adapters, the command, the tabular data
    for where, node in calls:
        extra, packages = node.args
        if not isinstance(extra, ast.Constant):  # the adapters' hint: its extra is the package itself
            assert where == "adapters.py" and ast.unparse(packages) == f"[{ast.unparse(extra)}]"
            continue
        assert extra.value in names, (where, extra.value)
        if isinstance(packages, ast.List):  # literal names; the command's are the modules it found missing
            assert {ast.literal_eval(e) for e in packages.elts} <= names[extra.value], (where, extra.value)
    assert required and all(extra in names and extra in names[extra] for _, extra in required), required
