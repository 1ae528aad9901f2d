"""Figure 1's configuration."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UnivariateConfig"]


@dataclass(frozen=True)
class UnivariateConfig:
    """Figure 1: a one-weight linear-Gaussian model ``y = w x + eps``.

    The paper gives only the particle count (200) for this figure; the data, variances and step size below
    are ours, chosen so that the posterior is clearly narrower than the prior and plain gradient ascent
    (Algorithm 1 as written) converges: the step size times the posterior precision is 0.25 < 2.
    """

    seed: int = 0
    n_data: int = 12
    w_true: float = 0.8
    noise_var: float = 0.5  # sigma^2
    prior_var: float = 1.0  # alpha^2
    n_particles: int = 200
    step_size: float = 0.01  # h of Algorithm 1 (plain gradient ascent)
    steps: int = 200
    stages: tuple[int, ...] = (0, 2, 5, 10, 25, 200)

    @classmethod
    def quick(cls) -> UnivariateConfig:
        return cls()

    @classmethod
    def paper(cls) -> UnivariateConfig:
        return cls()
