"""bootens_core — bootstrap ensembles as (approximate) Bayesian inference, in JAX.

The executable core of the companion book of Milios, Michiardi & Filippone, "A Variational View on
Bootstrap Ensembles as Bayesian Inference". Two layers. The library, one module or folder per question:

- :mod:`~bootens_core.models`    model functions ``f(params, x)`` and their Gaussian priors
- :mod:`~bootens_core.perturb`   parametric-bootstrap perturbations and the (perturbed) log joints
- :mod:`~bootens_core.ensemble`  Algorithm 1: all particles trained at once (vmap + lax.scan, optax)
- :mod:`~bootens_core.samplers`  reference samplers: Metropolis-Hastings, NUTS, scale-adapted SGHMC
- :mod:`~bootens_core.baselines` Gaussian processes and Monte Carlo dropout
- :mod:`~bootens_core.exact`     exact Bayesian linear regression, grid posteriors, the theorems measured
- :mod:`~bootens_core.metrics`   RMSE, mixture MNLL, Gaussian KL, calibration
- :mod:`~bootens_core.checks`    validation of user inputs, the divergence error
- :mod:`~bootens_core.driver`    the chunked host loop (progress bars) of the ensemble and the samplers
- :mod:`~bootens_core.classification` classification as heteroscedastic latent regression
- :mod:`~bootens_core.data`      the UCI benchmark, tabular and synthetic data
- :mod:`~bootens_core.adapters`   networks of one's own: any ``apply``, Flax (Linen, NNX), Equinox
- :mod:`~bootens_core.estimators` scikit-learn estimators: fit, predict with intervals, save and load
- :mod:`~bootens_core.persist`    the versioned file format of a fitted ensemble

and the reproduction of the paper on top of it, ``bootens_core.repro`` (configurations and profiles,
the experiments of every chapter, the result store, tables, figures, benchmarks and the ``bootens``
command). The library never imports the reproduction layer.

Importing the package changes no JAX setting. Functions compute in the dtype they are given, by default
JAX's default float (float32, or float64 with JAX's 64-bit mode on; :func:`bootens_core.models.float_dtype`);
asking for float64 while the mode is off raises an error. The reproduction compares against analytic
posteriors in float64: its experiments require the mode, which the ``bootens`` command and every chapter
switch on. They also ask for float32 matrix products in float32 (``jax_default_matmul_precision``
``"highest"``): JAX's default on NVIDIA GPUs since Ampere is TF32, which no CPU uses, and a paper-scale record
joins cells made on both. A library user on such a GPU chooses the same way, with that setting.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
