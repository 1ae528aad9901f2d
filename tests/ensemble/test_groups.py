"""Particles stepped in groups chosen by the working set (bootens_core.ensemble.groups)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bootens_core import ensemble, models
from bootens_core.ensemble import groups

MiB = 2**20


def test_cpu_caches_reads_the_data_and_unified_caches(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "512K"),
                                             (3, "Unified", "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert groups.cpu_caches(tmp_path) == {1: 32 * 1024, 2: 512 * 1024, 3: 32 * MiB}
    assert groups.cpu_caches(tmp_path / "absent") == {}


def test_choose_particle_batch_follows_the_working_set():
    cache = 32 * MiB
    # every particle fits the cache: all at once
    assert groups.choose_particle_batch(200, 50e3, platform="cpu", cache_bytes=cache) is None
    # 0.88 MB a particle (the 1-layer network of Boston's shape): half the cache holds 19; 10 divides 200
    assert groups.choose_particle_batch(200, 0.88e6, platform="cpu", cache_bytes=cache) == 10
    # 0.5 MB: 33 fit half the cache; 25 is the largest divisor of 200 from 16 to 33
    assert groups.choose_particle_batch(200, 0.5e6, platform="cpu", cache_bytes=cache) == 25
    # no divisor in range (a prime k): the largest group that fits
    assert groups.choose_particle_batch(199, 0.5e6, platform="cpu", cache_bytes=cache) == 33
    # a particle larger than the cache: still groups of MIN_GROUP, never one particle at a time
    assert groups.choose_particle_batch(200, 40e6, platform="cpu", cache_bytes=cache) == groups.MIN_GROUP
    # unknown cache: all at once
    assert groups.choose_particle_batch(200, 0.88e6, platform="cpu", cache_bytes=None) is None
    # accelerators: all at once unless memory says otherwise
    assert groups.choose_particle_batch(1000, 1e6, platform="gpu", memory_bytes=80 * 2**30) is None
    assert groups.choose_particle_batch(1000, 1e6, platform="gpu", memory_bytes=400e6) == 200
    with pytest.raises(ValueError, match="at least one particle"):
        groups.choose_particle_batch(0, 1.0, platform="cpu", cache_bytes=cache)


def _problem(n=64, d=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    return x, np.sin(x[:, 0])


def test_particle_step_bytes_counts_per_particle_arrays_and_shared_data_once():
    opt = ensemble.optimizer("adam", 1e-2)

    def per(d, k):
        x, y = _problem(n=300, d=d)
        model = models.mlp(d, (20,), "relu")
        st = ensemble.init(jax.random.key(0), model, jnp.asarray(y, jnp.float32), 0.1, k, opt)
        return ensemble.particle_step_bytes(model, st, jnp.asarray(x, jnp.float32), jnp.float32(0.1))

    assert per(7, 3) == per(7, 30)  # a property of one particle, not of the ensemble
    # at least the hidden activations and their gradient (n x 20 each, float32)
    assert per(7, 3) >= 2 * 300 * 20 * 4
    # the inputs are shared: 63 more input columns add their first-layer weights to a particle, far less
    # than the 300 x 63 floats of the inputs themselves
    assert per(70, 3) - per(7, 3) < 300 * 63 * 4
    # the linear model: its features (64 x 512, shared by every particle) are not a particle's bytes
    omega = np.linspace(0.1, 3.0, 512)
    lin = models.given_features(models.trig_features(omega))
    phi = models.trig_features(omega).features(jnp.linspace(-2.0, 2.0, 64))
    st = ensemble.init(jax.random.key(0), lin, jnp.zeros(64), 0.1, 4, opt)
    assert ensemble.particle_step_bytes(lin, st, phi, jnp.asarray(0.1)) < phi.size * phi.dtype.itemsize


@pytest.mark.parametrize(("layers", "opt"), [
    (1, ensemble.optimizer("adam", 1e-2)), (4, ensemble.optimizer("adam", 1e-2)),
    (1, ensemble.optimizer("lbfgs", 0.5, memory_size=10, linesearch="zoom"))], ids=["1-adam", "4-adam", "1-lbfgs"])
def test_the_chosen_groups_give_the_particles_of_all_at_once_to_rounding(monkeypatch, layers, opt):
    # A UCI network of Boston's shape in float32 (the UCI profiles' dtype), 40 particles, a cache made small
    # enough that the default groups them 10 at a time. Not bit for bit: XLA:CPU picks a product's kernel
    # (and so the order of its sums) by the product's size, and vmap folds the particles into the width of the
    # products with the shared inputs (bootens_core.ensemble.groups). Measured: at most one float32 ulp apart
    # after 5 steps, in a few percent of the weights; allowed here: 4 ulps of the largest weight.
    if jax.devices()[0].platform != "cpu":
        pytest.skip("the group size is chosen by the cache on CPUs only")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((455, 13))
    y = np.sin(x[:, 0])
    model = models.mlp(13, (50,) * layers, "relu")
    monkeypatch.setattr(groups, "_CHOSEN", {})
    monkeypatch.setattr(groups, "cpu_caches", lambda: {3: 4 * MiB})
    kw = {"noise_var": 0.05, "n_particles": 40, "opt": opt, "steps": 5, "dtype": jnp.float32}
    state = ensemble.init(jax.random.key(3), model, jnp.asarray(y, jnp.float32), jnp.float32(0.05), 40, opt)
    assert ensemble.auto_particle_batch(model, opt, state, jnp.asarray(x, jnp.float32), jnp.float32(0.05)) == 10
    auto = ensemble.train(jax.random.key(3), model, x, y, **kw)
    whole = ensemble.train(jax.random.key(3), model, x, y, particle_batch=None, **kw)
    eps = float(jnp.finfo(jnp.float32).eps)
    for a, b in zip(jax.tree.leaves(auto.params), jax.tree.leaves(whole.params), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 4 * eps * max(np.max(np.abs(b)), 1.0)


def test_a_forced_particle_batch_overrides_the_working_set_only_inside_its_block(monkeypatch):
    # The cache is made small enough that the working set asks for groups of 10 of 40 particles; inside
    # forced_particle_batch the forced size is returned (None: all at once; a size >= k: all at once), and
    # the choice by the working set comes back after the block, also after an error inside it.
    x = jnp.zeros((455, 13), jnp.float32)
    model = models.mlp(13, (50,), "relu")
    opt = ensemble.optimizer("adam", 1e-3)
    state = ensemble.init(jax.random.key(0), model, jnp.zeros(455, jnp.float32), jnp.float32(0.05), 40, opt)
    monkeypatch.setattr(groups, "_CHOSEN", {})
    monkeypatch.setattr(groups, "cpu_caches", lambda: {3: 4 * MiB})
    platform = jax.devices()[0].platform

    def auto():
        return ensemble.auto_particle_batch(model, opt, state, x, jnp.float32(0.05))

    chosen = auto()
    if platform == "cpu":
        assert chosen == 10
    with ensemble.forced_particle_batch(None):
        assert auto() is None
    with ensemble.forced_particle_batch(8):
        assert auto() == 8
    with ensemble.forced_particle_batch(40):
        assert auto() is None
    with pytest.raises(RuntimeError, match="inside"), ensemble.forced_particle_batch(None):
        raise RuntimeError("inside")
    assert auto() == chosen
    with ensemble.recorded_particle_batches() as seen:
        auto()
        with ensemble.forced_particle_batch(None):
            auto()
    auto()  # outside the block: not recorded
    assert seen == [(40, chosen), (40, None)]
    for bad in (0, -3, 2.5, True, "auto"):
        with pytest.raises(ValueError, match="forced particle batch"), ensemble.forced_particle_batch(bad):
            pass
