"""bootens_core.ensemble.linesearch: optax's zoom line search batched per branch over the particles."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bootens_core import ensemble, models
from bootens_core.ensemble.linesearch import batched_zoom_linesearch
from bootens_core.perturb import perturbed_log_joint


def _problem(k: int = 12):
    """A tanh network on a small regression: its searches need 1 to several steps, both branches."""
    model = models.mlp(3, (8,), "tanh")
    x = jax.random.normal(jax.random.key(1), (30, 3))
    y = jnp.sin(2 * x @ jnp.array([1.0, -0.5, 0.3]))
    opt = ensemble.optimizer("lbfgs", 0.5, linesearch="zoom")
    state = ensemble.init(jax.random.key(2), model, y, 0.05, k, opt)

    def loss(p, pert, x, noise_var):
        return -perturbed_log_joint(model, p, x, pert, noise_var)

    return model, x, state, loss


def _run(tx, state, x, loss, steps):
    """``steps`` L-BFGS iterations of every particle (vmap over particles); per step: the particles' losses
    and the line search steps each took."""
    vg = jax.vmap(jax.value_and_grad(loss), in_axes=(0, 0, None, None))

    def one(p, o, pe, v, g):
        u, o = tx.update(g, o, p, value=v, grad=g, value_fn=loss, pert=pe, x=x, noise_var=0.05)
        return optax.apply_updates(p, u), o

    def body(c, _):
        p, o = c
        v, g = vg(p, state.perturbation, x, 0.05)
        p, o = jax.vmap(one)(p, o, state.perturbation, v, g)
        return (p, o), (v, optax.tree.get(o, "info").num_linesearch_steps)

    o0 = jax.vmap(tx.init)(state.params)
    (p, _), (v, n) = jax.jit(lambda: jax.lax.scan(body, (state.params, o0), None, length=steps))()
    return p, np.asarray(v), np.asarray(n)


def _lbfgs(linesearch, lr=0.5):
    return optax.chain(optax.scale_by_lbfgs(), optax.scale_by_learning_rate(lr), linesearch)


@pytest.mark.parametrize(("lr", "compact"), [(2.0, None), (5.0, 1), (5.0, 12)])
def test_the_particles_take_optax_s_search_steps(lr, compact):
    """float64, 25 iterations: every particle's line search takes as many steps as under optax's own
    transformation (vmapped: both branches for all), and the particles agree to float rounding, whether the
    particles still searching are gathered a quarter of the ensemble (3 of 12) or one at a time, or never
    (12). The initial step 2 leaves 1 or 2 search steps per particle (a few still searching after the first
    trial); 5 overshoots, so most searches find an interval and zoom into it (2 or 3 steps, both branches)."""
    model, x, state, loss = _problem()
    ref = _run(_lbfgs(optax.scale_by_zoom_linesearch(20, initial_guess_strategy="one"), lr), state, x, loss, 25)
    new = _run(_lbfgs(batched_zoom_linesearch(20, "one", compact=compact), lr), state, x, loss, 25)
    assert len(np.unique(ref[2])) >= 2  # searches of different lengths in one ensemble step
    np.testing.assert_array_equal(new[2], ref[2])
    np.testing.assert_allclose(new[1], ref[1], rtol=1e-10)
    for a, b in zip(jax.tree.leaves(new[0]), jax.tree.leaves(ref[0]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-8, atol=1e-10)


def test_one_particle_is_optax_s_search_exactly():
    """Without vmap the transformation is optax's: the same numbers, bit for bit."""
    model, x, state, loss = _problem(1)
    p0 = jax.tree.map(lambda a: a[0], state.params)
    pert = jax.tree.map(lambda a: a[0], state.perturbation)
    out = {}
    for name, ls in (("optax", optax.scale_by_zoom_linesearch(20, initial_guess_strategy="one")),
                     ("batched", batched_zoom_linesearch())):
        tx = _lbfgs(ls)
        v, g = jax.value_and_grad(loss)(p0, pert, x, 0.05)
        u, _ = jax.jit(functools.partial(tx.update, value_fn=loss))(g, tx.init(p0), p0, value=v, grad=g,
                                                                    pert=pert, x=x, noise_var=0.05)
        out[name] = u
    for a, b in zip(jax.tree.leaves(out["optax"]), jax.tree.leaves(out["batched"]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_settings_and_a_closure_over_unknown_keywords_are_named():
    with pytest.raises(ValueError, match="max_linesearch_steps"):
        batched_zoom_linesearch(0)
    with pytest.raises(ValueError, match="initial_guess_strategy"):
        batched_zoom_linesearch(20, "half")
    with pytest.raises(ValueError, match="compact"):
        batched_zoom_linesearch(compact=0)
    tx = _lbfgs(batched_zoom_linesearch())
    p = {"w": jnp.ones(3)}
    with pytest.raises(TypeError, match="value_fn takes no scale"):
        tx.update(p, tx.init(p), p, value=jnp.asarray(1.0), grad=p, value_fn=lambda q: jnp.sum(q["w"] ** 2),
                  scale=2.0)
