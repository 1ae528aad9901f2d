"""The configuration of the toy-ReLU experiment (see :mod:`.experiment`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import MHConfig

__all__ = ["ToyReluConfig"]


@dataclass(frozen=True)
class ToyReluConfig:
    """Figure 4: the toy network ``f(x) = ReLU(w1 x) + ReLU(w2 x)`` (Appendix "Toy ReLU network").

    Paper: 24 synthetic points, prior N(0, 1) per weight, likelihood variance 0.05; MH with a N(0, 0.5)
    proposal, 10 restarts, burn-in 10000, one sample every 5000 (200 samples); 200 particles, 800 steps of
    Algorithm 1 with h = 0.05. The data are ours (the paper does not publish them): inputs on [-0.4, 0.4], where
    plain gradient ascent with h = 0.05 is stable (h times the largest curvature is about 1.8 < 2); on a wider
    input range h = 0.05 diverges. Everything is cheap, so both profiles run the paper's scale.

    Beyond the paper, the KL curve is measured with an estimator whose bias does not move with the particles'
    spread: a histogram of ``kl_particles`` particles on fixed bins against the exact posterior mass of each
    bin, at the paper's step and at ``small_step_size`` for the same time horizon, in ``kl_repeats``
    independent ensembles (their spread is the Monte-Carlo noise).
    """

    seed: int = 0
    n_data: int = 24
    x_half_width: float = 0.4
    w_true: tuple[float, float] = (2.0, -1.5)
    noise_var: float = 0.05
    prior_var: float = 1.0
    # Metropolis-Hastings reference (the paper's): 10 chains x 20 draws = 200 samples.
    mh: MHConfig = MHConfig(proposal_var=0.5, chains=10, burn_in=10_000, thin=5_000, draws=20)
    # Algorithm 1 (plain gradient ascent).
    n_particles: int = 200
    step_size: float = 0.05
    steps: int = 800
    stages: tuple[int, ...] = (0, 800)
    # The paper's estimator: KL(q_t || p) by KDE and numerical integration on a grid, every ``kl_every`` steps.
    kl_every: int = 4
    grid_half_width: float = 4.0
    grid_points: int = 161
    x_grid_points: int = 101
    # The histogram estimator: bins of ``bin_width`` on [-bin_half_width, bin_half_width]^2 (0 is a bin edge),
    # the exact posterior mass of each bin by ``bin_nodes`` x ``bin_nodes`` Gauss-Legendre nodes; the same
    # estimate with half and twice the width as a check of the binning.
    kl_particles: int = 10_000
    kl_repeats: int = 10
    small_step_size: float = 0.005  # run steps * step_size / small_step_size steps: the same time horizon
    bin_width: float = 0.2
    bin_half_width: float = 6.0
    bin_nodes: int = 8
    # Evaluated at every paper step up to ``kl_dense_steps`` (the same times at the small step), then every
    # ``kl_every`` paper steps. Where h * curvature > 1 a particle overshoots its optimum and the overshoot
    # decays by |1 - h * curvature| per step: the "late" statistics exclude the paper steps until the largest
    # curvature's overshoot has decayed below ``overshoot_tolerance`` of its start (the same time at the small step).
    kl_dense_steps: int = 40
    overshoot_tolerance: float = 1e-3

    @classmethod
    def quick(cls) -> ToyReluConfig:
        return cls()

    @classmethod
    def paper(cls) -> ToyReluConfig:
        return cls(kl_every=1, kl_repeats=20)
