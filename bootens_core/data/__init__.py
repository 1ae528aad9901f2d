"""Datasets: the synthetic data of each figure (:mod:`.synthetic`), the UCI benchmark (:mod:`.uci`) and the
classification chapter's real datasets shipped with scikit-learn (:mod:`.tabular`)."""

from . import synthetic, tabular, uci

__all__ = ["synthetic", "tabular", "uci"]
