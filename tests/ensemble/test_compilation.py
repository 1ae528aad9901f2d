"""Compiled programs are cached by what decides them (signatures, shapes, static settings), not by object
identity: equal models and optimizers built anew reuse the compilation; a different architecture does not."""

from __future__ import annotations

import functools

import jax
import numpy as np
import optax
import pytest

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
    # The learning rate is data in the optimizer state, not part of the program...
    assert o1.program_key() == ensemble.optimizer("lbfgs", 0.5, linesearch="zoom").program_key()
    assert o1.program_key() != ensemble.optimizer("lbfgs", 1.0).program_key()
    assert o1.program_key() != ensemble.optimizer("lbfgs", 1.0, linesearch="zoom", memory_size=5).program_key()
    # ...except for torch-lbfgs, which compiles it in.
    t1 = ensemble.optimizer("torch-lbfgs", 1.0)
    assert t1.program_key() == ensemble.optimizer("torch-lbfgs", 1.0).program_key()
    assert t1.program_key() != ensemble.optimizer("torch-lbfgs", 0.5).program_key()


@pytest.mark.parametrize("name, kwargs", [("sgd", {}), ("adagrad", {}), ("adam", {}), ("lbfgs", {}),
                                          ("lbfgs", {"linesearch": "zoom"})])
def test_learning_rate_is_data(name, kwargs):
    """A second learning rate reuses the first one's program and takes its own steps: the same particles as
    optax's own transformation at that rate, with the rate written into the program."""
    by_name = {"sgd": optax.sgd, "adagrad": optax.adagrad, "adam": optax.adam}
    x, y = X, Y

    def fit(opt):
        model = models.mlp(2, (5,))
        return ensemble.train(jax.random.key(1), model, x, y, noise_var=0.1, n_particles=4, opt=opt, steps=6)

    fit(ensemble.optimizer(name, 0.01, **kwargs))
    with CompileCounter() as again:
        second = fit(ensemble.optimizer(name, 0.003, **kwargs))
    assert again.compiles == 0
    if name == "lbfgs":
        tx = optax.lbfgs(0.003, linesearch=None) if not kwargs else optax.lbfgs(0.003)
    else:
        tx = by_name[name](0.003)
    opt = ensemble.optimizer(name, 0.003, **kwargs)
    reference = fit(ensemble.Optimizer(tx, opt.needs_value, "optax's own, rate compiled in"))
    for a, b in zip(jax.tree.leaves(second.params), jax.tree.leaves(reference.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)
    first = fit(ensemble.optimizer(name, 0.01, **kwargs))
    assert not np.allclose(np.asarray(jax.tree.leaves(first.params)[0]), np.asarray(jax.tree.leaves(second.params)[0]))


def test_learning_rate_set_between_steps():
    """``optax.tree.set`` changes the rate in the state (one per particle, even) with no new compilation."""
    model = models.mlp(2, (5,))
    opt = ensemble.optimizer("sgd", 0.01)
    step = jax.jit(functools.partial(ensemble.step, model=model, opt=opt, x=jax.numpy.asarray(X), noise_var=0.1))
    state = ensemble.init(jax.random.key(2), model, jax.numpy.asarray(Y), 0.1, 3, opt)
    state, _ = step(state)
    rates = jax.numpy.asarray([0.0, 0.01, 0.02])
    frozen = state._replace(opt_state=optax.tree.set(state.opt_state, learning_rate=rates))
    with CompileCounter() as again:
        moved, _ = step(frozen)
    assert again.compiles == 0
    w0, w1 = jax.tree.leaves(frozen.params)[0], jax.tree.leaves(moved.params)[0]
    np.testing.assert_array_equal(np.asarray(w1[0]), np.asarray(w0[0]))  # rate 0: the particle stays
    # Gradient ascent moves each particle by its rate times its gradient: rate 1 gives the gradients.
    unit, _ = step(state._replace(opt_state=optax.tree.set(state.opt_state, learning_rate=jax.numpy.ones(3))))
    grads = np.asarray(jax.tree.leaves(unit.params)[0] - w0)
    assert np.abs(grads).max() > 0
    np.testing.assert_allclose(np.asarray(w1 - w0), np.asarray(rates).reshape((-1,) + (1,) * (grads.ndim - 1)) * grads, rtol=1e-9, atol=1e-15)
