"""ensemble.train_grid: a grid of sigma^2 trained as one batch equals one train call per grid value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bootens_core import ensemble, models


def _problem(n=30, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = np.sin(x[:, 0]) + 0.1 * rng.normal(size=n)
    return x, y


@pytest.mark.parametrize(
    "opt",
    [
        ensemble.optimizer("adam", 1e-2),
        ensemble.optimizer("lbfgs", 0.5, memory_size=10, linesearch="zoom"),
        ensemble.optimizer("torch-lbfgs", 0.5, max_iter=5, history_size=10, line_search_fn="strong_wolfe", max_ls=25),
    ],
    ids=["adam", "lbfgs-zoom", "torch-lbfgs-strong-wolfe"],
)
def test_grid_blocks_equal_separate_calls(opt):
    x, y = _problem()
    model = models.mlp(3, (8,), "relu")
    grid = (1e-3, 1e-2, 1e-1)
    key = jax.random.key(3)
    together = ensemble.train_grid(key, model, x, y, noise_grid=grid, n_particles=4, opt=opt, steps=12,
                                   dtype=jnp.float64)
    assert len(together) == len(grid)
    for nv, res in zip(grid, together, strict=True):
        alone = ensemble.train(key, model, x, y, noise_var=nv, n_particles=4, opt=opt, steps=12, dtype=jnp.float64)
        # Same replicates exactly; the trained particles to float64 rounding (one batch vs one call per value).
        np.testing.assert_array_equal(np.asarray(res.perturbation.y), np.asarray(alone.perturbation.y))
        for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(alone.params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(res.loss, alone.loss, rtol=1e-9)
        assert res.loss.shape == (12, 4) and not res.diverged.any()


def test_unperturbed_grid_blocks_equal_separate_unperturbed_calls():
    # The plain ensemble's grid: neither labels nor prior perturbed, block by block as train with both off.
    x, y = _problem(seed=1)
    model = models.mlp(3, (8,), "relu")
    opt = ensemble.optimizer("lbfgs", 0.5, memory_size=10, linesearch="zoom")
    grid, key = (1e-2, 1e-1), jax.random.key(5)
    off = {"perturb_labels": False, "perturb_prior": False}
    together = ensemble.train_grid(key, model, x, y, noise_grid=grid, n_particles=3, opt=opt, steps=10,
                                   dtype=jnp.float64, **off)
    perturbed = ensemble.train_grid(key, model, x, y, noise_grid=grid, n_particles=3, opt=opt, steps=10,
                                    dtype=jnp.float64)
    for nv, res, pert in zip(grid, together, perturbed, strict=True):
        alone = ensemble.train(key, model, x, y, noise_var=nv, n_particles=3, opt=opt, steps=10, dtype=jnp.float64,
                               **off)
        for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(alone.params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)
        assert not np.allclose(np.asarray(jax.tree.leaves(res.params)[0]), np.asarray(jax.tree.leaves(pert.params)[0]))


def test_grid_values_change_the_fit():
    # A guard that the per-particle noise really reaches the step: blocks of different sigma^2 differ.
    x, y = _problem()
    model = models.mlp(3, (8,), "relu")
    a, b = ensemble.train_grid(jax.random.key(0), model, x, y, noise_grid=(1e-3, 1.0), n_particles=2,
                               opt=ensemble.optimizer("adam", 1e-2), steps=20)
    assert not np.allclose(np.asarray(a.loss), np.asarray(b.loss))


@pytest.mark.parametrize("grid", [(), (0.1, -1.0), (0.1, float("nan")), ((0.1, 0.2),)])
def test_bad_grid_is_one_clear_error(grid):
    x, y = _problem()
    with pytest.raises(ValueError, match="noise_grid"):
        ensemble.train_grid(jax.random.key(0), models.mlp(3, (4,), "relu"), x, y, noise_grid=grid, n_particles=2,
                            opt=ensemble.optimizer("adam", 1e-2), steps=2)


def test_diverged_grid_values_are_named():
    x, y = _problem()
    with pytest.raises(ensemble.DivergedParticlesError, match="sigma\\^2"):
        ensemble.train_grid(jax.random.key(0), models.mlp(3, (8,), "relu"), x, y, noise_grid=(1e-6, 1.0),
                            n_particles=2, opt=ensemble.optimizer("sgd", 1e3), steps=30)


@pytest.mark.parametrize(
    "opt",
    [ensemble.optimizer("adam", 1e-2), ensemble.optimizer("lbfgs", 0.5, memory_size=10, linesearch="zoom")],
    ids=["adam", "lbfgs-zoom"],
)
def test_particle_batches_give_the_same_particles(opt):
    # Stepping the particles in groups (lax.map over groups of 3, the 7th particle alone) is the same
    # computation per particle as one vmap over all 7: equal to float64 rounding, in train and train_grid.
    x, y = _problem()
    model = models.mlp(3, (8,), "relu")
    key = jax.random.key(5)
    kw = dict(n_particles=7, opt=opt, steps=10, dtype=jnp.float64)
    whole = ensemble.train(key, model, x, y, noise_var=0.05, particle_batch=None, **kw)
    grouped = ensemble.train(key, model, x, y, noise_var=0.05, particle_batch=3, **kw)
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(grouped.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(grouped.loss, whole.loss, rtol=1e-9)
    grid_whole = ensemble.train_grid(key, model, x, y, noise_grid=(1e-2, 1e-1), particle_batch=None, **kw)
    grid_grouped = ensemble.train_grid(key, model, x, y, noise_grid=(1e-2, 1e-1), particle_batch=4, **kw)
    for rw, rg in zip(grid_whole, grid_grouped, strict=True):
        np.testing.assert_allclose(rg.loss, rw.loss, rtol=1e-9)
    # A batch larger than the ensemble is one group.
    big = ensemble.train(key, model, x, y, noise_var=0.05, particle_batch=50, **kw)
    np.testing.assert_allclose(big.loss, whole.loss, rtol=1e-9)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_bad_particle_batch_is_one_clear_error(bad):
    x, y = _problem()
    with pytest.raises(ValueError, match="particle_batch must be a positive integer"):
        ensemble.train(jax.random.key(0), models.mlp(3, (4,), "relu"), x, y, noise_var=0.1, n_particles=2,
                       opt=ensemble.optimizer("adam", 1e-2), steps=2, particle_batch=bad)


def test_the_default_steps_a_small_ensemble_at_once():
    # The default ("auto") groups particles only when their working set leaves the cache: 12 particles of a
    # tiny network are one vmap, the run with None, exactly.
    x, y = _problem()
    kw = dict(noise_var=0.05, n_particles=12, opt=ensemble.optimizer("adam", 1e-2), steps=5, dtype=jnp.float64)
    model = models.mlp(3, (4,), "relu")
    default = ensemble.train(jax.random.key(2), model, x, y, **kw)
    whole = ensemble.train(jax.random.key(2), model, x, y, particle_batch=None, **kw)
    np.testing.assert_array_equal(default.loss, whole.loss)
    for bad in ("Auto", "fast"):
        with pytest.raises(ValueError, match="positive integer, None or 'auto'"):
            ensemble.train(jax.random.key(2), model, x, y, particle_batch=bad, **kw)
