"""The configuration of the deep-ReLU experiment (see :mod:`.experiment`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...config import MHConfig, NUTSConfig

__all__ = ["DeepReluConfig"]


@dataclass(frozen=True)
class DeepReluConfig:
    """Figure 3: an 8-hidden-layer ReLU network, 50 units per layer (m = 18001), on a synthetic 1-D dataset.

    Paper (Appendix "Regression ReLU network"): prior N(0, I_m), likelihood variance 0.1, MH with a N(0, 0.01)
    proposal, 10 restarts, burn-in 40000, one sample every 20000 (200 samples); 200 particles at several
    stages. The paper names neither the optimiser nor the data. The faithful prior and MH are kept runnable
    (``faithful_*``); the chapter shows why the figure uses the deviation prior ``weight_var / fan_in`` and an
    HMC/NUTS reference.
    """

    seed: int = 0
    n_data: int = 40
    noise_var: float = 0.1
    depth: int = 8
    width: int = 50
    bias_var: float = 1.0
    # Faithful prior N(0, 1) on every weight; deviation: N(0, weight_var / fan_in) on the weights.
    faithful_weight_var: float = 1.0
    weight_var: float = 2.0
    # Faithful MH (paper's proposal) on both priors: acceptance evidence.
    mh: MHConfig = MHConfig(proposal_var=0.01, chains=10, burn_in=1_000, thin=50, draws=20)
    # NUTS reference on the deviation prior; its chains one after another on a CPU (the gradient of the deep
    # network is expensive enough: see samplers.resolve_chain_method).
    nuts: NUTSConfig = NUTSConfig(chains=4, warmup=250, draws=50, max_tree_depth=7, target_accept=0.9,
                                  chain_method="auto")
    # Algorithm 1 (Adam; the paper does not name its optimiser for this figure).
    n_particles: int = 200
    optimizer: str = "adam"
    step_size: float = 1e-3
    steps: int = 2_000
    stages: tuple[int, ...] = (0, 100, 500, 2000)
    # The agreement with the reference is also measured every ``agreement_every`` steps (Figure 3 shows
    # ``stages`` only).
    agreement_every: int = 100
    x_grid_points: int = 121
    x_grid_half_width: float = 3.0

    @classmethod
    def quick(cls) -> DeepReluConfig:
        return cls()

    @classmethod
    def paper(cls) -> DeepReluConfig:
        base = cls()
        return cls(mh=dataclasses.replace(base.mh, burn_in=40_000, thin=20_000),
                   nuts=dataclasses.replace(base.nuts, chains=10, warmup=1000, draws=20, max_tree_depth=10))
