"""The configuration of the theory experiment (see :mod:`.experiment`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TheoryConfig"]


@dataclass(frozen=True)
class TheoryConfig:
    """Theorems 1-2 and Lemma 1 measured along Algorithm 1 (plain gradient ascent) on four settings.

    ``linear``: trigonometric features with an exact Gaussian population law; ``relu`` / ``tanh``: small
    MLPs 1-16-16-1 with weights N(0, 2/fan_in) (exact Hessian traces; Hutchinson is shown beside them); ``unperturbed``: the linear model with every
    particle climbing ``log p``. None of these settings is in the paper, which states the theorems only.
    """

    seed: int = 0
    # Linear model.
    lin_features: int = 12
    lin_lengthscale: float = 1.6
    lin_data: int = 6
    lin_particles: int = 4000
    lin_step_fraction: float = 0.5  # h = fraction / lambda_max
    lin_steps: int = 4000
    # MLPs.
    net_hidden: tuple[int, ...] = (16, 16)
    net_data: int = 24
    net_particles: int = 200
    # Weights N(0, net_weight_var / fan_in) (still a diagonal Gaussian prior): with N(0, 1) weights plain
    # gradient ascent diverged for some ReLU particles at every step size tried down to 5e-5.
    net_weight_var: float = 2.0
    net_step_size: float = 1e-4
    net_steps: int = 20_000
    n_probes: int = 64
    lemma_perturbations: int = 4000
    noise_var: float = 0.1
    prior_var: float = 1.0
    n_records: int = 40

    @classmethod
    def quick(cls) -> TheoryConfig:
        return cls()

    @classmethod
    def paper(cls) -> TheoryConfig:
        return cls()
