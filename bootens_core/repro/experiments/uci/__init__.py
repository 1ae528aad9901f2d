"""Tables 1-3: the UCI regression benchmark, ensembles of the paper beside GP baselines, against the paper.

The experiment in one place: its configuration (:mod:`.config`), its run (:mod:`.experiment`), its
figures (:mod:`.figures`) and its verdicts and tables (:mod:`.verdicts`).
"""

from __future__ import annotations

from . import figures, verdicts
from .experiment import (
    NAME, DESCRIPTION, ARTEFACTS, Config, run, store_dir, compute_cell, compute_cells, cells, expand_methods, method,
    paper_reference, LEVEL, MIN_SPLITS, EQUIVALENCE_SDS, EQUIVALENCE_FLOOR, EQUIVALENCE_VERDICTS, METRICS,
    ENSEMBLE_IDS, BASELINE_IDS, PRACTICE_IDS, compare_with_paper, holm, testable_pvalues,
    method_id, paired, paired_comparisons, ranking, comparative_claim, published_reference, summarise,
    restate, paper_scale_summary, result_cells, cells_csv, lbfgs_check, sghmc_step_study, deep_lr_check,
    from_cells,
    PAPER_METHODS, PRIORITY_METHODS, PRIORITY_DATASETS, TRAIN_SHAPES, GP_SKIPPED, priority, cost_units,
    grid_batch, grid_batches, ensemble_optimizer, gp_available, reference_times, PendingRun, run_pending,
    FoldReport, fold, cell_devices, cell_of, lbfgs_label, lbfgs_variant_cells, settings, record_cells,
    recorded_cells, pack_cells, repeated_cells, cell_device,
)

__all__ = [
    "NAME", "DESCRIPTION", "ARTEFACTS", "Config", "run", "store_dir", "compute_cell", "compute_cells", "cells",
    "expand_methods", "method", "paper_reference", "LEVEL", "MIN_SPLITS", "EQUIVALENCE_SDS",
    "EQUIVALENCE_FLOOR", "EQUIVALENCE_VERDICTS", "METRICS", "ENSEMBLE_IDS",
    "BASELINE_IDS", "PRACTICE_IDS", "compare_with_paper", "holm", "testable_pvalues", "method_id", "paired",
    "paired_comparisons",
    "ranking",
    "comparative_claim", "published_reference", "summarise", "restate", "paper_scale_summary",
    "result_cells", "cells_csv", "lbfgs_check", "sghmc_step_study", "deep_lr_check", "from_cells",
    "PAPER_METHODS",
    "PRIORITY_METHODS", "PRIORITY_DATASETS", "TRAIN_SHAPES", "GP_SKIPPED", "priority", "cost_units",
    "grid_batch", "grid_batches", "ensemble_optimizer", "gp_available", "reference_times", "PendingRun",
    "run_pending", "FoldReport", "fold", "cell_devices", "cell_of", "lbfgs_label", "lbfgs_variant_cells",
    "settings", "record_cells", "recorded_cells", "pack_cells", "repeated_cells", "cell_device",
    "figures", "verdicts",
]
