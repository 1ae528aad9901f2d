"""What code computes a result: the functions a set of roots reaches and the package modules they import.

A cache keyed by a hand-kept list of source files serves stale results as soon as the list misses a module
that the computation imports. Here the list is derived instead, from the code itself:

- :func:`reach` starts from some functions (the *roots*: e.g. the builder of a UCI method family and the
  function that computes a cell) and follows every name they read. A name bound, in the function's own
  module, to another function or class of that module is followed in turn (its source enters the key);
  a name bound to a module of the package, or to a function or class defined in one, brings that module's
  file; a name bound to a plain value (numbers, strings, tuples of them, ...) brings the value's ``repr``;
  an ``import`` statement inside a function brings the modules it imports. Names bound to objects of other
  libraries enter nothing (their versions are in every record's provenance).
- :func:`import_closure` closes a set of package modules under their imports: every ``import`` and
  ``from ... import`` statement of the file (at module level or inside a function, since a lazy import runs
  when the function does), the submodules a ``from package import name`` names, and the ``__init__`` of
  every package on the way (Python executes them on import).

Both read the source text (``ast``), never the bytecode, so a key is the same under every Python version
that parses the package. Names are over-approximated: a local variable that shares its name with a global
brings that global too, which can only make a key change more often, never less.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import sys
import textwrap
import types
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Reach", "reach", "import_closure", "module_file", "digest"]

_PACKAGE = __name__.split(".")[0]
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


class Reach(NamedTuple):
    """What a set of roots reaches (:func:`reach`).

    ``functions``: qualified names of the functions and classes of the roots' modules that were followed,
    sorted; ``code``: their source texts in that order; ``files``: the package modules they use, closed under
    imports (:func:`import_closure`), as paths relative to the package folder (``ensemble/linesearch.py``);
    ``data``: ``repr`` of each plain value read, by ``module:name``."""

    functions: tuple[str, ...]
    code: tuple[str, ...]
    files: tuple[str, ...]
    data: dict[str, str]


def module_file(name: str, package_dir: Path | None = None) -> str | None:
    """The file of the package module ``name`` (``bootens_core.ensemble`` -> ``ensemble/__init__.py``)
    relative to the package folder, or ``None`` for a module outside the package or one with no file."""
    parts = name.split(".")
    if parts[0] != _PACKAGE:
        return None
    root = package_dir or _PACKAGE_DIR
    rel = Path(*parts[1:]) if len(parts) > 1 else Path()
    for cand in (rel / "__init__.py", rel.with_suffix(".py") if parts[1:] else None):
        if cand is not None and (root / cand).is_file():
            return cand.as_posix()
    return None


def _module_name(rel: str) -> str:
    parts = list(Path(rel).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join([_PACKAGE, *parts])


def _absolute(module: str | None, level: int, importer: str, importer_is_package: bool) -> str:
    """The absolute name of ``from <level dots><module> import ...`` written in module ``importer``."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    drop = level - 1 if importer_is_package else level
    if drop >= len(base):
        raise ImportError(f"relative import beyond the top package in {importer}")
    base = base[: len(base) - drop]
    return ".".join([*base, module] if module else base)


def _named(name: str, package_dir: Path) -> tuple[set[str], set[str]]:
    """Importing module ``name``: its file, to follow (its own imports run), and the ``__init__`` files of the
    packages above it, to hash but not follow (see :func:`import_closure`)."""
    parts = name.split(".")
    own = module_file(name, package_dir)
    parents = {f for i in range(1, len(parts)) if (f := module_file(".".join(parts[:i]), package_dir))}
    return ({own} if own else set()), parents - {own}


def _imports_in(
    tree: ast.AST, importer: str, importer_is_package: bool, package_dir: Path
) -> tuple[set[str], set[str]]:
    """Package files that the import statements anywhere in ``tree`` name (to follow) and the ``__init__``
    files of the packages above them (to hash only)."""
    follow: set[str] = set()
    parents: set[str] = set()

    def add(name: str) -> None:
        f, p = _named(name, package_dir)
        follow.update(f)
        parents.update(p)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            # from B import n, ...: a submodule n is imported by name (followed) and B is then only its
            # parent; any other n is a name that B's own code defines or re-exports, so B is followed.
            base = _absolute(node.module, node.level, importer, importer_is_package)
            subs = [f"{base}.{a.name}" for a in node.names if module_file(f"{base}.{a.name}", package_dir)]
            for sub in subs:
                add(sub)
            if len(subs) < len(node.names):
                add(base)
            else:
                f, p = _named(base, package_dir)
                parents.update(f | p)
    return follow, parents


@functools.lru_cache(maxsize=None)
def _direct_imports(rel: str, package_dir: Path, stamp: int) -> tuple[frozenset[str], frozenset[str]]:
    path = package_dir / rel
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    follow, parents = _imports_in(tree, _module_name(rel), rel.endswith("__init__.py"), package_dir)
    return frozenset(follow), frozenset(parents)


def import_closure(
    files: Iterable[str], parents: Iterable[str] = (), package_dir: Path | None = None
) -> tuple[str, ...]:
    """``files`` (package-relative paths) and every package module they import, directly or not, sorted.

    A module's imports are followed; the ``__init__`` of a package above an imported module is included but
    its own imports are not followed (Python runs it, but it only names submodules: the computation reaches a
    submodule it uses by importing it, and that import is followed). A package imported by name
    (``from bootens_core import ensemble``) is followed like any module. ``parents``: more files to include
    without following them."""
    root = package_dir or _PACKAGE_DIR
    seen: set[str] = set()
    hashed: set[str] = set(parents)
    todo = list(files)
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        if not (root / rel).is_file():
            raise FileNotFoundError(f"no module {rel} in the package folder {root}")
        seen.add(rel)
        follow, above = _direct_imports(rel, root, (root / rel).stat().st_mtime_ns)
        todo += follow - seen
        hashed |= above
    return tuple(sorted(seen | hashed))


def _is_plain(value: Any, depth: int = 0) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if depth < 4 and isinstance(value, (tuple, list, frozenset, set)):
        return all(_is_plain(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
    return False


def _plain_repr(value: Any) -> str:
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_plain_repr(v) for v in value)) + "}"
    if isinstance(value, dict):
        items = sorted(value.items(), key=repr)
        return "{" + ", ".join(f"{_plain_repr(k)}: {_plain_repr(v)}" for k, v in items) + "}"
    if isinstance(value, (tuple, list)):
        return type(value).__name__ + "(" + ", ".join(_plain_repr(v) for v in value) + ")"
    return repr(value)


def _source_tree(obj: Callable[..., Any] | type) -> tuple[str, ast.AST]:
    src = textwrap.dedent(inspect.getsource(obj))
    return src, ast.parse(src)


def _home(obj: Any) -> str | None:
    """The package module an object is defined in (or is), else ``None``."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__ if obj.__name__.split(".")[0] == _PACKAGE else None
    mod = getattr(obj, "__module__", None)
    if isinstance(mod, str) and mod.split(".")[0] == _PACKAGE:
        return mod
    return None


def _unwrap(obj: Any) -> Any:
    """The function behind ``functools.partial``/``wraps``/``jax.jit`` wrappers where it can be found."""
    seen = 0
    while seen < 8:
        inner = getattr(obj, "__wrapped__", None)
        if inner is None and isinstance(obj, functools.partial):
            inner = obj.func
        if inner is None:
            return obj
        obj, seen = inner, seen + 1
    return obj


def reach(
    roots: Sequence[Callable[..., Any] | type], *, skip: Collection[str] = (), package_dir: Path | None = None
) -> Reach:
    """Everything the ``roots`` (functions or classes of the package) reach, as the module docstring says.

    The source of a root's own module enters only through the functions followed, so an edit elsewhere in
    that module leaves the key as it is. ``skip``: globals (``module:name``) not followed, e.g. a dispatch
    table whose entries are roots of keys of their own. A global that is none of a module, function, class or
    plain value (an object built at import) raises ``ValueError`` unless skipped: its behaviour is not in
    any source text the key could read."""
    root_dir = package_dir or _PACKAGE_DIR
    followed: dict[str, str] = {}
    files: set[str] = set()
    parents: set[str] = set()
    data: dict[str, str] = {}
    todo: list[Any] = [_unwrap(r) for r in roots]
    while todo:
        obj = todo.pop()
        home = _home(obj)
        if home is None:
            raise ValueError(
                f"{obj!r} is not a function or class of {_PACKAGE}: it cannot be a root of a code key"
            )
        qual = f"{home}:{getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))}"
        if qual in followed:
            continue
        src, tree = _source_tree(obj)
        followed[qual] = src
        module = sys.modules[home]
        own = module_file(home, root_dir)
        follow, above = _imports_in(tree, home, bool(own and own.endswith("__init__.py")), root_dir)
        files |= follow
        parents |= above
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        scope = vars(module)
        for name in sorted(names):
            if name not in scope or f"{home}:{name}" in skip:
                continue
            value = scope[name]
            target = _unwrap(value)
            where = _home(target)
            if (
                isinstance(target, types.ModuleType)
                or inspect.isfunction(target)
                or inspect.isclass(target)
                or inspect.isbuiltin(target)
            ):
                if where == home and not isinstance(target, types.ModuleType):
                    todo.append(target)
                elif where is not None:
                    follow, above = _named(where, root_dir)
                    files |= follow
                    parents |= above
            elif _is_plain(value):
                data[f"{home}:{name}"] = _plain_repr(value)
            elif where is None and _home(type(value)) is None and callable(value):
                continue  # a callable object of another library (a ufunc, another library's jitted function)
            else:
                raise ValueError(
                    f"{home}.{name} is neither a function, class, module nor plain value "
                    f"({type(value).__name__}): say in skip= how a code key treats it"
                )
    files.discard("")
    functions = tuple(sorted(followed))
    code = tuple(followed[q] for q in functions)
    return Reach(functions, code, import_closure(files, parents, root_dir), data)


def digest(r: Reach, package_dir: Path | None = None) -> str:
    """sha256 over a :class:`Reach`: the followed functions' source, the plain values, and the path and bytes
    of every file."""
    root = package_dir or _PACKAGE_DIR
    h = hashlib.sha256()
    h.update(json.dumps({"functions": r.functions, "code": r.code, "data": r.data}, sort_keys=True).encode())
    for rel in r.files:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()
