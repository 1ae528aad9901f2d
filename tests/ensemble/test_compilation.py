"""Compiled programs are cached by what decides them (signatures, shapes, static settings), not by object
identity: equal models and optimizers built anew reuse the compilation; a different architecture does not."""

from __future__ import annotations

import jax
import numpy as np

from bootens_core import ensemble, models
from bootens_core.driver import CompileCounter

X = np.linspace(-1, 1, 12).reshape(6, 2)
Y = np.sin(X[:, 0])


def _fit(width: int, lr: float = 0.01) -> ensemble.EnsembleResult:
    model = models.mlp(2, (width,))  # a new model object (and apply closure) every call
    opt = ensemble.optimizer("adam", lr)  # a new optax transformation every call
    return ensemble.train(jax.random.key(0), model, X, Y, noise_var=0.1, n_particles=4, opt=opt, steps=3)


def test_equal_models_built_anew_compile_nothing():
    first = _fit(5)
    with CompileCounter() as again:
        second = _fit(5)
    assert again.compiles == 0
    np.testing.assert_array_equal(np.asarray(first.loss), np.asarray(second.loss))


def test_another_architecture_compiles():
    _fit(5)
    with CompileCounter() as other:
        _fit(6)
    assert other.compiles > 0


def test_program_keys():
    a, b = models.mlp(2, (5,)), models.mlp(2, (5,))
    assert a.apply is not b.apply and models.program_key(a) == models.program_key(b)
    assert models.program_key(a) != models.program_key(models.mlp(2, (5,), weight_var=2.0))
    assert models.program_key(a) != models.program_key(models.mlp(2, (5,), activation="tanh"))
    omega = np.array([1.0, 2.0])
    assert models.program_key(models.trig_features(omega)) == models.program_key(models.trig_features(omega.copy()))
    assert models.program_key(models.trig_features(omega)) != models.program_key(models.trig_features(omega + 1))
    own = models.Model(lambda p, x: x @ p["w"], {"w": (2,)}, {"w": 1.0})  # no signature: the function names it
    assert models.program_key(own) == models.program_key(own._replace(name="renamed"))
    assert models.program_key(own) != models.program_key(own._replace(apply=lambda p, x: x @ p["w"]))
    o1, o2 = ensemble.optimizer("lbfgs", 1.0, linesearch="zoom"), ensemble.optimizer("lbfgs", 1.0, linesearch="zoom")
    assert o1.tx is not o2.tx and o1.program_key() == o2.program_key()
    assert o1.program_key() != ensemble.optimizer("lbfgs", 0.5, linesearch="zoom").program_key()
