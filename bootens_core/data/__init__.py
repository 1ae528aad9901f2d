"""Datasets: the synthetic data of each figure (:mod:`.synthetic`) and the UCI benchmark (:mod:`.uci`)."""

from . import synthetic, uci

__all__ = ["synthetic", "uci"]
