"""What the baselines' dense ReLU networks share: Keras-style initial weights and the check of a count."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check_count", "glorot_uniform"]


def check_count(v: Any, what: str, minimum: int = 1) -> int:
    """``v`` as an int, or one ``ValueError`` naming ``what`` if it is not an integer ``>= minimum``."""
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or int(v) < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def glorot_uniform(key: jax.Array, sizes: Sequence[int], dtype: Any) -> list[dict[str, jax.Array]]:
    """Dense layers of widths ``sizes = (d_in, ..., d_out)`` with Keras ``Dense``'s defaults: Glorot-uniform
    weights ``U(-a, a)``, ``a = sqrt(6 / (fan_in + fan_out))``, and zero biases; layer ``l`` draws its
    weights with ``split(key, len(sizes) - 1)[l]``. ``sizes`` are checked by the caller."""
    params = []
    for k, fan_in, fan_out in zip(jax.random.split(key, len(sizes) - 1), sizes[:-1], sizes[1:], strict=True):
        a = math.sqrt(6.0 / (fan_in + fan_out))
        params.append({"w": jax.random.uniform(k, (fan_in, fan_out), dtype, -a, a),
                       "b": jnp.zeros((fan_out,), dtype)})
    return params
