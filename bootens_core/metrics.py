"""A method's predictive mixture (:class:`Prediction`) and metrics: RMSE, MNLL of the predictive mixture,
Gaussian KL, interval coverage; calibration of regression predictives (coverage at several nominal levels,
PIT histogram, CRPS); for classifiers accuracy, MNLL and the expected calibration error (ECE) with its
reliability diagram.

MNLL is always the negative log density of the *mixture* of the particles' predictive Gaussians,
computed with log-sum-exp (never the average of per-particle log densities).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from scipy.special import logsumexp, ndtr
from scipy.stats import chisquare

__all__ = [
    "Prediction",
    "rmse",
    "mixture_mnll",
    "mixture_cdf",
    "mixture_coverage",
    "coverage_levels",
    "pit_coverage",
    "PITHistogram",
    "pit_histogram",
    "mixture_crps",
    "gaussian_kl",
    "coverage",
    "Reliability",
    "accuracy",
    "class_mnll",
    "reliability",
    "ece",
]


class Prediction(NamedTuple):
    """A predictive mixture: components ``N(f[j, i], var[i])`` with equal weights (what a method predicts).

    Attributes:
        f: ``(k, n)`` component means (``k = 1`` for a Gaussian predictive such as the GP's).
        var: predictive variance of the components: a scalar, one per point ``(n,)``, or one per component
            and point ``(k, n)`` (a deep ensemble's networks each predict their own variance).
        diverged: components dropped because their parameters or outputs were not finite.
        noise_var: the likelihood variance the method fitted itself (``None`` when it was given one).
        info: anything else worth keeping (fitted hyper-parameters, iterations).
    """

    f: np.ndarray
    var: Any
    diverged: int = 0
    noise_var: float | None = None
    info: dict[str, Any] | None = None


def _component_var(y: np.ndarray, f: np.ndarray, noise_var: Any) -> np.ndarray:
    """The variance of every component at every point, ``(k, n)``, from a scalar, ``(n,)`` or ``(k, n)``;
    checks the shapes of ``y`` and ``f`` first."""
    if f.ndim != 2 or y.ndim != 1 or f.shape[1] != y.shape[0]:
        raise ValueError(f"f must have shape (k, n) with n = {y.shape[0]}, got {f.shape}")
    var = np.asarray(noise_var, float)
    if var.ndim == 1 and var.shape != y.shape or var.ndim == 2 and var.shape != f.shape or var.ndim > 2:
        raise ValueError(f"noise_var must be a scalar, one per point {y.shape} or one per component and point "
                         f"{f.shape}, got shape {var.shape}")
    return np.broadcast_to(var, f.shape)


def rmse(y: np.ndarray, pred_mean: np.ndarray) -> float:
    """Root mean squared error of a point prediction."""
    y, pred_mean = np.asarray(y, float), np.asarray(pred_mean, float)
    if y.shape != pred_mean.shape:
        raise ValueError(f"shapes differ: y {y.shape} vs prediction {pred_mean.shape}")
    return float(np.sqrt(np.mean((y - pred_mean) ** 2)))


def mixture_mnll(y: np.ndarray, f: np.ndarray, noise_var: float | np.ndarray) -> float:
    """Mean negative log-likelihood of ``y`` under the equal-weight mixture of the particles' predictives.

    ``-1/n sum_i log( 1/k sum_j N(y_i; f_ji, noise_var_ji) )`` with ``f`` of shape ``(k, n)`` and
    ``noise_var`` a scalar, ``(n,)`` or ``(k, n)``.
    """
    y, f = np.asarray(y, float), np.asarray(f, float)
    var = _component_var(y, f, noise_var)
    logp = -0.5 * ((y[None] - f) ** 2 / var + np.log(2 * np.pi * var))
    return float(-np.mean(logsumexp(logp, axis=0) - np.log(f.shape[0])))


def mixture_cdf(y: np.ndarray, f: np.ndarray, noise_var: float | np.ndarray) -> np.ndarray:
    """``F(y_i) = 1/k sum_j Phi((y_i - f_ji) / sqrt(noise_var_i))``: the predictive mixture's CDF at each label.

    ``f`` has shape ``(k, n)``; ``noise_var`` is a scalar, one variance per point or one per component and
    point.
    """
    y, f = np.asarray(y, float), np.asarray(f, float)
    sd = np.sqrt(_component_var(y, f, noise_var))
    return np.mean(ndtr((y[None] - f) / sd), axis=0)


def mixture_coverage(y: np.ndarray, f: np.ndarray, noise_var: float | np.ndarray, level: float = 0.95) -> float:
    """Share of labels inside the central ``level`` interval of their predictive mixture.

    ``y_i`` lies inside the interval between the mixture's ``(1 - level)/2`` and ``(1 + level)/2`` quantiles
    exactly when its CDF value does, so no quantile has to be solved for.
    """
    return coverage_levels(y, f, noise_var, (level,))[float(level)]


def coverage_levels(
    y: np.ndarray, f: np.ndarray, noise_var: float | np.ndarray,
    levels: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95),
) -> dict[float, float]:
    """Coverage of the central interval of the predictive mixture at each nominal level: ``{level: share}``.

    A calibrated predictive covers each level's share of the labels (up to its binomial error,
    ``sqrt(level (1 - level) / n)``); below the nominal level it is overconfident, above it underconfident.
    """
    return pit_coverage(mixture_cdf(y, f, noise_var), levels)


def pit_coverage(
    u: np.ndarray, levels: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
) -> dict[float, float]:
    """:func:`coverage_levels` from the PIT values ``u`` (the predictive CDF at each label, e.g.
    :class:`PITHistogram` ``.pit``): the central ``level`` interval holds ``y_i`` exactly when
    ``(1 - level)/2 <= u_i <= (1 + level)/2``."""
    if len(levels) == 0:
        raise ValueError("levels must name at least one nominal level")
    u = np.asarray(u, float)
    out = {}
    for level in levels:
        level = float(level)
        if not 0 < level < 1:
            raise ValueError(f"level must lie in (0, 1), got {level}")
        lo = (1 - level) / 2
        out[level] = float(np.mean((u >= lo) & (u <= 1 - lo)))
    return out


class PITHistogram(NamedTuple):
    """The probability integral transform ``u_i = F_i(y_i)`` of every label and its histogram.

    Attributes:
        pit: ``(n,)`` values of the predictive CDF at the labels.
        edges: ``(n_bins + 1,)`` bin edges on ``[0, 1]``.
        counts: ``(n_bins,)`` labels per bin; a calibrated predictive gives ``n / n_bins`` each up to
            multinomial noise (U-shaped: overconfident; hump-shaped: underconfident).
        p_value: Pearson's chi-square test of uniform counts (``scipy.stats.chisquare``).
    """

    pit: np.ndarray
    edges: np.ndarray
    counts: np.ndarray
    p_value: float


def pit_histogram(
    y: np.ndarray, f: np.ndarray, noise_var: float | np.ndarray, n_bins: int = 10
) -> PITHistogram:
    """PIT values of the labels under their predictive mixtures, their histogram and a test of uniformity."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, int | np.integer) or n_bins < 2:
        raise ValueError(f"n_bins must be an integer >= 2, got {n_bins!r}")
    u = mixture_cdf(y, f, noise_var)
    edges = np.linspace(0.0, 1.0, int(n_bins) + 1)
    counts, _ = np.histogram(u, bins=edges)
    return PITHistogram(u, edges, counts, float(chisquare(counts).pvalue))


def _abs_gaussian_mean(mu: np.ndarray, var: np.ndarray) -> np.ndarray:
    """``E|Z|`` for ``Z ~ N(mu, var)``: ``2 s phi(mu / s) + mu (2 Phi(mu / s) - 1)``, ``s = sqrt(var)``."""
    s = np.sqrt(var)
    z = mu / s
    return 2 * s * np.exp(-0.5 * z**2) / np.sqrt(2 * np.pi) + mu * (2 * ndtr(z) - 1)


def mixture_crps(
    y: np.ndarray, f: np.ndarray, noise_var: float | np.ndarray, pair_components: int | None = None
) -> float:
    """Mean continuous ranked probability score of the labels under their predictive mixtures (label units;
    lower is better; a point prediction scores its absolute error).

    ``CRPS(F, y) = E|X - y| - E|X - X'| / 2`` for independent ``X, X' ~ F``; for the equal-weight mixture of
    ``N(f_j, s_j^2)`` both are closed forms (Grimit et al. 2006, with ``E|Z|`` of a Gaussian ``Z``):
    ``1/k sum_j E|N(y - f_j, s_j^2)| - 1/(2 k^2) sum_jl E|N(f_j - f_l, s_j^2 + s_l^2)|``. ``noise_var`` is a
    scalar, ``(n,)`` or ``(k, n)``. The pairs are summed in blocks of points (memory ``k^2`` per point).

    ``pair_components``: the pair term over the first ``m`` components only (``m^2`` instead of ``k^2`` work
    per point), the first term still over all ``k``. For components that are i.i.d. draws (MC-dropout passes,
    sampler draws) both are unbiased for the predictive their distribution defines; for other mixtures it is
    not the mixture's CRPS. ``None`` (or ``m >= k``): every pair, the exact CRPS of the mixture.
    """
    y, f = np.asarray(y, float), np.asarray(f, float)
    var = _component_var(y, f, noise_var)
    if not np.all(var > 0):
        raise ValueError("noise_var must be positive")
    k, n = f.shape
    first = np.mean(_abs_gaussian_mean(y[None] - f, var), axis=0)
    if pair_components is not None:
        if isinstance(pair_components, bool) or not isinstance(pair_components, int | np.integer) \
                or pair_components < 1:
            raise ValueError(f"pair_components must be a positive integer or None, got {pair_components!r}")
        m = min(int(pair_components), k)
        f, var, k = f[:m], var[:m], m
    second = np.empty(n)
    block = max(1, 2**22 // (k * k))
    for a in range(0, n, block):
        fb, vb = f[:, a:a + block], var[:, a:a + block]
        pairs = _abs_gaussian_mean(fb[:, None] - fb[None], vb[:, None] + vb[None])
        second[a:a + block] = np.mean(pairs, axis=(0, 1))
    return float(np.mean(first - 0.5 * second))


def gaussian_kl(m0: np.ndarray, S0: np.ndarray, m1: np.ndarray, S1: np.ndarray) -> float:
    """``KL(N(m0, S0) || N(m1, S1))`` by Cholesky factors (raises if a covariance is not positive definite)."""
    m0, m1 = np.atleast_1d(np.asarray(m0, float)), np.atleast_1d(np.asarray(m1, float))
    S0, S1 = np.atleast_2d(np.asarray(S0, float)), np.atleast_2d(np.asarray(S1, float))
    d = m0.shape[0]
    try:
        L0 = np.linalg.cholesky(S0)
        L1 = np.linalg.cholesky(S1)
    except np.linalg.LinAlgError as exc:
        raise ValueError("gaussian_kl: a covariance is not positive definite (singular estimate?)") from exc
    M = np.linalg.solve(L1, L0)  # L1^-1 L0
    trace = np.sum(M**2)
    z = np.linalg.solve(L1, m1 - m0)
    logdet = 2 * (np.sum(np.log(np.diag(L1))) - np.sum(np.log(np.diag(L0))))
    return float(0.5 * (trace + z @ z - d + logdet))


def coverage(y: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """Share of ``y`` inside ``[lower, upper]``."""
    y = np.asarray(y, float)
    return float(np.mean((y >= np.asarray(lower)) & (y <= np.asarray(upper))))


# ------------------------------------------------------------------------------------------ classifiers


def _check_probs(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, float)
    y = np.asarray(labels)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"probs must have shape (n, C) with C >= 2, got {p.shape}")
    if y.shape != (p.shape[0],):
        raise ValueError(f"labels must have shape ({p.shape[0]},), got {y.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or not np.allclose(p.sum(1), 1.0, atol=1e-6):
        raise ValueError("probs must be finite, non-negative rows summing to 1")
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= p.shape[1]:
        raise ValueError(f"labels must be integers in 0..{p.shape[1] - 1}")
    return p, y


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    """Share of rows whose most probable class (first one on ties) is the label."""
    p, y = _check_probs(probs, labels)
    return float(np.mean(np.argmax(p, axis=1) == y))


def class_mnll(probs: np.ndarray, labels: np.ndarray, floor: float = 1e-300) -> float:
    """Mean negative log of the probability given to the true class, ``-1/n sum_i log p_i(y_i)``.

    ``probs`` is the predictive distribution itself (for an ensemble: the mean of its members' probabilities,
    the mixture); ``floor`` keeps a probability of exactly 0 finite (and huge).
    """
    p, y = _check_probs(probs, labels)
    return float(-np.mean(np.log(np.maximum(p[np.arange(y.size), y], floor))))


class Reliability(NamedTuple):
    """A reliability diagram: per confidence bin its count, mean confidence and accuracy (NaN when empty)."""

    edges: np.ndarray
    count: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray


def reliability(probs: np.ndarray, labels: np.ndarray, n_bins: int = 10) -> Reliability:
    """Bin the predictions by confidence ``max_c p_ic`` into ``n_bins`` equal-width bins of ``[0, 1]``.

    A bin is ``(lo, hi]`` (the first also holds 0). Its confidence is the mean confidence of its rows and its
    accuracy the share of its rows whose most probable class is the label.
    """
    p, y = _check_probs(probs, labels)
    n_bins = int(n_bins)
    if n_bins < 1:
        raise ValueError(f"n_bins must be at least 1, got {n_bins}")
    conf = p.max(axis=1)
    correct = (np.argmax(p, axis=1) == y).astype(float)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins).astype(int)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(idx, weights=conf, minlength=n_bins) / count
        acc = np.bincount(idx, weights=correct, minlength=n_bins) / count
    return Reliability(edges, count, np.where(count > 0, mean_conf, np.nan), np.where(count > 0, acc, np.nan))


def ece(probs: np.ndarray, labels: np.ndarray, n_bins: int = 10) -> float:
    """Expected calibration error: ``sum_b (n_b / n) |acc_b - conf_b|`` over the bins of :func:`reliability`.

    ``conf_b`` is the mean confidence of the rows inside bin ``b`` (not the bin's centre) and ``acc_b`` their
    accuracy; the gap is absolute, empty bins count nothing.
    """
    r = reliability(probs, labels, n_bins)
    ok = r.count > 0
    return float(np.sum(r.count[ok] * np.abs(r.accuracy[ok] - r.confidence[ok])) / r.count.sum())
