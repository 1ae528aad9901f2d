"""bootens_core — bootstrap ensembles as (approximate) Bayesian inference, in JAX.

The executable core of the companion book of Milios, Michiardi & Filippone, "A Variational View on
Bootstrap Ensembles as Bayesian Inference". One module per concept:

- :mod:`~bootens_core.config`   experiment configurations with ``quick()`` and ``paper()`` profiles
- :mod:`~bootens_core.models`   model functions ``f(params, x)`` and their Gaussian priors
- :mod:`~bootens_core.perturb`  parametric-bootstrap perturbations and the (perturbed) log joints
- :mod:`~bootens_core.ensemble` Algorithm 1: all particles trained at once (vmap + lax.scan, optax)
- :mod:`~bootens_core.linear`   exact Bayesian linear regression, perturbed MAP, KL and self-distance
- :mod:`~bootens_core.metrics`  RMSE, mixture MNLL, Gaussian KL
- :mod:`~bootens_core.store`    result cache with provenance
- :mod:`~bootens_core.plots`    every figure of the book
- :mod:`~bootens_core.cli`      the ``bootens`` command

Importing the package enables JAX's 64-bit mode: comparisons against analytic posteriors run in float64,
and every experiment states the dtype its networks train in (``dtype`` config field), so float32
training stays float32.
"""

from __future__ import annotations

import jax as _jax

_jax.config.update("jax_enable_x64", True)

__version__ = "0.1.0"

__all__ = ["__version__"]
