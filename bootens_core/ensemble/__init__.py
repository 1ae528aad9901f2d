"""Algorithm 1 of the paper: an ensemble of perturbed models, every particle trained at once.

- :mod:`~bootens_core.ensemble.algorithm` the kernel -- :func:`init` draws the replicates and starting
  particles (:class:`State`), :func:`step` moves every particle once (pure, jittable) -- and the drivers over
  it (:func:`train`, :func:`train_grid`: chunked scan, snapshots, records, progress, sharding over devices)
- :mod:`~bootens_core.ensemble.lbfgs`     ``torch.optim.LBFGS``'s algorithm as an optax transformation
"""

from __future__ import annotations

from .algorithm import (
    DivergedParticlesError,
    EnsembleResult,
    Info,
    Optimizer,
    State,
    check_data,
    check_finite,
    gather,
    init,
    model_outputs,
    optimizer,
    particle_mesh,
    particle_step,
    predict,
    replicate,
    shard_particles,
    step,
    train,
    train_grid,
)

__all__ = [
    "Optimizer",
    "optimizer",
    "State",
    "Info",
    "EnsembleResult",
    "DivergedParticlesError",
    "check_data",
    "check_finite",
    "model_outputs",
    "init",
    "step",
    "particle_step",
    "train",
    "train_grid",
    "predict",
    "particle_mesh",
    "shard_particles",
    "replicate",
    "gather",
]
