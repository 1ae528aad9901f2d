"""Input validation shared by the ensemble, the samplers and the baselines (:mod:`bootens_core.checks`)."""

from __future__ import annotations

import numpy as np
import pytest

from bootens_core import checks, ensemble, models


@pytest.mark.parametrize(
    "x, y, noise_var, match",
    [
        ([0.0, np.nan, 1.0], [1.0, 2.0, 3.0], 0.1, r"x contains 1 NaN/Inf value\(s\) \(rows \[1\]"),
        ([0.0, 1.0, 2.0], [1.0, np.inf, np.nan], 0.1, r"y contains 2 NaN/Inf"),
        ([0.0, 1.0, 2.0], [1.0, 2.0], 0.1, "x has 3 rows but y has 2 labels"),
        ([0.0, 1.0], [[1.0], [2.0]], 0.1, r"labels y must be a vector of shape \(n,\)"),
        (np.zeros((2, 2, 2)), [1.0, 2.0], 0.1, r"inputs x must have shape"),
        ([], [], 0.1, "no training data"),
        (["a", "b"], [1.0, 2.0], 0.1, "x must be numeric"),
        ([0.0, 1.0], [1.0, 2.0], 0.0, "noise_var must be positive"),
        ([0.0, 1.0], [1.0, 2.0], -1.0, "noise_var must be positive"),
        ([0.0, 1.0], [1.0, 2.0], [0.1, np.nan], "noise_var must be positive and finite"),
        ([0.0, 1.0], [1.0, 2.0], [0.1, 0.2, 0.3], r"noise_var must be a scalar or have shape \(2,\)"),
    ],
)
def test_check_data_names_the_problem(x, y, noise_var, match):
    with pytest.raises(ValueError, match=match):
        checks.check_data(x, y, noise_var)


def test_check_data_accepts_good_data():
    x, y = checks.check_data(np.ones((3, 2)), [1, 2, 3], np.array([0.1, 0.2, 0.3]))
    assert x.shape == (3, 2) and y.shape == (3,)


def test_model_outputs_from_shapes_alone():
    assert checks.model_outputs(models.mlp(2, (3,)), np.zeros((5, 2))) is None
    assert checks.model_outputs(models.mlp(2, (3,), out_dim=4), np.zeros((5, 2))) == 4


def test_the_ensemble_reexports_the_checks():
    assert ensemble.check_data is checks.check_data
    assert ensemble.DivergedParticlesError is checks.DivergedParticlesError


def test_inputs_with_the_wrong_number_of_columns_get_one_clear_error():
    import jax

    from bootens_core import ensemble, models

    model = models.mlp(3, (5,), "relu")
    x, y = np.zeros((8, 4)), np.zeros(8)  # 4 columns for a model of 3 inputs
    with pytest.raises(ValueError, match=r"cannot take inputs x of shape \(8, 4\) \(does x have as many columns"):
        ensemble.train(jax.random.key(0), model, x, y, noise_var=0.1, n_particles=2, steps=1,
                       opt=ensemble.optimizer("adam", 0.01))


@pytest.mark.parametrize("observed, match", [
    (np.ones(4, bool), r"shape \(5,\)"),
    (np.ones((5, 1), bool), r"shape \(5,\)"),
    (np.array([0, 1, 2, 1, 1]), "booleans"),
    (np.array(["a"] * 5), "booleans"),
    (np.zeros(5, bool), "no row"),
])
def test_a_bad_row_mask_is_named(observed, match):
    with pytest.raises(ValueError, match=match):
        checks.check_observed(observed, 5)


def test_a_row_mask_of_zeros_and_ones_is_booleans():
    assert checks.check_observed(np.array([1, 0, 1, 1, 0]), 5).tolist() == [True, False, True, True, False]
