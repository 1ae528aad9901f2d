"""bootens_core.repro.codekey: the import closure of modules, against a package whose imports are known."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bootens_core.repro import codekey


def _write(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "bootens_core"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return pkg


# A package whose closure is written out by hand: a imports b (relative) and the package p's submodule x; b
# imports c lazily, inside a function; p/__init__ imports x and y (y is reached by nobody but that __init__);
# d imports nothing and nobody imports it; q/__init__ is named by `from . import q` in c and imports z.
FAKE = {
    "__init__.py": "",
    "a.py": "from . import b\nfrom .p import x\nimport numpy\n",
    "b.py": "def f():\n    from .c import g\n    return g()\n",
    "c.py": "from . import q\ndef g():\n    return 1\n",
    "d.py": "X = 1\n",
    "p/__init__.py": "from . import x, y\n",
    "p/x.py": "from ..d import X\n",
    "p/y.py": "Y = 2\n",
    "q/__init__.py": "from .z import Z\n",
    "q/z.py": "Z = 3\n",
}


def test_closure_follows_named_modules_lazy_imports_and_hashes_parents_only(tmp_path):
    pkg = _write(tmp_path, FAKE)
    got = set(codekey.import_closure(["a.py"], package_dir=pkg))
    # a -> b -> (lazy) c -> q (named package: followed) -> q/z; a -> p/x -> d; p/__init__ and the top __init__
    # hashed as parents of what is imported; p/y only through p/__init__, which is not followed.
    assert got == {
        "a.py",
        "b.py",
        "c.py",
        "q/__init__.py",
        "q/z.py",
        "p/x.py",
        "d.py",
        "p/__init__.py",
        "__init__.py",
    }


def test_closure_of_a_leaf_and_a_missing_module(tmp_path):
    pkg = _write(tmp_path, FAKE)
    assert codekey.import_closure(["d.py"], package_dir=pkg) == ("d.py",)
    with pytest.raises(FileNotFoundError, match="no module nope.py"):
        codekey.import_closure(["nope.py"], package_dir=pkg)


def test_module_file_of_packages_and_modules(tmp_path):
    pkg = _write(tmp_path, FAKE)
    assert codekey.module_file("bootens_core.p", pkg) == "p/__init__.py"
    assert codekey.module_file("bootens_core.p.x", pkg) == "p/x.py"
    assert codekey.module_file("bootens_core.nothing", pkg) is None
    assert codekey.module_file("numpy", pkg) is None


def test_the_real_optimizers_reach_both_line_searches():
    # optimizers.py imports the batched zoom line search at module level and torch's L-BFGS inside a function.
    got = codekey.import_closure(["ensemble/optimizers.py"])
    assert {"ensemble/linesearch.py", "ensemble/lbfgs.py", "ensemble/__init__.py", "__init__.py"} <= set(got)


def test_reach_refuses_a_root_outside_the_package():
    with pytest.raises(ValueError, match="not a function or class of bootens_core"):
        codekey.reach([textwrap.dedent])
