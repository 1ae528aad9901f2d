"""bootens_core.ensemble.stacked: problems of one shape trained as one program equal train_grid problem by
problem (float64, where rounding cannot hide a difference); the programs' size from XLA's memory analysis."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bootens_core import ensemble, models
from bootens_core.ensemble.stacked import MEMORY_SHARE, problems_per_program, train_stacked


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _problems(n=3, rows=20, d=3):
    xs = [jax.random.normal(jax.random.key(10 + i), (rows, d)) for i in range(n)]
    ys = [jnp.sin(x @ jnp.array([1.0, -0.5, 0.3])) + 0.1 * i for i, x in enumerate(xs)]
    return list(jax.random.split(jax.random.key(2), n)), xs, ys


def test_each_problem_is_its_train_grid_call():
    """Three problems, two sigma^2 blocks each (different per problem), in programs of two problems (the last
    padded): every block's particles, starting particles, replicates and losses are train_grid's."""
    model = models.mlp(3, (6,), "relu")
    opt = ensemble.optimizer("lbfgs", 0.5, linesearch="zoom")
    keys, xs, ys = _problems()
    grids = [[0.01, 0.1], [0.03, 0.3], [0.1, 1.0]]
    got = train_stacked(keys, model, xs, ys, noise_vars=grids, n_particles=5, opt=opt, steps=12, problems=2,
                        dtype=jnp.float64)
    assert len(got) == 3 and all(len(g) == 2 for g in got)
    for p in range(3):
        ref = ensemble.train_grid(keys[p], model, xs[p], ys[p], noise_grid=grids[p], n_particles=5, opt=opt,
                                  steps=12, dtype=jnp.float64, particle_batch=None)
        for mine, theirs in zip(got[p], ref, strict=True):
            for field in ("params", "init_params", "perturbation"):
                pairs = zip(jax.tree.leaves(getattr(mine, field)), jax.tree.leaves(getattr(theirs, field)),
                            strict=True)
                for a, b in pairs:
                    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)
            np.testing.assert_allclose(mine.loss, theirs.loss, rtol=1e-9)
            assert mine.loss.shape == (12, 5) and not mine.diverged.any()


def test_bad_problems_are_named():
    model = models.mlp(3, (4,), "relu")
    opt = ensemble.optimizer("adam", 0.01)
    keys, xs, ys = _problems(2)
    kw = {"n_particles": 2, "opt": opt, "steps": 1}
    with pytest.raises(ValueError, match="equal shapes"):
        train_stacked(keys, model, [xs[0], xs[1][:10]], [ys[0], ys[1][:10]], noise_vars=[[0.1], [0.1]], **kw)
    with pytest.raises(ValueError, match="as many keys, inputs, labels"):
        train_stacked(keys, model, xs, ys, noise_vars=[[0.1]], **kw)
    with pytest.raises(ValueError, match="same non-empty number"):
        train_stacked(keys, model, xs, ys, noise_vars=[[0.1], [0.1, 0.2]], **kw)
    with pytest.raises(ValueError, match="positive and finite"):
        train_stacked(keys, model, xs, ys, noise_vars=[[0.1], [-1.0]], **kw)


def test_problems_per_program_follows_xla_memory_analysis():
    sizes = SimpleNamespace(argument_size_in_bytes=100, output_size_in_bytes=50, temp_size_in_bytes=850)
    compiled = SimpleNamespace(memory_analysis=lambda: sizes)
    gpu = SimpleNamespace(platform="gpu", memory_stats=lambda: {"bytes_limit": 40_000})
    # MEMORY_SHARE of 40 000 bytes over 1000 bytes a problem
    assert problems_per_program(compiled, 90, gpu) == int(MEMORY_SHARE * 40_000 // 1000)
    assert problems_per_program(compiled, 3, gpu) == 3  # never more than there are
    tiny = SimpleNamespace(platform="gpu", memory_stats=lambda: {"bytes_limit": 10})
    assert problems_per_program(compiled, 5, tiny) == 1  # at least one
    cpu = SimpleNamespace(platform="cpu", memory_stats=lambda: None)
    assert problems_per_program(compiled, 7, cpu) == 7  # a CPU: all at once
