"""Exact Bayesian linear regression, the closed-form perturbed MAP, and KL to the exact posterior.

Model: ``y = Phi w + eps``, ``eps ~ N(0, sigma^2 I)``, ``w ~ N(0, alpha^2 I_D)``, with ``Phi`` the ``(n, D)``
design matrix (rows are points; the paper writes its transpose). The posterior is ``N(w_bar, A^-1)`` with
``A = Phi^T Phi / sigma^2 + I / alpha^2`` and ``w_bar = A^-1 Phi^T y / sigma^2`` (Section 4.1).

Everything is computed from one thin SVD ``Phi = U S V^T``: ``A`` has eigenvalues
``lambda_i = s_i^2 / sigma^2 + 1 / alpha^2`` on the columns of ``V`` (the *data subspace*, of dimension
``r = min(n, D)``) and ``1 / alpha^2`` on its orthogonal complement, where prior and posterior coincide.

Gradient ascent on a perturbed log joint is linear in the particle, so a Gaussian population stays Gaussian;
:func:`gd_population` propagates its law in closed form. The ensemble's KL is estimated by
:func:`projected_kl`: the Gaussian KL between the moment-matched particles and the posterior, both projected
onto the data subspace (see its docstring for why).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import digamma

from ..metrics import gaussian_kl
from ..models import float_dtype

__all__ = [
    "LinearGaussian",
    "posterior",
    "perturbed_map",
    "sample_posterior",
    "GDPopulation",
    "gd_population",
    "gd_population_kl",
    "projected_kl",
    "projected_kl_path",
    "projected_kl_fn",
    "self_distance",
    "expected_self_distance",
    "cov_rel_error",
    "expected_cov_rel_error",
    "KL_ESTIMATOR",
]

KL_ESTIMATOR = (
    "Gaussian KL between the moment-matched particles (sample mean, unbiased sample covariance) and the exact "
    "posterior, both projected onto the data subspace spanned by the rows of the design matrix (dimension "
    "r = min(n, D) = {r}); outside it prior and posterior coincide. With k = {k} particles the projected "
    "sample covariance is non-singular (r < k), unlike the full {D}-dimensional one. The self-distance uses "
    "the same estimator on exact posterior samples."
)


class LinearGaussian(NamedTuple):
    """The exact posterior of a Bayesian linear model, in the SVD basis of its design matrix.

    Attributes:
        V: ``(D, r)`` orthonormal basis of the data subspace (right singular vectors of ``Phi``).
        s2: ``(r,)`` squared singular values of ``Phi``.
        lam: ``(r,)`` eigenvalues of the posterior precision ``A`` on ``V``.
        mean: ``(D,)`` posterior mean ``w_bar``.
        noise_var, prior_var: ``sigma^2`` and ``alpha^2``.
        D: number of features.
    """

    V: np.ndarray
    s2: np.ndarray
    lam: np.ndarray
    mean: np.ndarray
    noise_var: float
    prior_var: float
    D: int

    @property
    def mean_coords(self) -> np.ndarray:
        """Posterior mean in the data-subspace basis, ``V^T w_bar``."""
        return self.V.T @ self.mean

    @property
    def precision(self) -> np.ndarray:
        """The full ``(D, D)`` posterior precision ``A``."""
        return self.V @ np.diag(self.lam - 1 / self.prior_var) @ self.V.T + np.eye(self.D) / self.prior_var

    @property
    def cov(self) -> np.ndarray:
        """The full ``(D, D)`` posterior covariance ``A^-1``."""
        return self.V @ np.diag(1 / self.lam - self.prior_var) @ self.V.T + self.prior_var * np.eye(self.D)


def posterior(Phi: np.ndarray, y: np.ndarray, noise_var: float, prior_var: float) -> LinearGaussian:
    """The exact posterior of ``y = Phi w + N(0, noise_var)`` under ``w ~ N(0, prior_var I)``."""
    Phi, y = np.asarray(Phi, np.float64), np.asarray(y, np.float64)
    if Phi.ndim != 2 or Phi.shape[0] != y.shape[0]:
        raise ValueError(f"Phi must be (n, D) with n = len(y) = {y.shape[0]}, got {Phi.shape}")
    _, s, Vt = np.linalg.svd(Phi, full_matrices=False)
    V = Vt.T
    s2 = s**2
    lam = s2 / noise_var + 1 / prior_var
    mean = V @ ((V.T @ (Phi.T @ y)) / noise_var / lam)
    return LinearGaussian(V, s2, lam, mean, float(noise_var), float(prior_var), Phi.shape[1])


def perturbed_map(post: LinearGaussian, Phi: np.ndarray, y_tilde: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """The closed-form MAP of perturbed problems (Section 4.1), one per row of ``y_tilde``/``anchor``.

    ``w_* = A^-1 (Phi^T y~ / sigma^2 + w~ / alpha^2)`` for ``y_tilde`` ``(k, n)`` and ``anchor`` ``(k, D)``.
    """
    b = np.asarray(y_tilde) @ np.asarray(Phi) / post.noise_var + np.asarray(anchor) / post.prior_var
    return _apply_cov(post, b)


def _apply_cov(post: LinearGaussian, b: np.ndarray) -> np.ndarray:
    """``A^-1 b`` for the rows of ``b``."""
    coords = b @ post.V
    return (coords / post.lam) @ post.V.T + post.prior_var * (b - coords @ post.V.T)


def sample_posterior(key: jax.Array, post: LinearGaussian, n: int) -> np.ndarray:
    """``n`` exact posterior samples ``(n, D)``."""
    k_sub, k_perp = jax.random.split(key)
    z_sub = np.asarray(jax.random.normal(k_sub, (n, post.V.shape[1]), float_dtype()))
    z_full = np.asarray(jax.random.normal(k_perp, (n, post.D), float_dtype()))
    perp = z_full - (z_full @ post.V) @ post.V.T
    return post.mean[None] + (z_sub / np.sqrt(post.lam)) @ post.V.T + np.sqrt(post.prior_var) * perp


class GDPopulation(NamedTuple):
    """Law of a Gaussian particle population under plain gradient ascent, in the data-subspace basis.

    Attributes:
        steps: the steps ``t`` evaluated.
        mean: ``(len(steps), r)`` population mean coordinates ``V^T E[w_t]``.
        var: ``(len(steps), r)`` population variances on the columns of ``V`` (the covariance is diagonal
            there; off the data subspace it stays ``alpha^2 I`` = the posterior's).
    """

    steps: np.ndarray
    mean: np.ndarray
    var: np.ndarray


def gd_population(post: LinearGaussian, step_size: float, steps: np.ndarray) -> GDPopulation:
    """Exact law of Algorithm 1 with plain gradient ascent, started at the anchors ``w_0 = w~``.

    The perturbed gradient is ``b - A w`` with ``b = Phi^T y~ / sigma^2 + w~ / alpha^2``, so with
    ``M = I - h A`` and ``w_* = A^-1 b``: ``w_t = M^t w~ + (I - M^t) w_*``. On an eigenvector of ``A`` with
    eigenvalue ``lambda`` and ``m = (1 - h lambda)^t`` this gives mean ``(1 - m) w_bar`` and variance
    ``alpha^2 (m + (1 - m) / (alpha^2 lambda))^2 + (1 - m)^2 (lambda - 1/alpha^2) / lambda^2``, which starts at
    the prior variance ``alpha^2`` and tends to the posterior's ``1 / lambda`` iff ``|1 - h lambda| < 1``.
    """
    t = np.asarray(steps, np.float64)[:, None]
    lam = post.lam[None]
    with np.errstate(over="ignore", invalid="ignore"):
        m = np.power(1 - step_size * lam, t)
        a2 = post.prior_var
        var = a2 * (m + (1 - m) / (a2 * lam)) ** 2 + (1 - m) ** 2 * (lam - 1 / a2) / lam**2
        mean = (1 - m) * post.mean_coords[None]
    return GDPopulation(np.asarray(steps), mean, var)


def gd_population_kl(post: LinearGaussian, pop: GDPopulation) -> np.ndarray:
    """Exact ``KL(q_t || p)`` of the Gaussian population law of :func:`gd_population` (full dimension)."""
    lam = post.lam[None]
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = lam * pop.var
        d = pop.mean - post.mean_coords[None]
        kl = 0.5 * np.sum(ratio - 1 - np.log(ratio) + lam * d**2, axis=1)
    return np.where(np.isfinite(kl), kl, np.inf)


def projected_kl(post: LinearGaussian, samples: np.ndarray) -> float:
    """The ensemble's KL estimate: moment-matched Gaussian KL on the data subspace.

    ``k`` particles in ``D`` dimensions give a sample covariance of rank at most ``k - 1``, so with
    ``k <= D`` the Gaussian KL to the posterior is infinite as written. We project particles and posterior on
    the data subspace ``V`` (dimension ``r``; require ``r < k``), where the posterior is ``N(V^T w_bar,
    diag(1/lambda))``, and return ``KL(N(mean, cov) || posterior)`` of the projections. By the
    data-processing inequality this lower-bounds the KL of the full laws; it equals it for any population
    whose off-subspace law is the prior's (true of plain gradient ascent from prior anchors).
    """
    z = np.asarray(samples, np.float64) @ post.V
    k, r = z.shape
    if r >= k:
        raise ValueError(f"projected_kl needs more particles ({k}) than subspace dimensions ({r})")
    return _kl_coords(post, z)


def projected_kl_fn(post: LinearGaussian):
    """A JAX function ``particles (k, D) -> projected_kl`` for use on the device (e.g. as a ``record``)."""
    V = jnp.asarray(post.V)
    mu_p = jnp.asarray(post.mean_coords)
    lam = jnp.asarray(post.lam)
    r = V.shape[1]

    def kl(w: jax.Array) -> jax.Array:
        z = w @ V
        k = z.shape[0]
        mean = z.mean(0)
        zc = z - mean
        cov = zc.T @ zc / (k - 1)
        # KL(N(mean, cov) || N(mu_p, diag(1/lam))) with cov by Cholesky (NaN if singular).
        L = jnp.linalg.cholesky(cov)
        logdet_q = 2 * jnp.sum(jnp.log(jnp.diag(L)))
        logdet_p = -jnp.sum(jnp.log(lam))
        return 0.5 * (jnp.sum(lam * jnp.diag(cov)) + jnp.sum(lam * (mean - mu_p) ** 2) - r + logdet_p - logdet_q)

    return kl


def projected_kl_path(post: LinearGaussian, coords: np.ndarray) -> np.ndarray:
    """:func:`projected_kl` along a path of already-projected particles ``coords`` ``(T, k, r)``."""
    coords = np.asarray(coords, np.float64)
    return np.array([_kl_coords(post, z) if np.all(np.isfinite(z)) else np.inf for z in coords])


def _kl_coords(post: LinearGaussian, z: np.ndarray) -> float:
    """Gaussian KL of the moment-matched projected particles ``z`` ``(k, r)`` to the projected posterior."""
    return gaussian_kl(z.mean(0), np.cov(z, rowvar=False), post.mean_coords, np.diag(1 / post.lam))


def self_distance(key: jax.Array, post: LinearGaussian, k: int, n_populations: int) -> np.ndarray:
    """:func:`projected_kl` of ``n_populations`` populations of ``k`` exact posterior samples."""
    keys = jax.random.split(key, n_populations)
    return np.array([projected_kl(post, sample_posterior(kk, post, k)) for kk in keys])


def expected_self_distance(r: int, k: int) -> float:
    """Closed-form expectation of the estimator on ``k`` exact samples in ``r`` dimensions.

    With ``(k-1) S ~ Wishart(k-1, Sigma)`` and an independent mean error ``~ N(0, Sigma / k)``:
    ``E KL = 1/2 [ r/k - sum_{i=1}^r psi((k-i)/2) - r log(2/(k-1)) ]``.
    """
    if k <= r:
        raise ValueError(f"the estimator needs more samples ({k}) than dimensions ({r})")
    i = np.arange(1, r + 1)
    return float(0.5 * (r / k - np.sum(digamma((k - i) / 2)) - r * np.log(2 / (k - 1))))


def cov_rel_error(samples: np.ndarray, cov: np.ndarray) -> float:
    """``||S - cov||_F / ||cov||_F`` for the unbiased sample covariance ``S`` of ``samples`` ``(k, D)``."""
    S = np.cov(np.asarray(samples, np.float64), rowvar=False)
    return float(np.linalg.norm(S - cov) / np.linalg.norm(cov))


def expected_cov_rel_error(cov: np.ndarray, k: int) -> float:
    """Root-mean-square of :func:`cov_rel_error` for ``k`` exact Gaussian samples.

    For the unbiased sample covariance, ``E (S_ij - C_ij)^2 = (C_ij^2 + C_ii C_jj) / (k - 1)``, so
    ``E ||S - C||_F^2 = (||C||_F^2 + (tr C)^2) / (k - 1)``.
    """
    fro2 = float(np.sum(np.asarray(cov) ** 2))
    tr = float(np.trace(cov))
    return float(np.sqrt((fro2 + tr**2) / (k - 1) / fro2))
