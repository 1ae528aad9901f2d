"""The noise of a comparison with a sampled reference: subsets of the reference's own draws against the rest.

An ensemble of ``n`` functions compared with a reference of ``N`` posterior draws differs from it even when
the ensemble is itself a sample of the posterior: by the sampling noise of both sides. Subsets of ``n`` of the
reference's draws, each compared with the ``N - n`` others by the same statistic, show that noise directly
(what a perfect ensemble of that size would show), where the reference's half-vs-half comparison shows only a
comparison of two samples of ``N / 2``. The experiments' agreement rules (Figure 3, the classification
extension) take their units from here when the reference holds at least ``2 n`` draws.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

__all__ = ["subsets"]

T = TypeVar("T")


def subsets(draws: np.ndarray, n: int, statistic: Callable[[np.ndarray, np.ndarray], T], repeats: int = 256,
            seed: int = 0) -> list[T]:
    """``statistic(sample, rest)`` for ``repeats`` random subsets of ``n`` of the rows of ``draws``.

    Args:
        draws: the reference's draws as rows, ``(N, ...)`` (e.g. ``(chains * draws, n_x)`` predictive values on a
            grid), at least ``2 n`` of them.
        n: the subset's size (the ensemble's).
        statistic: a function of the subset's rows and the other rows.
        repeats: how many subsets.
        seed: ``numpy.random.default_rng(seed)`` draws the subsets (without replacement, one after another).

    Draws within a chain are correlated: with a bulk ESS below the number of draws, subsets vary somewhat less
    than independent samples would.
    """
    draws = np.asarray(draws)
    n, repeats = int(n), int(repeats)
    if draws.ndim < 1 or n < 2 or 2 * n > len(draws):
        raise ValueError(f"need 2 <= n and 2 n <= the reference's {len(draws)} draws, got n = {n}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(repeats):
        pick = np.zeros(len(draws), bool)
        pick[rng.choice(len(draws), n, replace=False)] = True
        out.append(statistic(draws[pick], draws[~pick]))
    return out
