"""Sphinx extension of the book: the API reference's short cross-references resolve to the object they name.

The library's docstrings name objects as a reader of the source does: relative to where they are used
(``:func:`train``` in the ensemble's kernel, ``:func:`ensemble.train``` in the classification module), or
by the package that re-exports them (``bootens_core.ensemble.train``). Sphinx resolves a name only in the
current module or as the full path it is documented under, so in nitpicky mode (``-n``) these would be
broken links. This handler runs for every reference Sphinx could not resolve: it looks for the documented
Python objects that the reference's dotted name names (the same last component, its other components in
order among theirs) and, of those, takes the one sharing the longest module prefix with the place of the
reference. A name that matches nothing stays unresolved, and the build's ``-W -n`` fails on it.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from sphinx.util.nodes import make_refnode


def _names_it(name: str, target: str) -> bool:
    """Whether documented object ``name`` is what ``target`` names: the same last component, and the
    target's components in order among the name's (``ensemble.train`` names ``bootens_core.ensemble.drivers
    .train``; ``bootens_core.ensemble.Optimizer.program_key`` names ``...ensemble.optimizers.Optimizer
    .program_key``, an object re-exported by its package)."""
    parts, want = name.split("."), target.lstrip(".~").split(".")
    if parts[-1] != want[-1]:
        return False
    it = iter(parts)
    return all(w in it for w in want)


def _candidates(domain: Any, target: str) -> list[tuple[str, Any]]:
    return [(name, obj) for name, obj in domain.objects.items() if _names_it(name, target)]


def _shared_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split("."), b.split("."), strict=False):
        if x != y:
            break
        n += 1
    return n


def resolve(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    found = _candidates(domain, node["reftarget"])
    if not found:
        return None
    here = node.get("py:module") or ""
    name, obj = max(found, key=lambda item: (_shared_prefix(item[0], here), -len(item[0])))
    return make_refnode(app.builder, node["refdoc"], obj.docname, obj.node_id, contnode, name)


def setup(app: Any) -> dict[str, Any]:
    app.connect("missing-reference", resolve)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
