"""The configuration of the chapter on using bootstrap ensembles on one's own data."""

from __future__ import annotations

from dataclasses import dataclass

from ....estimators import NOISE_GRID
from ...config import DeepEnsembleConfig

__all__ = ["PracticeConfig"]


@dataclass(frozen=True)
class PracticeConfig:
    """Guidance measured on scikit-learn's diabetes data (442 rows, 10 inputs), through the estimator.

    Each of ``n_splits`` random splits holds out ``test_fraction`` of the rows; on the rest the regressor is
    fitted with its defaults (one hidden layer of 50 ReLU units, weights ``N(0, 1/fan_in)``, biases
    ``N(0, 1)``, L-BFGS for ``steps`` steps, ``sigma^2`` selected from ``noise_grid`` on held-out MNLL) and
    ``n_particles`` particles; its first ``k`` particles for each ``k`` of ``ks`` are the ``k``-particle
    ensemble. The same data train the alternatives compared with it (``compare_particles`` particles each):
    the plain ensemble (no perturbation) and the paper's unscaled prior ``N(0, 1)``; and deep ensembles
    (``deep``: the UCI harness's settings, Adam's learning rate 0.01). ``stop_steps``: the
    steps at which the particles of a run with the selected ``sigma^2`` are scored on the test rows.
    """

    seed: int = 0
    n_splits: int = 20
    test_fraction: float = 0.2
    n_particles: int = 100
    ks: tuple[int, ...] = (1, 2, 5, 10, 20, 50, 100)
    compare_particles: int = 100
    steps: int = 500
    stop_steps: tuple[int, ...] = (0, 5, 10, 20, 50, 100, 200, 500)
    noise_grid: tuple[float, ...] = NOISE_GRID
    levels: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    pit_bins: int = 10
    # The margin of "as good as" (particles, steps): a test MNLL higher by less than this many nats per test
    # point, i.e. predictive densities within about 2% of each other.
    mnll_margin: float = 0.02
    deep: DeepEnsembleConfig = DeepEnsembleConfig(lr=0.01)

    @classmethod
    def quick(cls) -> PracticeConfig:
        """Three splits, 20 particles, 200 steps and four values of sigma^2: a minute on one CPU core."""
        return cls(n_splits=3, n_particles=20, ks=(1, 2, 5, 10, 20), compare_particles=20, steps=200,
                   stop_steps=(0, 5, 10, 20, 50, 100, 200), noise_grid=(0.03, 0.1, 0.3, 1.0))

    @classmethod
    def paper(cls) -> PracticeConfig:
        """Twenty splits, 100 particles and the estimator's defaults (500 steps, its whole grid)."""
        return cls()
