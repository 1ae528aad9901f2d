"""The particle axis split over devices (``ensemble.train(..., shard=...)``) gives the particles of the
unsharded run.

Each check runs in a fresh Python process, because the number of host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``) must be set before JAX is imported; this test
session's JAX is already initialised with one device.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Trains the same ensemble unsharded and sharded over the 4 host devices, for k divisible by 4 (8) and not (6,
# padded), with snapshots, and prints the largest difference of every output, the devices used and whether
# the compiled step's particle axis is split (one shard of k/4 particles per device).
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)  # float64, as in the test session
    from jax.sharding import NamedSharding, PartitionSpec as P
    from bootens_core import ensemble, models

    if sys.argv[1] == "distributed":
        jax.distributed.initialize(coordinator_address=sys.argv[2], num_processes=1, process_id=0)
    model = models.mlp(3, (8, 8))
    x = jax.random.normal(jax.random.key(1), (20, 3))
    y = jnp.sin(x[:, 0])
    opt = ensemble.optimizer("adam", 0.01)
    out = {"devices": jax.device_count(), "processes": jax.process_count(), "diff": {}}
    for k in (8, 6):
        kw = dict(noise_var=0.1, n_particles=k, opt=opt, steps=25, snapshot_steps=(0, 10, 25))
        a = ensemble.train(jax.random.key(0), model, x, y, **kw)
        b = ensemble.train(jax.random.key(0), model, x, y, shard=True, **kw)
        la = jax.tree.leaves((a.params, a.snapshots, a.loss, a.diverged))
        lb = jax.tree.leaves((b.params, b.snapshots, b.loss, b.diverged))
        assert [np.shape(v) for v in la] == [np.shape(v) for v in lb]
        out["diff"][k] = max(float(np.max(np.abs(np.asarray(u, float) - np.asarray(v, float)))) for u, v in zip(la, lb))
    mesh = ensemble.particle_mesh()
    state = ensemble.init(jax.random.key(0), model, y, 0.1, 8, opt)
    params = ensemble.shard_particles(state.params, mesh)
    out["shards_per_leaf"] = len(jax.tree.leaves(params)[0].addressable_shards)
    out["shard_rows"] = jax.tree.leaves(params)[0].addressable_shards[0].data.shape[0]
    # the public kernel keeps a sharded state sharded: five steps in the user's own jitted scan
    state = ensemble.State(params, *ensemble.shard_particles((state.opt_state, state.perturbation), mesh),
                           ensemble.replicate(state.step, mesh))
    xs, nv = ensemble.replicate((x, jnp.asarray(0.1)), mesh)
    five = jax.jit(lambda s: jax.lax.scan(lambda c, _: (ensemble.step(c, model, opt, xs, nv)[0], None), s, None,
                                          length=5)[0])
    st = five(state)
    leaf = jax.tree.leaves(st.params)[0]
    out["output_split"] = leaf.sharding.is_equivalent_to(NamedSharding(mesh, P("particles")), leaf.ndim)
    print("RESULT " + json.dumps(out))
    """
)


def _run(*args: str) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _check(out: dict) -> None:
    assert out["devices"] == 4
    # Same particles: the per-device programs differ only in the batch size of their matmuls (a few ulps).
    assert out["diff"]["8"] < 1e-10 and out["diff"]["6"] < 1e-10, out["diff"]
    # The particle axis really is split: 4 shards of 2 particles, and the compiled step keeps it split.
    assert out["shards_per_leaf"] == 4 and out["shard_rows"] == 2
    assert out["output_split"] is True


def test_sharded_training_equals_unsharded_on_4_host_devices():
    _check(_run("local"))


def test_sharded_training_after_distributed_initialize():
    """The multi-host path (``jax.distributed.initialize``, global mesh, per-process placement, gather at the
    end) run as a one-process job: what one machine can test of it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _run("distributed", f"127.0.0.1:{port}")
    assert out["processes"] == 1
    _check(out)
