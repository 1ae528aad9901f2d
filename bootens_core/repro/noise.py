"""The noise of a comparison with a sampled reference: subsets of the reference's own draws against the rest.

An ensemble of ``n`` functions compared with a reference of ``N`` posterior draws differs from it even when
the ensemble is itself a sample of the posterior: by the sampling noise of both sides. Subsets of ``n`` of the
reference's draws, each compared with the ``N - n`` others by the same statistic, show that noise directly
(what a perfect ensemble of that size would show), where the reference's half-vs-half comparison shows only a
comparison of two samples of ``N / 2``. The experiments' agreement rules (Figure 3, the classification
extension) take their units from here when the reference holds at least ``2 n`` draws.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import numpy as np

__all__ = ["subsets", "Unit", "unit", "rule_size", "pooled", "halves"]

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


class Unit(NamedTuple):
    """A rule's noise unit for two statistics (:func:`unit`): the mean of the first (a mean gap, which is
    positive) and the root mean square of the second (a log ratio, centred on 0) over the subsets, and their
    values per subset."""

    mean: float
    rms: float
    first: list[float]
    second: list[float]
    n: int
    repeats: int


def unit(draws: np.ndarray, n: int, statistic: Callable[[np.ndarray, np.ndarray], tuple[float, float]],
         repeats: int = 256, seed: int = 0) -> Unit:
    """The noise unit of a two-statistic agreement rule for an ensemble of ``n``: ``statistic(sample, rest)``
    (a mean gap and a log ratio) over :func:`subsets` of ``draws``."""
    stats = subsets(draws, n, statistic, repeats, seed)
    first, second = [float(a) for a, _ in stats], [float(b) for _, b in stats]
    return Unit(float(np.mean(first)), float(np.sqrt(np.mean(np.square(second)))), first, second, int(n),
                int(repeats))


def rule_size(draws: np.ndarray, n: int, statistic: Callable[[np.ndarray, np.ndarray], tuple[float, float]],
              limit: float, repeats: int = 256, seed: int = 1) -> dict[str, float]:
    """How often a rule that asks the first statistic to be at most ``limit`` times its :func:`unit` mean and
    the second's absolute value at most ``limit`` times its root mean square says "differs" of samples of the
    reference's own law: ``repeats`` further subsets of ``n`` draws (``seed``), judged in the units of
    :func:`unit` at its defaults. Returns the share failing the first limit, the second and either, and
    ``repeats``."""
    u = unit(draws, n, statistic)
    test = unit(draws, n, statistic, repeats, seed)
    a = np.asarray(test.first) > limit * u.mean
    b = np.abs(np.asarray(test.second)) > limit * u.rms
    return {"first": float(a.mean()), "second": float(b.mean()), "either": float((a | b).mean()),
            "repeats": int(repeats)}


def pooled(chains: np.ndarray, what: str = "draws", min_chains: int = 1) -> np.ndarray:
    """A reference held as ``(chains, draws, n_x)`` checked (``ValueError`` naming ``what`` otherwise) and
    pooled into rows ``(chains * draws, n_x)``, float64: the draws :func:`unit` takes."""
    chains = np.asarray(chains, np.float64)
    if chains.ndim != 3 or chains.shape[0] < min_chains:
        at_least = f" >= {min_chains}" if min_chains > 1 else ""
        raise ValueError(f"need (chains{at_least}, draws, n_x) {what}, got shape {chains.shape}")
    return chains.reshape(-1, chains.shape[2])


def halves(chains: np.ndarray, statistic: Callable[[np.ndarray, np.ndarray], tuple[float, float]],
           max_partitions: int = 64, what: str = "draws") -> Unit:
    """The half-vs-half unit of a two-statistic rule: ``statistic(one half, other half)`` over the splits of
    the chains ``(chains >= 2, draws, n_x)`` into two halves (those that put chain 0 in the first, so each
    unordered split once, up to ``max_partitions``; with an odd count the last chain of the complement is left
    out, so both halves are equal). ``n`` is a half's draws and ``repeats`` the splits. Each half holds half
    the reference: the unit counts the reference's own noise only, not an ensemble's sampling noise
    (:func:`unit` counts both)."""
    chains = np.asarray(chains, np.float64)
    pooled(chains, what, min_chains=2)
    n_chains, n_draws, n_x = chains.shape
    half = n_chains // 2
    splits = [c for c in itertools.combinations(range(n_chains), half) if c[0] == 0][:max_partitions]
    first, second = [], []
    for a in splits:
        b = [i for i in range(n_chains) if i not in a][:half]
        u, v = statistic(chains[list(a)].reshape(-1, n_x), chains[b].reshape(-1, n_x))
        first.append(float(u))
        second.append(float(v))
    return Unit(float(np.mean(first)), float(np.sqrt(np.mean(np.square(second)))), first, second,
                half * n_draws, len(splits))
