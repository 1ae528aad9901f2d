"""Algorithm 1 of the paper: an ensemble of perturbed models, every particle trained at once.

- :mod:`~bootens_core.ensemble.kernel`     the kernel: :func:`init` draws the replicates and starting
  particles (:class:`State`), :func:`step` moves every particle once (pure, jittable)
- :mod:`~bootens_core.ensemble.optimizers` the optimizers (:func:`optimizer`, :class:`Optimizer`)
- :mod:`~bootens_core.ensemble.drivers`    :func:`train` and :func:`train_grid`, drivers over the kernel
  (chunked scan, snapshots, records, progress, divergence, sharding)
- :mod:`~bootens_core.ensemble.sharding`   the particle axis over devices and hosts
- :mod:`~bootens_core.ensemble.groups`     how many particles a step takes at once, by the working set
- :mod:`~bootens_core.ensemble.stacked`    :func:`train_stacked`: many ensembles of one shape (the splits of a
  dataset) as one compiled program
- :mod:`~bootens_core.ensemble.lbfgs`      ``torch.optim.LBFGS``'s algorithm as an optax transformation
- :mod:`~bootens_core.ensemble.compact_lbfgs` optax's L-BFGS with its direction in compact form (the default)
"""

from __future__ import annotations

from . import drivers, groups, kernel, optimizers, sharding, stacked
from .drivers import *  # noqa: F403
from .groups import *  # noqa: F403
from .kernel import *  # noqa: F403
from .optimizers import *  # noqa: F403
from .sharding import *  # noqa: F403
from .stacked import *  # noqa: F403

__all__ = [*optimizers.__all__, *kernel.__all__, *drivers.__all__, *groups.__all__, *sharding.__all__, *stacked.__all__]
