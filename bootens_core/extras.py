"""What to install for a part of the package that needs an optional dependency, said the same way everywhere.

``bootens`` is installed from a checkout (``pip install ".[sklearn]"``) or from a wheel built from one; it is
not on the package index, so a hint of the form ``pip install "bootens[sklearn]"`` would fetch nothing. A
hint therefore names the packages themselves, which are on the index, and then the extra for a checkout.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["install_hint"]


def install_hint(extra: str, packages: Sequence[str]) -> str:
    """``pip install PACKAGE...`` for the missing ``packages``, and the checkout's equivalent with the
    optional extra ``extra`` of ``pyproject.toml``: e.g. ``pip install scikit-learn (in a checkout of bootens:
    pip install ".[sklearn]")``."""
    if not packages:
        raise ValueError("install_hint needs the names of the packages to install")
    return f'pip install {" ".join(packages)} (in a checkout of bootens: pip install ".[{extra}]")'
