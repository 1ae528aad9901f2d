"""Figures 2 and 5, Section 4.1: Bayesian linear regression with 1024 trigonometric features.

The experiment in one place: its configuration (:mod:`.config`), its run (:mod:`.experiment`), its
figures (:mod:`.figures`) and its verdicts and tables (:mod:`.verdicts`).
"""

from __future__ import annotations

from . import figures, verdicts
from .experiment import (
    NAME, DESCRIPTION, ARTEFACTS, Config, Summary, run, trig_model, gradient_ascent_at,
)

__all__ = [
    "NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run", "trig_model", "gradient_ascent_at", "figures",
    "verdicts",
]
