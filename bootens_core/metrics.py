"""Metrics: RMSE, MNLL of the predictive mixture, Gaussian KL, interval coverage.

MNLL is always the negative log density of the *mixture* of the particles' predictive Gaussians,
computed with log-sum-exp (never the average of per-particle log densities).
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp, ndtr

__all__ = ["rmse", "mixture_mnll", "mixture_cdf", "mixture_coverage", "gaussian_kl", "coverage"]


def rmse(y: np.ndarray, pred_mean: np.ndarray) -> float:
    """Root mean squared error of a point prediction."""
    y, pred_mean = np.asarray(y, float), np.asarray(pred_mean, float)
    if y.shape != pred_mean.shape:
        raise ValueError(f"shapes differ: y {y.shape} vs prediction {pred_mean.shape}")
    return float(np.sqrt(np.mean((y - pred_mean) ** 2)))


def mixture_mnll(y: np.ndarray, f: np.ndarray, noise_var: float | np.ndarray) -> float:
    """Mean negative log-likelihood of ``y`` under the equal-weight mixture of the particles' predictives.

    ``-1/n sum_i log( 1/k sum_j N(y_i; f_ji, noise_var) )`` with ``f`` of shape ``(k, n)``.
    """
    y, f = np.asarray(y, float), np.asarray(f, float)
    if f.ndim != 2 or f.shape[1] != y.shape[0]:
        raise ValueError(f"f must have shape (k, n) with n = {y.shape[0]}, got {f.shape}")
    var = np.broadcast_to(np.asarray(noise_var, float), y.shape)
    logp = -0.5 * ((y[None] - f) ** 2 / var[None] + np.log(2 * np.pi * var)[None])
    return float(-np.mean(logsumexp(logp, axis=0) - np.log(f.shape[0])))


def mixture_cdf(y: np.ndarray, f: np.ndarray, noise_var: float | np.ndarray) -> np.ndarray:
    """``F(y_i) = 1/k sum_j Phi((y_i - f_ji) / sqrt(noise_var_i))``: the predictive mixture's CDF at each label.

    ``f`` has shape ``(k, n)``; ``noise_var`` is a scalar or one variance per point.
    """
    y, f = np.asarray(y, float), np.asarray(f, float)
    if f.ndim != 2 or f.shape[1] != y.shape[0]:
        raise ValueError(f"f must have shape (k, n) with n = {y.shape[0]}, got {f.shape}")
    sd = np.sqrt(np.broadcast_to(np.asarray(noise_var, float), y.shape))
    return np.mean(ndtr((y[None] - f) / sd[None]), axis=0)


def mixture_coverage(y: np.ndarray, f: np.ndarray, noise_var: float | np.ndarray, level: float = 0.95) -> float:
    """Share of labels inside the central ``level`` interval of their predictive mixture.

    ``y_i`` lies inside the interval between the mixture's ``(1 - level)/2`` and ``(1 + level)/2`` quantiles
    exactly when its CDF value does, so no quantile has to be solved for.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    u = mixture_cdf(y, f, noise_var)
    lo = (1 - level) / 2
    return float(np.mean((u >= lo) & (u <= 1 - lo)))


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
