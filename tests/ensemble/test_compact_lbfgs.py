"""bootens_core.ensemble.compact_lbfgs: the L-BFGS direction in compact form against optax's two-loop
recursion and against the BFGS recursion written out with dense matrices (float64)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bootens_core import ensemble, models
from bootens_core.ensemble.compact_lbfgs import compact_lbfgs, scale_by_compact_lbfgs


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _loss(p):
    # non-convex, two leaves of different shapes, coupled: pairs of both signs of curvature occur
    a, b = p["a"], p["b"]
    return jnp.sum(jnp.sin(a) * a**2) + 0.01 * jnp.sum((b @ b.T) ** 2) + jnp.sum(a[:3] * b[0, :3])


def _params():
    return {"a": jax.random.normal(jax.random.key(0), (7,)),
            "b": jax.random.normal(jax.random.key(1), (3, 4))}


def _flat(tree):
    return np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)])


def _dense_direction(pairs, g):
    """H g with H from the BFGS recursion over the pairs (oldest first), H_0 = gamma I (optax's gamma),
    pairs with s.y = 0 skipped; at the first iteration (no pair) gamma = min(1, 1/|g|)."""
    n = g.size
    if not pairs:
        return min(1.0, 1.0 / np.linalg.norm(g)) * g
    s_new, y_new = pairs[-1]
    gamma = s_new @ y_new / (y_new @ y_new) if y_new @ y_new > 0 else 1.0
    h = gamma * np.eye(n)
    for s, y in pairs:
        if s @ y == 0:
            continue
        rho = 1.0 / (s @ y)
        v = np.eye(n) - rho * np.outer(y, s)
        h = v.T @ h @ v + rho * np.outer(s, s)
    return h @ g


@pytest.mark.parametrize("memory", [1, 3, 5])
def test_direction_equals_the_two_loop_recursion_and_the_dense_bfgs_product(memory):
    """20 iterations (the ring buffer wraps several times): the compact direction equals optax's two-loop
    and the dense recursion over the last `memory` pairs to float64 rounding."""
    two_loop, compact = optax.scale_by_lbfgs(memory_size=memory), scale_by_compact_lbfgs(memory)
    s_two, s_compact = two_loop.init(_params()), compact.init(_params())
    p, pairs, prev, curvatures = _params(), [], None, []
    for _ in range(20):
        g = jax.grad(_loss)(p)
        if prev is not None:
            pairs.append((_flat(p) - _flat(prev[0]), _flat(g) - _flat(prev[1])))
            curvatures.append(pairs[-1][0] @ pairs[-1][1])
        u_ref, s_two = two_loop.update(g, s_two, p)
        u, s_compact = compact.update(g, s_compact, p)
        want = _dense_direction(pairs[-memory:], _flat(g))
        np.testing.assert_allclose(_flat(u), _flat(u_ref), rtol=1e-9, atol=1e-12 * np.abs(want).max())
        np.testing.assert_allclose(_flat(u), want, rtol=1e-8, atol=1e-11 * np.abs(want).max())
        prev = (p, g)
        p = jax.tree.map(lambda a, d: a - 0.1 * d, p, u)
    assert min(curvatures) < 0 < max(curvatures)  # the problem exercises pairs of negative curvature too


def test_a_pair_of_zero_curvature_is_skipped_as_optax_skips_it():
    """s.y = 0 exactly (optax's weight 0): the pair takes no part, in the recursion or the compact form."""
    tx, ref = scale_by_compact_lbfgs(3), optax.scale_by_lbfgs(memory_size=3)
    p0 = {"w": jnp.array([1.0, 0.0])}
    g0 = {"w": jnp.array([0.0, 1.0])}
    p1 = {"w": jnp.array([2.0, 0.0])}  # s = (1, 0)
    g1 = {"w": jnp.array([0.0, 3.0])}  # y = (0, 2): s.y = 0
    st, st_ref = tx.init(p0), ref.init(p0)
    for p, g in ((p0, g0), (p1, g1)):
        u, st = tx.update(g, st, p)
        u_ref, st_ref = ref.update(g, st_ref, p)
        np.testing.assert_allclose(u["w"], u_ref["w"], rtol=1e-12)
    assert float(st.sy[0, 0]) == 0.0 and np.all(np.isfinite(np.asarray(u["w"])))


def test_under_vmap_each_particle_gets_its_own_direction():
    """The ensembles' use: vmap over particles equals the particles one at a time (and optax's two-loop)."""
    k = 4
    ps = jax.vmap(lambda key: {"a": jax.random.normal(key, (7,)), "b": jax.random.normal(key, (3, 4))})(
        jax.random.split(jax.random.key(3), k))
    tx, ref = scale_by_compact_lbfgs(4), optax.scale_by_lbfgs(memory_size=4)
    st, st_ref = jax.vmap(tx.init)(ps), jax.vmap(ref.init)(ps)
    upd, upd_ref = jax.jit(jax.vmap(tx.update)), jax.jit(jax.vmap(ref.update))
    for _ in range(9):
        g = jax.vmap(jax.grad(_loss))(ps)
        before = st
        u, st = upd(g, st, ps)
        u_ref, st_ref = upd_ref(g, st_ref, ps)
        third = lambda tree: jax.tree.map(lambda a: a[2], tree)  # noqa: E731
        alone, _ = tx.update(third(g), third(before), third(ps))
        for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(u_ref), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)
        for a, b in zip(jax.tree.leaves(third(u)), jax.tree.leaves(alone), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
        ps = jax.tree.map(lambda a, d: a - 0.05 * d, ps, u)


def test_an_ensemble_trains_to_the_same_particles_with_either_direction():
    """float64, 30 L-BFGS iterations with the zoom line search on a small network: ensemble.train with
    the compact direction (the default) and with optax's two-loop recursion give the same particles to
    rounding."""
    model = models.mlp(3, (8,), "tanh")
    x = jax.random.normal(jax.random.key(1), (30, 3))
    y = jnp.sin(2 * x @ jnp.array([1.0, -0.5, 0.3]))
    out = {}
    for direction in ("compact", "two-loop"):
        opt = ensemble.optimizer("lbfgs", 0.5, linesearch="zoom", direction=direction)
        out[direction] = ensemble.train(jax.random.key(2), model, x, y, noise_var=0.05, n_particles=6,
                                        opt=opt, steps=30, dtype=jnp.float64)
    pairs = zip(jax.tree.leaves(out["compact"].params), jax.tree.leaves(out["two-loop"].params), strict=True)
    for a, b in pairs:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8)


def test_compact_lbfgs_is_optax_lbfgs_with_the_compact_direction():
    p = _params()
    for lr, search in ((0.3, None), (None, None)):
        tx = compact_lbfgs(lr, 4, search)
        ref = optax.lbfgs(lr, 4, linesearch=search)
        s, s_ref = tx.init(p), ref.init(p)
        q = p
        for _ in range(6):
            g = jax.grad(_loss)(q)
            u, s = tx.update(g, s, q)
            u_ref, s_ref = ref.update(g, s_ref, q)
            np.testing.assert_allclose(_flat(u), _flat(u_ref), rtol=1e-9, atol=1e-12)
            q = optax.apply_updates(q, u)


def test_bad_memory_size_and_missing_params_are_named():
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="memory_size must be a positive integer"):
            scale_by_compact_lbfgs(bad)
    tx = scale_by_compact_lbfgs(2)
    p = {"w": jnp.ones(2)}
    with pytest.raises(ValueError, match="needs the parameters"):
        tx.update(p, tx.init(p))
    with pytest.raises(ValueError, match="direction"):
        ensemble.optimizer("lbfgs", 0.5, direction="three-loop")
