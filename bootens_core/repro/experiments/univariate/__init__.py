"""Figure 1: 200 particles of a one-weight linear-Gaussian model converge to the exact posterior.

The experiment in one place: its configuration (:mod:`.config`), its run and typed summary
(:mod:`.experiment`), its figure (:mod:`.figures`) and its verdict (:mod:`.verdicts`).
"""

from __future__ import annotations

from . import figures, verdicts
from .experiment import ARTEFACTS, DESCRIPTION, NAME, Config, Summary, run

__all__ = ["NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run", "figures", "verdicts"]
