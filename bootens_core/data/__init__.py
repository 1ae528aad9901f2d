"""Datasets: the synthetic data of each figure (:mod:`.synthetic`); the UCI loader comes with the UCI chapter."""

from . import synthetic

__all__ = ["synthetic"]
