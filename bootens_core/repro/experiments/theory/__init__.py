"""Theorems 1-2 and Lemma 1 measured along Algorithm 1 (plain gradient ascent), in four settings.

The experiment in one place: its configuration (:mod:`.config`), its run (:mod:`.experiment`), its
figures (:mod:`.figures`) and its verdicts and tables (:mod:`.verdicts`).
"""

from __future__ import annotations

from . import figures, verdicts
from .experiment import (
    NAME, DESCRIPTION, ARTEFACTS, Config, Summary, run, SETTINGS, record_steps,
)

__all__ = [
    "NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run", "SETTINGS", "record_steps", "figures", "verdicts",
]
