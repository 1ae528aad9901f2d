"""The API reference page lists every public module of the library, and the book's reference resolver
(book/_ext/apirefs.py) links a short name to the object it names and nothing else."""

from __future__ import annotations

import importlib.util
import pkgutil
import re
from pathlib import Path

import yaml

import bootens_core

ROOT = Path(__file__).resolve().parents[2]


def _resolver():
    spec = importlib.util.spec_from_file_location("apirefs", ROOT / "book" / "_ext" / "apirefs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_public_library_module_is_on_the_api_page():
    page = (ROOT / "book" / "api.md").read_text()
    listed = set(re.findall(r"^\.\. automodule:: (\S+)$", page, flags=re.M))
    found = pkgutil.walk_packages(bootens_core.__path__, "bootens_core.")
    modules = {m.name for m in found
               if not m.name.startswith("bootens_core.repro")
               and not m.name.rsplit(".", 1)[1].startswith("_")}
    assert modules | {"bootens_core"} == listed
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert {"file": "book/api"} in toc["chapters"]


def test_short_names_resolve_to_the_object_they_name():
    names_it = _resolver()._names_it
    assert names_it("bootens_core.ensemble.drivers.train", "train")
    assert names_it("bootens_core.ensemble.drivers.train", "ensemble.train")
    assert names_it("bootens_core.ensemble.drivers.train", "bootens_core.ensemble.train")
    assert names_it("bootens_core.ensemble.optimizers.Optimizer.program_key",
                    "bootens_core.ensemble.Optimizer.program_key")
    assert names_it("bootens_core.models.Model", "~bootens_core.models.Model")
    assert not names_it("bootens_core.classification.train", "ensemble.train")
    assert not names_it("bootens_core.ensemble.drivers.train_grid", "train")
    assert not names_it("bootens_core.ensemble.drivers.train", "drivers.ensemble.train")  # order matters


def test_the_nearest_of_several_candidates_is_taken():
    class Obj:
        def __init__(self, docname: str) -> None:
            self.docname, self.node_id = docname, docname

    class Domain:
        objects = {"bootens_core.classification.train": Obj("c"),
                   "bootens_core.ensemble.drivers.train": Obj("e")}

    class Env:
        def get_domain(self, name):
            return Domain()

    taken = {}

    def fake_refnode(builder, fromdoc, todoc, target, child, title):
        taken["title"] = title
        return title

    mod = _resolver()
    mod.make_refnode = fake_refnode
    node = {"refdomain": "py", "reftarget": "train", "py:module": "bootens_core.ensemble.kernel",
            "refdoc": "x"}
    app = type("App", (), {"builder": None})()
    assert mod.resolve(app, Env(), node, None) == "bootens_core.ensemble.drivers.train"
    node = {"refdomain": "py", "reftarget": "nothing_like_it", "refdoc": "x"}
    assert mod.resolve(None, Env(), node, None) is None
