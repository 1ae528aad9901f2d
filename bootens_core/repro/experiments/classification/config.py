"""The configuration of the classification experiment (see :mod:`.experiment`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...config import DeepEnsembleConfig, DropoutGridConfig, NUTSConfig

__all__ = ["ClassificationConfig"]


@dataclass(frozen=True)
class ClassificationConfig:
    """The appendix's classification figure, and real datasets with calibration.

    Paper (Appendix "Extensions to classification"): labels -> Dirichlet parameters ``y + alpha_eps`` with
    ``alpha_eps = 0.01``, a log-normal latent regression, one hidden layer of ReLU units, a synthetic problem,
    the ensemble's 95% band of classifiers beside MCMC. It gives no data, width, prior, optimiser or sampler
    settings: these are ours (the UCI chapter's width 50 and L-BFGS; prior N(0, weight_var / fan_in) on the
    weights, N(0, bias_var) on the biases; NUTS as the reference).
    """

    seed: int = 0
    alpha_eps: float = 0.01
    width: int = 50
    weight_var: float = 2.0
    bias_var: float = 1.0
    # Synthetic problem (data.synthetic.binary_1d) and its figure.
    n_data: int = 40
    data_half_width: float = 3.0
    x_grid_points: int = 201
    x_grid_half_width: float = 6.0
    # Algorithm 1 on the latent regression: L-BFGS with the zoom line search, as the UCI chapter.
    n_particles: int = 200
    step_size: float = 0.5
    steps: int = 200
    # Beyond the paper: the agreement with NUTS for other alpha_eps (bootstrap ensemble only).
    alpha_eps_study: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0)
    # NUTS on the categorical-likelihood network with the same prior.
    nuts: NUTSConfig = NUTSConfig(chains=4, warmup=500, draws=250, max_tree_depth=8, target_accept=0.9)
    # Real datasets (data.tabular): stratified splits, standardised inputs.
    datasets: tuple[str, ...] = ("breast_cancer", "wine")
    n_splits: int = 5
    test_fraction: float = 0.2
    real_particles: int = 50
    real_steps: int = 200
    real_dtype: str = "float32"
    # MC dropout (softmax cross-entropy, Adam, Gal's weight decay with tau = 1): p chosen on the last 20% of
    # the training rows by validation MNLL, then refit on all of them.
    mcd: DropoutGridConfig = DropoutGridConfig(dropout_grid=(0.005, 0.01, 0.05, 0.1, 0.2), epochs=500, samples=1000)
    # Deep ensembles (categorical networks, adversarial training) on their protocol: 5 networks of one hidden
    # layer of deep.width units (= width, as the other methods; width_large is the UCI chapter's), Adam lr 0.1,
    # 40 epochs of batches of 100, eps = 0.01 of each input's range. The same in both profiles.
    deep: DeepEnsembleConfig = DeepEnsembleConfig()
    ece_bins: int = 10

    @classmethod
    def quick(cls) -> ClassificationConfig:
        return cls(n_splits=3)

    @classmethod
    def paper(cls) -> ClassificationConfig:
        nuts = NUTSConfig(chains=10, warmup=1000, draws=200, max_tree_depth=10, target_accept=0.9)
        return cls(nuts=nuts, n_splits=10, real_particles=200, mcd=dataclasses.replace(cls().mcd, samples=10_000))
