"""``--set FIELD=VALUE`` on a configuration: one reading of a value for every command that takes it.

Kept apart from :mod:`bootens_core.repro.config` on purpose: that module is part of every UCI cell's key (the
cells' code), and how a command line is read decides no cell's numbers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from . import config

__all__ = ["apply_sets"]


def apply_sets(cfg: Any, items: Iterable[str]) -> Any:
    """``cfg`` with every ``FIELD=VALUE`` of ``items`` set (dotted fields for a method's settings, e.g.
    ``lbfgs.linesearch``): a string field takes the text as it is, any other a JSON value of its type (a
    list for a tuple, ``true``/``false`` for a flag, a whole number for an integer; a number for a float).

    Raises ``ValueError`` with one line naming the item: no ``=``, an unknown field, a value that does not
    read as the field's type, or a whole group of settings (a dataclass) set at once.
    """
    for item in items:
        name, sep, text = item.partition("=")
        try:
            if not sep:
                raise ValueError("no '='")
            current = config.get(cfg, name)
        except ValueError as exc:
            raise ValueError(f"--set takes FIELD=VALUE with a field of {type(cfg).__name__} (dotted for a "
                             f"method's settings, e.g. lbfgs.linesearch), got {item!r}: {exc}") from None
        try:
            value = json.loads(text) if not isinstance(current, str) else text
            if isinstance(current, tuple):
                value = tuple(value)
            elif isinstance(current, bool) and not isinstance(value, bool):
                raise ValueError(name)
            elif type(current) is int and (isinstance(value, bool) or value != int(value)):
                raise ValueError(name)
            elif type(current) in (int, float):
                value = type(current)(value)
            elif dataclasses.is_dataclass(current):
                raise ValueError(name)
            cfg = config.replace(cfg, name, value)
        except (ValueError, TypeError) as exc:
            detail = "" if str(exc) == name else f": {exc}"
            kind = type(current).__name__
            raise ValueError(f"cannot read {text!r} as a value of {name} ({kind}){detail}") from None
    return cfg
