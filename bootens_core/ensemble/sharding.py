"""The particle axis over devices: a one-axis mesh ``("particles",)`` (:func:`particle_mesh`), placing
particles split over it (:func:`shard_particles`) or data whole on every device (:func:`replicate`), and
gathering them back to the host (:func:`gather`), on one host or several."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["particle_mesh", "shard_particles", "replicate", "gather", "pad_particles", "place"]


def particle_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A one-axis mesh ``("particles",)`` over ``devices`` (default: every device of every process)."""
    devs = list(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("particle_mesh needs at least one device")
    return Mesh(np.asarray(devs, dtype=object), ("particles",))


def place(tree: Any, sharding: NamedSharding) -> Any:
    """Every leaf (a host array every process holds in full) placed as ``sharding`` says."""
    # make_array_from_callback works on one host and on many: each process hands over its own devices' slices
    # of a host array that every process holds in full.
    def put(leaf):
        host = np.asarray(leaf)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(put, tree)


def shard_particles(tree: Any, mesh: Mesh) -> Any:
    """Place every leaf (leading particle axis divisible by the mesh size) split over ``mesh``'s particles."""
    n = mesh.devices.size
    for leaf in jax.tree.leaves(tree):
        if np.ndim(leaf) == 0 or np.shape(leaf)[0] % n:
            raise ValueError(
                f"cannot split a leaf of shape {np.shape(leaf)} over {n} devices: its leading (particle) axis "
                f"must be a multiple of {n}"
            )
    return place(tree, NamedSharding(mesh, P("particles")))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Place every leaf whole on every device of ``mesh``."""
    return place(tree, NamedSharding(mesh, P()))


def gather(tree: Any) -> Any:
    """Every leaf as a host ``numpy`` array, gathered across processes when it spans several hosts."""

    def get(leaf):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return np.asarray(leaf)

    return jax.tree.map(get, tree)


def pad_particles(tree: Any, k_pad: int) -> Any:
    """Append copies of particle 0 until the leading axis has ``k_pad`` entries."""

    def pad(leaf):
        k = leaf.shape[0]
        if k == k_pad:
            return leaf
        return jnp.concatenate([leaf, jnp.repeat(leaf[:1], k_pad - k, axis=0)], axis=0)

    return jax.tree.map(pad, tree)
