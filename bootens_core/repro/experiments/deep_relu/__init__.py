"""Figure 3: 200 particles of an 8-hidden-layer ReLU network (m = 18001) at several stages, against a reference.

The experiment in one place: its configuration (:mod:`.config`), its run (:mod:`.experiment`), its
figures (:mod:`.figures`), its verdicts and tables (:mod:`.verdicts`) and its NUTS reference run resumably
over days (:mod:`.reference`).
"""

from __future__ import annotations

from . import figures, reference, verdicts
from .experiment import (
    NAME, DESCRIPTION, ARTEFACTS, Config, Summary, run, agreement, reference_noise, sample_noise, rule_statistics,
    compare,
)

__all__ = [
    "NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run", "agreement", "reference_noise", "sample_noise",
    "rule_statistics", "compare",
    "figures",
    "reference", "verdicts",
]
