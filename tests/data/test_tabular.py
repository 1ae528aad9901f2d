"""bootens_core.data.tabular: stratified, seeded, disjoint splits standardised with training statistics."""

from __future__ import annotations

import numpy as np
import pytest

from bootens_core.data import tabular


@pytest.mark.parametrize("name", sorted(tabular.DATASETS))
def test_split_is_stratified_disjoint_and_standardised(name):
    x, y, _ = tabular.load(name)
    s = tabular.split(name, 1, seed=0, test_fraction=0.2)
    assert s.x_train.shape[0] + s.x_test.shape[0] == x.shape[0]
    assert s.n_classes == int(y.max()) + 1
    for c in range(s.n_classes):
        n_c = int(np.sum(y == c))
        assert int(np.sum(s.y_test == c)) == round(0.2 * n_c)
    np.testing.assert_allclose(s.x_train.mean(0), 0, atol=1e-10)
    np.testing.assert_allclose(s.x_train.std(0), 1, atol=1e-10)
    # standardisation is one affine map per column: train and test together have the data's correlations
    both = np.concatenate([s.x_train, s.x_test])
    np.testing.assert_allclose(np.corrcoef(both.T), np.corrcoef(x.T), atol=1e-10)


def test_splits_are_seeded_and_differ():
    a, b = tabular.split("wine", 0), tabular.split("wine", 0)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    c = tabular.split("wine", 1)
    assert not np.array_equal(a.y_test, c.y_test) or not np.allclose(a.x_test, c.x_test)


def test_unknown_dataset_and_bad_arguments():
    with pytest.raises(ValueError, match="unknown classification dataset 'iris'"):
        tabular.split("iris", 0)
    with pytest.raises(ValueError, match="test_fraction"):
        tabular.split("wine", 0, test_fraction=1.5)
    with pytest.raises(ValueError, match="split index"):
        tabular.split("wine", -1)
