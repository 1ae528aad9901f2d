"""Figure 4: the toy network ``f(x) = ReLU(w1 x) + ReLU(w2 x)``: ensemble vs MH vs the exact posterior.

The experiment in one place: its configuration (:mod:`.config`), its run (:mod:`.experiment`), its
figures (:mod:`.figures`) and its verdicts and tables (:mod:`.verdicts`).
"""

from __future__ import annotations

from . import figures, verdicts
from .experiment import (
    NAME, DESCRIPTION, ARTEFACTS, Config, Summary, run, QUADRANTS, RECORD_KEYS, RECORD_LABELS, STEP_LABELS,
    rhat_null_quantile, Bins, bins, bin_log_posterior, bin_log_gaussian, binned_kl, bin_counts, histogram_kl,
    curvatures, overshoot_steps, same_sign_slopes, curve_statistics,
)

__all__ = [
    "NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run", "QUADRANTS", "RECORD_KEYS", "RECORD_LABELS",
    "STEP_LABELS", "rhat_null_quantile", "Bins", "bins", "bin_log_posterior", "bin_log_gaussian",
    "binned_kl", "bin_counts", "histogram_kl", "curvatures", "overshoot_steps", "same_sign_slopes",
    "curve_statistics", "figures", "verdicts",
]
