"""The appendix's classification figure, measured against NUTS, and real datasets with calibration.

The experiment in one place: its configuration (:mod:`.config`), its run (:mod:`.experiment`), its
figures (:mod:`.figures`) and its verdicts and tables (:mod:`.verdicts`).
"""

from __future__ import annotations

from . import figures, verdicts
from .experiment import (
    NAME, DESCRIPTION, ARTEFACTS, Config, METHODS, METHOD_LABELS, Summary, run, agreement, reference_noise,
    sample_noise, rule_statistics,
)

__all__ = ["NAME", "DESCRIPTION", "ARTEFACTS", "Config", "METHODS", "METHOD_LABELS", "Summary", "run", "agreement",
           "reference_noise", "sample_noise", "rule_statistics", "figures", "verdicts"]
