"""Using bootstrap ensembles on one's own data: the estimator on scikit-learn's diabetes data, and guidance
measured on it (how many particles, which noise variance and prior, when to stop, stuck particles,
calibration, the plain ensemble beside it).

Its configuration (:mod:`.config`), its run and typed summary (:mod:`.experiment`), its figures
(:mod:`.figures`) and its verdicts and tables (:mod:`.verdicts`).
"""

from __future__ import annotations

from . import figures, verdicts
from .experiment import ARTEFACTS, DESCRIPTION, METHODS, NAME, Config, Summary, run, split_rows

__all__ = ["NAME", "DESCRIPTION", "ARTEFACTS", "METHODS", "Config", "Summary", "run", "split_rows", "figures",
           "verdicts"]
