"""Synthetic datasets of the paper's illustrative figures (the paper does not publish its own).

Every generator takes a PRNG key first and returns plain float64 numpy arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from ..models import float_dtype

__all__ = [
    "Regression1D",
    "Classification1D",
    "univariate",
    "trig_regression",
    "trig_frequencies",
    "toy_relu",
    "binary_1d",
]


class Regression1D(NamedTuple):
    """A 1-D regression dataset: inputs ``x`` ``(n,)``, labels ``y`` ``(n,)``, and its generating function."""

    x: np.ndarray
    y: np.ndarray
    description: str


class Classification1D(NamedTuple):
    """A 1-D two-class dataset: inputs ``x`` ``(n,)``, labels ``(n,)`` in {0, 1}, and ``p(y = 1 | x)``."""

    x: np.ndarray
    labels: np.ndarray
    prob: Callable[[np.ndarray], np.ndarray]
    description: str


def _binary_1d_prob(x: np.ndarray) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(1.5 * np.asarray(x, float))


def binary_1d(key: jax.Array, n: int, half_width: float = 3.0) -> Classification1D:
    """The classification figure's data (the paper does not publish its own): ``x ~ U(-half_width,
    half_width)`` sorted, ``y ~ Bernoulli(p(x))`` with ``p(x) = (1 - cos(1.5 x)) / 2``: class 1 on both sides,
    class 0 in the middle, the transitions where ``p`` crosses 1/2 (``|x| = pi/3``). Both classes are present
    (else one point is flipped)."""
    k_x, k_y = jax.random.split(key)
    x = np.sort(np.asarray(jax.random.uniform(k_x, (n,), float_dtype(), -half_width, half_width)))
    u = np.asarray(jax.random.uniform(k_y, (n,), float_dtype()))
    labels = (u < _binary_1d_prob(x)).astype(np.int64)
    if labels.min() == labels.max():
        labels[0] = 1 - labels[0]
    desc = f"y ~ Bernoulli((1 - cos(1.5 x)) / 2), x ~ U(-{half_width:g}, {half_width:g}), n = {n}"
    return Classification1D(x, labels, _binary_1d_prob, desc)


def univariate(key: jax.Array, n: int, w_true: float, noise_var: float) -> Regression1D:
    """``y = w_true x + N(0, noise_var)`` with ``x ~ N(0, 1)`` (Figure 1)."""
    k_x, k_eps = jax.random.split(key)
    x = np.asarray(jax.random.normal(k_x, (n,), float_dtype()))
    y = w_true * x + np.sqrt(noise_var) * np.asarray(jax.random.normal(k_eps, (n,), float_dtype()))
    return Regression1D(x, y, f"y = {w_true:g} x + N(0, {noise_var:g}), x ~ N(0, 1)")


def trig_regression(key: jax.Array, n: int, noise_var: float) -> Regression1D:
    """Figure 2's data: ``y = sin(2x) + x/2 + N(0, noise_var)`` at ``x`` uniform on [-2, -0.5] U [0.5, 2].

    The gap in the middle and the ends beyond ``|x| = 2`` show the posterior's uncertainty growing away
    from the data.
    """
    k_side, k_x, k_eps = jax.random.split(key, 3)
    side = np.where(np.asarray(jax.random.bernoulli(k_side, 0.5, (n,))), 1.0, -1.0)
    x = side * np.asarray(jax.random.uniform(k_x, (n,), float_dtype(), 0.5, 2.0))
    x = np.sort(x)
    f = np.sin(2 * x) + 0.5 * x
    y = f + np.sqrt(noise_var) * np.asarray(jax.random.normal(k_eps, (n,), float_dtype()))
    return Regression1D(x, y, f"y = sin(2x) + x/2 + N(0, {noise_var:g}), x ~ U([-2,-0.5] u [0.5,2])")


def trig_frequencies(key: jax.Array, n_features: int, lengthscale: float) -> np.ndarray:
    """The fixed frequencies ``omega ~ N(0, l^2)`` of the trigonometric features (Appendix, l = 1.6)."""
    return lengthscale * np.asarray(jax.random.normal(key, (n_features,), float_dtype()))


def toy_relu(
    key: jax.Array, n: int, w_true: tuple[float, float], noise_var: float, half_width: float
) -> Regression1D:
    """Figure 4's data: ``y = ReLU(w1 x) + ReLU(w2 x) + N(0, noise_var)``, ``x ~ U(-half_width, half_width)``."""
    k_x, k_eps = jax.random.split(key)
    x = np.sort(np.asarray(jax.random.uniform(k_x, (n,), float_dtype(), -half_width, half_width)))
    f = np.maximum(w_true[0] * x, 0) + np.maximum(w_true[1] * x, 0)
    y = f + np.sqrt(noise_var) * np.asarray(jax.random.normal(k_eps, (n,), float_dtype()))
    desc = (f"y = ReLU({w_true[0]:g} x) + ReLU({w_true[1]:g} x) + N(0, {noise_var:g}), "
            f"x ~ U(-{half_width:g}, {half_width:g})")
    return Regression1D(x, y, desc)
