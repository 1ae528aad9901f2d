"""Algorithm 1 of the paper: an ensemble of perturbed models, every particle trained at once.

- :mod:`~bootens_core.ensemble.algorithm` the replicates, the particles' steps and the training drivers
  (:func:`train`, :func:`train_grid`), sharding over devices
- :mod:`~bootens_core.ensemble.lbfgs`     ``torch.optim.LBFGS``'s algorithm as an optax transformation
"""

from __future__ import annotations

from .algorithm import (
    DivergedParticlesError,
    EnsembleResult,
    Optimizer,
    State,
    check_data,
    check_finite,
    gather,
    init,
    model_outputs,
    optimizer,
    particle_mesh,
    predict,
    replicate,
    shard_particles,
    train,
    train_grid,
)

__all__ = [
    "Optimizer",
    "optimizer",
    "State",
    "EnsembleResult",
    "DivergedParticlesError",
    "check_data",
    "check_finite",
    "model_outputs",
    "init",
    "train",
    "train_grid",
    "predict",
    "particle_mesh",
    "shard_particles",
    "replicate",
    "gather",
]
