"""Real classification datasets that ship inside scikit-learn (nothing is downloaded), with seeded splits.

Split ``s`` of a dataset is stratified: within every class the rows are permuted by
``numpy.random.default_rng([seed, s])`` and the first ``round(test_fraction * n_c)`` of them go to the test
set. Inputs are standardised with the training rows' mean and standard deviation (1 for a constant column).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..extras import install_hint

__all__ = ["DATASETS", "ClassificationSplit", "load", "split"]

#: The datasets by name, each with its scikit-learn loader and a description.
DATASETS: dict[str, tuple[str, str]] = {
    "breast_cancer": ("load_breast_cancer", "Wisconsin diagnostic breast cancer: 569 rows, 30 inputs, 2 classes"),
    "wine": ("load_wine", "Wine recognition: 178 rows, 13 inputs, 3 classes"),
}


class ClassificationSplit(NamedTuple):
    """One train/test split, inputs standardised with training statistics."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    description: str


def load(name: str) -> tuple[np.ndarray, np.ndarray, str]:
    """``(x, labels, description)`` of a dataset in :data:`DATASETS` (float64 inputs, integer labels)."""
    if name not in DATASETS:
        raise ValueError(f"unknown classification dataset {name!r}: choose one of {', '.join(sorted(DATASETS))}")
    try:
        from sklearn import datasets
    except ImportError as exc:  # pragma: no cover - the `data` extra installs it
        raise ImportError("the real classification datasets need scikit-learn: "
                          + install_hint("data", ["scikit-learn"])) from exc
    loader, desc = DATASETS[name]
    bunch = getattr(datasets, loader)()
    return np.asarray(bunch.data, np.float64), np.asarray(bunch.target, np.int64), desc


def split(name: str, index: int, *, seed: int = 0, test_fraction: float = 0.2) -> ClassificationSplit:
    """Split ``index`` of dataset ``name`` (module docstring)."""
    if not 0 < float(test_fraction) < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    if int(index) < 0:
        raise ValueError(f"split index must be non-negative, got {index}")
    x, y, desc = load(name)
    rng = np.random.default_rng([int(seed), int(index)])
    test = np.zeros(y.size, bool)
    for c in np.unique(y):
        rows = rng.permutation(np.nonzero(y == c)[0])
        test[rows[: int(round(test_fraction * rows.size))]] = True
    x_tr, x_te = x[~test], x[test]
    mu, sd = x_tr.mean(0), x_tr.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    return ClassificationSplit(
        (x_tr - mu) / sd, y[~test], (x_te - mu) / sd, y[test], int(y.max()) + 1,
        f"{desc}; split {index}: {int((~test).sum())} train / {int(test.sum())} test rows (stratified)",
    )
