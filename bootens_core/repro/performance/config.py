"""The configurations of the performance chapter: the particle-throughput benchmark (:class:`BenchConfig`,
``bootens bench``) and the profile of where the time of the whole goes (:class:`ProfileConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BenchConfig", "ProfileConfig"]


@dataclass(frozen=True)
class BenchConfig:
    """The particle-throughput benchmark (``bootens bench``, :mod:`bootens_core.repro.performance.bench`).

    Ensembles of the UCI networks (``hidden_layers`` x ``width`` ReLU units) on synthetic data with the
    inputs and training sizes of ``datasets``, trained full-batch by Adam (learning rate ``learning_rate``) on
    Algorithm 1's perturbed log joint for ``steps`` steps, for every particle count of ``ks``; each timing is
    repeated ``repeats`` times after a warm-up. ``max_rows`` caps the training size (0 = the dataset's).
    The baselines run ``loop_particles`` single-particle trainings (their rate does not depend on ``k``).
    ``max_memory_fraction`` skips rows whose estimated working set exceeds that fraction of the device memory.
    ``peak_size`` (matrix side of the peak-FLOP/s matmul) and ``bandwidth_mib`` (array size of the bandwidth
    kernel) are 0 for a size chosen by the platform.
    """

    seed: int = 0
    hidden_layers: tuple[int, ...] = (1, 4)
    width: int = 50
    datasets: tuple[str, ...] = ("boston", "kin8nm", "protein")
    ks: tuple[int, ...] = (1, 10, 50, 200, 1000)
    steps: int = 50
    repeats: int = 5
    max_rows: int = 0
    learning_rate: float = 1e-3
    noise_var: float = 0.1
    loop_particles: int = 50
    torch: bool = True
    shard: bool = False
    max_memory_fraction: float = 0.5
    peak_size: int = 0
    bandwidth_mib: int = 0
    peak_repeats: int = 5

    @classmethod
    def quick(cls) -> BenchConfig:
        # Kin8nm's capped shape (8 inputs, 512 rows) would repeat Protein's (9, 512): the paper profile has it.
        return cls(datasets=("boston", "protein"), ks=(1, 10, 50, 200), steps=5, repeats=5, max_rows=512,
                   loop_particles=10, peak_repeats=3)

    @classmethod
    def paper(cls) -> BenchConfig:
        return cls()


@dataclass(frozen=True)
class ProfileConfig:
    """Where the time of the whole goes (:mod:`bootens_core.repro.performance.profiling`, the performance chapter).

    Each stage is called twice in one process: a UCI cell of each of ``uci_methods`` on ``uci_dataset``
    (splits ``uci_splits``; the quick UCI configuration with ``uci_particles`` particles, ``uci_lbfgs_steps``
    L-BFGS steps and SGHMC shortened to ``uci_sghmc_restarts`` x ``uci_sghmc_draws``, so that the profile stays
    cheap; the σ² grid search is kept), NUTS and Metropolis-Hastings on a one-hidden-layer network of
    ``mcmc_width`` units and ``mcmc_points`` points. The line-search comparison runs the L-BFGS (zoom) ensemble
    step two ways on ``line_search_*``'s shape, ``repeats`` timed calls each.
    """

    seed: int = 0
    uci_dataset: str = "boston"
    uci_methods: tuple[str, ...] = ("ensemble-1", "sghmc-1")
    uci_splits: tuple[int, ...] = (0, 1)
    uci_particles: int = 10
    uci_lbfgs_steps: int = 4
    uci_sghmc_restarts: int = 2
    uci_sghmc_draws: int = 5
    mcmc_width: int = 10
    mcmc_points: int = 30
    mcmc_chains: int = 2
    mcmc_warmup: int = 200
    mcmc_draws: int = 200
    mh_burn_in: int = 1000
    mh_thin: int = 10
    line_search_dataset: str = "boston"
    line_search_rows: int = 0
    line_search_layers: int = 1
    line_search_particles: int = 50
    line_search_steps: int = 20
    repeats: int = 5

    @classmethod
    def quick(cls) -> ProfileConfig:
        return cls()

    @classmethod
    def paper(cls) -> ProfileConfig:
        return cls(uci_particles=200, uci_lbfgs_steps=32, uci_sghmc_restarts=10, uci_sghmc_draws=20,
                   line_search_particles=200)
