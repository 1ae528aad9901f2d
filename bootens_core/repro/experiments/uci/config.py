"""Tables 1-3: the UCI regression benchmark, ensembles of the paper beside GP baselines, against the paper: the configuration."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from ...config import DeepEnsembleConfig, NetworkConfig, LBFGSConfig, GPConfig, MCDropoutConfig, SGHMCConfig

__all__ = ["UCI_DATASETS", "UCI_METHODS", "UCIConfig"]

UCI_DATASETS = ("boston", "concrete", "energy", "kin8nm", "naval", "power", "protein", "wine", "yacht")
# Method ids of the UCI harness: "<method>-<hidden layers>" for networks, "gp" for the GP baseline. New ids
# are appended: a method's position seeds its cells' keys.
UCI_METHODS = ("ensemble-1", "ensemble-4", "gp", "mcd-1", "mcd-4", "sghmc-1", "plain-1", "plain-4", "deep-1")


@dataclass(frozen=True)
class UCIConfig:
    """Tables 1-3: the UCI regression benchmark (Appendix "Details on the experimental results").

    Paper: 200 particles of ReLU networks with 1 and 4 hidden layers of 50 units, alpha_w^2 = alpha_b^2 = 1,
    sigma^2 by grid search on validation MNLL (20% of the training split held out), L-BFGS "32 steps, step
    size 0.5"; exact GPR with an isotropic squared-exponential kernel (SVGP with 400 inducing points for
    Protein); 10 splits (5 for Protein). The paper gives no grid: ``noise_grid`` (standardised label units)
    is ours. ``max_splits`` = 0 means the paper's number of splits.
    """

    seed: int = 0
    datasets: tuple[str, ...] = UCI_DATASETS
    methods: tuple[str, ...] = UCI_METHODS
    max_splits: int = 0
    # Ensembles (Algorithm 1): n_particles networks trained together by L-BFGS.
    n_particles: int = 200
    # The networks and their prior, shared by the ensembles and SGHMC (MC dropout takes the width). Deviation
    # switch: ``network.scale_by_fan_in``, the weight prior N(0, weight_var / fan_in) instead of the paper's.
    network: NetworkConfig = NetworkConfig()
    lbfgs: LBFGSConfig = LBFGSConfig()
    # The sigma^2 grid of every method that selects sigma^2 on validation MNLL (standardised label units: the
    # paper gives no grid) and the share of the training split held out for it.
    noise_grid: tuple[float, ...] = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)
    val_fraction: float = 0.2
    gp: GPConfig = GPConfig()
    mcd: MCDropoutConfig = MCDropoutConfig()
    sghmc: SGHMCConfig = SGHMCConfig()
    # Deep ensembles (beyond the paper's columns) on their protocol as we read it, but for Adam's learning rate:
    # 0.01 instead of 0.1, a named deviation (at 0.1 networks blow up on some splits: experiment.deep_lr_check).
    deep: DeepEnsembleConfig = DeepEnsembleConfig(lr=0.01)
    # How the run is carried out, not what it computes (neither decides a cell). Cells run at once (threads);
    # 0: one per CPU core this process may use, at most 2 (``cell_workers``), which the quick profile takes.
    # Measured on the 2-core CI machine: with both cores, two cells at once take 0.59x the time of one after
    # the other (4 Boston/Yacht ensemble cells); held to one core (as the book's build holds each chapter),
    # the quick profile's 30 cells take 1.10x the time with two at once (555 vs 506 s).
    workers: int = 1
    # How many sigma^2 values of ``noise_grid`` an ensemble cell trains as one batch during its selection
    # (ensemble.train_grid: the same particles as one value at a time, up to float rounding). 0: automatic --
    # 1 on a CPU, where a batch saves nothing, and on an accelerator as many as fit in a quarter of its memory
    # (uci.grid_batch).
    noise_grid_batch: int = 0

    # The flat field names of earlier versions that are not "<sub-configuration>_<field>" (config.resolve).
    LEGACY_NAMES: ClassVar[dict[str, str]] = {
        "width": "network.width", "weight_var": "network.weight_var", "bias_var": "network.bias_var",
        "scale_by_fan_in": "network.scale_by_fan_in", "dtype": "network.dtype",
        "svgp_datasets": "gp.svgp_datasets", "n_inducing": "gp.n_inducing",
    }

    def __post_init__(self) -> None:
        w = self.workers
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"workers must be a non-negative integer (0 = one per usable core), got {w!r}")
        nb = self.noise_grid_batch
        if isinstance(nb, bool) or not isinstance(nb, int) or nb < 0:
            raise ValueError(f"noise_grid_batch must be a non-negative integer (0 = automatic), got {nb!r}")
        for name, cls in (("network", NetworkConfig), ("lbfgs", LBFGSConfig), ("gp", GPConfig),
                          ("mcd", MCDropoutConfig), ("sghmc", SGHMCConfig), ("deep", DeepEnsembleConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"UCIConfig.{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}")

    @classmethod
    def quick(cls) -> UCIConfig:
        return cls(datasets=("boston", "yacht"),
                   methods=("ensemble-1", "gp", "mcd-1", "mcd-4", "sghmc-1", "plain-1", "deep-1"),
                   max_splits=3, n_particles=50, mcd=MCDropoutConfig(samples=1000), sghmc=SGHMCConfig(thin=200),
                   workers=0)

    @property
    def cell_workers(self) -> int:
        """Cells run at once: ``workers``, or for 0 one per CPU core this process may use, at most 2."""
        if self.workers:
            return self.workers
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # no affinity masks on this platform
            cores = os.cpu_count() or 1
        return max(1, min(2, cores))

    @classmethod
    def paper(cls) -> UCIConfig:
        return cls()

    @classmethod
    def faithful(cls) -> UCIConfig:
        """The paper's settings with its optimizer as written: ``torch.optim.LBFGS(lr=0.5)`` with torch's
        defaults (fixed step, ``max_iter=20``, ``history_size=100``) stepped 32 times (``--set
        lbfgs.linesearch=torch --set lbfgs.memory=100`` on the CLI)."""
        return cls(lbfgs=LBFGSConfig(linesearch="torch", memory=100))

    @classmethod
    def optax_fixed_step(cls) -> UCIConfig:
        """The paper's settings with optax's L-BFGS at the fixed step 0.5 for 640 iterations (memory 10; the
        committed ``results/paper/uci-fixed-step`` record; ``--set lbfgs.linesearch=null`` on the CLI)."""
        return cls(lbfgs=LBFGSConfig(linesearch=None))
