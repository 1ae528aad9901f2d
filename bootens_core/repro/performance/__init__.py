"""The performance chapter in one place: the particle-throughput benchmark (:mod:`.bench`, ``bootens bench``),
one L-BFGS iteration of a paper-scale UCI ensemble split into its parts (:mod:`.iteration`, ``bootens bench
--case uci-dataset``), the profile of where the time of the whole goes (:mod:`.profiling`), their
configurations (:mod:`.config`), figures (:mod:`.figures`) and rules and tables (:mod:`.verdicts`)."""

from __future__ import annotations

from . import bench, figures, iteration, profiling, verdicts
from .config import BenchConfig, ProfileConfig

__all__ = ["bench", "iteration", "profiling", "figures", "verdicts", "BenchConfig", "ProfileConfig"]
