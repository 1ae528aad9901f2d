"""How many particles to step at once: the group size chosen by the working set of one particle's step.

On a CPU, stepping all ``k`` particles in one ``vmap`` is fast while the step's data stay in the caches and
slows down once they leave them (``bootens bench``: a 1-layer ReLU network of Boston's shape on a 2-core AMD
EPYC ran 50 particles per step faster, per particle, than 200). A fixed group size does not fit every model:
groups of 10 sped the UCI networks up and slowed the linear chapter's model of 1024 features by 1.8x, whose
per-particle data are a few kilobytes beside features shared by all particles. So the group follows the
bytes: :func:`particle_step_bytes` counts, from the traced program of the step's evaluation, the bytes that
one more particle adds to a step (shared data -- inputs, features -- count once, not per particle), and
:func:`choose_particle_batch` fits that many particles into a fraction of the last-level cache
(:func:`cpu_caches`, read from the operating system). On accelerators every particle goes at once unless the
particles' memory would not fit (``memory_bytes``).

**Rounding.** A group takes the same steps as all at once, but not always to the bit: where a product
has the data as one operand (the first layer's ``x @ W``, its weight gradient ``x^T @ dZ``), ``vmap`` folds
the particle axis into the product's free dimension, and XLA:CPU picks the product's kernel by its size --
for small products a loop of its own, for larger ones a library kernel -- each summing in its own order.
Equality to the bit cannot be promised. Measured on a 2-core AMD EPYC (jaxlib 0.10.2, float32, Boston's
shape, 10 steps): groups of 1 to 8 particles of the 1-layer network differ from all 40 at once by up to
2e-4; groups of 10 to 20 matched all at once bit for bit on one data set and differed by one ulp in 4% of
the weights on another (``tests/ensemble/test_groups.py``). Broadcasting the inputs to every particle, so
that each product is one particle's, did not help: the batched product's kernel also changes with the
batch. The smallest group chosen is :data:`MIN_GROUP`, where the differences are single ulps.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = [
    "MIN_GROUP",
    "CACHE_FRACTION",
    "MEMORY_FRACTION",
    "cpu_caches",
    "particle_step_bytes",
    "choose_particle_batch",
    "auto_particle_batch",
    "forced_particle_batch",
    "recorded_particle_batches",
]

#: The smallest group :func:`choose_particle_batch` forms (see the module's note on rounding).
MIN_GROUP = 10
#: The share of the last-level cache a group's step may touch. The rest is left to the shared data, the
#: compiled program and the other cores (measured on one core of a 2-core AMD EPYC with 32 MB of L3, 200
#: particles of the 1-layer network of Boston's shape, 0.91 MB a particle: groups of 2-20, up to 18 MB, ran
#: 1.9-2.0x the loop of single particles; groups of 50, 45 MB, 1.2x; all at once 0.9x).
CACHE_FRACTION = 0.5
#: The share of an accelerator's memory the particles' buffers may take before they are stepped in groups.
MEMORY_FRACTION = 0.5

_SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cpu_caches(root: str | os.PathLike[str] = _SYSFS_CACHE) -> dict[int, int]:
    """The data (or unified) cache of each level of CPU 0, in bytes of one instance, ``{1: ..., 2: ..., 3: ...}``,
    read from Linux's ``/sys/devices/system/cpu/cpu0/cache``; empty where the system does not say."""
    out: dict[int, int] = {}
    for index in sorted(Path(root).glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = _size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified"):
            out[level] = max(out.get(level, 0), size)
    return out


def _written(jaxpr: Any) -> int:
    """Bytes of every array the equations of ``jaxpr`` (and of the programs nested in them) write."""
    from jax.extend.core import jaxprs_in_params

    total = 0
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            shape = getattr(v.aval, "shape", None)
            if shape is not None:
                total += int(np.prod(shape, dtype=np.int64)) * v.aval.dtype.itemsize
        for sub in jaxprs_in_params(eqn.params):
            total += _written(sub)
    return total


def particle_step_bytes(model: Any, state: Any, x: Any, noise_var: Any, noise_axis: int | None = None) -> float:
    """The bytes one more particle adds to the evaluation in a step of the ensemble ``state``: every array
    the value and gradient of its perturbed log joint writes -- activations, their gradients, the gradient
    itself (traced, not run: ``jax.make_jaxpr`` of the ``vmap`` over 2 and over 4 particles, their difference
    over 2, so that what all particles share -- the inputs, features -- counts once).

    A closed form of the traced program, before XLA fuses it: on the 1-layer ReLU network of Boston's shape
    (float32) it gives 0.88 MB where XLA's cost analysis of the compiled Adam step counts 1.11 MB accessed per
    particle, on the 4-layer one 3.4 MB against 4.9 MB; tracing takes a fraction of a second where compiling
    the two programs took seconds (an L-BFGS step with its line search, minutes on a loaded core). The
    optimizer's state (L-BFGS's history: 20 copies of the parameters) is not counted: it is read once per
    step, and counting it made groups of the linear chapter's L-BFGS ensemble (1024 features) that ran 2x
    slower than all at once.
    ``noise_axis``: ``0`` when ``noise_var`` holds one variance per particle.
    """
    from ..perturb import perturbed_log_joint

    def loss(p: Any, pert: Any, x: Any, nv: Any) -> Any:
        return -perturbed_log_joint(model, p, x, pert, nv)

    def shaped(tree: Any, m: int) -> Any:
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct((m, *a.shape[1:]), a.dtype), tree)

    evaluate = jax.vmap(jax.value_and_grad(loss), in_axes=(0, 0, None, noise_axis))
    written = {}
    for m in (2, 4):
        nv = noise_var if noise_axis is None else jax.ShapeDtypeStruct((m, *noise_var.shape[1:]), noise_var.dtype)
        jaxpr = jax.make_jaxpr(evaluate)(shaped(state.params, m), shaped(state.perturbation, m),
                                         jax.ShapeDtypeStruct(x.shape, x.dtype), nv)
        written[m] = _written(jaxpr.jaxpr)
    return max((written[4] - written[2]) / 2, 0.0)


def choose_particle_batch(k: int, per_particle: float, *, platform: str,
                          cache_bytes: int | None = None, memory_bytes: int | None = None) -> int | None:
    """The group size for ``k`` particles of which each adds ``per_particle`` bytes to a step
    (:func:`particle_step_bytes`): ``None`` to step all at once.

    CPU: ``None`` (all at once) while all ``k`` particles' bytes fit ``cache_bytes`` (the last-level cache),
    or when the cache is unknown; else as many particles as fill :data:`CACHE_FRACTION` of it, at least
    :data:`MIN_GROUP`, a divisor of ``k`` from half that size up preferred so that no short group is left
    over. (All at once while the whole fits: the linear chapter's ensemble, 200 particles of 1024 features in
    float64, 15 MB of a 32 MB cache, ran 1.4x slower in groups of 100, its products with the shared features
    narrower.) Other platforms: ``None``
    unless the particles' buffers exceed :data:`MEMORY_FRACTION` of ``memory_bytes``, then the largest group
    that fits. Pure: the same inputs give the same size.
    """
    k = int(k)
    if k < 1:
        raise ValueError(f"need at least one particle, got k={k}")
    need = float(per_particle)
    if platform == "cpu":
        whole, room = cache_bytes, None if not cache_bytes else CACHE_FRACTION * cache_bytes
    else:
        room = None if not memory_bytes else MEMORY_FRACTION * memory_bytes
        whole = room
    if room is None or need <= 0 or k * need <= whole:
        return None
    most = max(int(room // need), 1 if platform != "cpu" else MIN_GROUP)
    if most >= k:
        return None
    for g in range(most, max(most // 2, 1) - 1, -1):
        if k % g == 0:
            return g
    return most


_CHOSEN: dict[Any, int | None] = {}
_UNSET = object()
_FORCED: contextvars.ContextVar[Any] = contextvars.ContextVar("bootens_forced_particle_batch", default=_UNSET)
_RECORDED: contextvars.ContextVar[list[tuple[int, int | None]] | None] = contextvars.ContextVar(
    "bootens_recorded_particle_batches", default=None)


@contextlib.contextmanager
def recorded_particle_batches() -> Iterator[list[tuple[int, int | None]]]:
    """Within this block every answer of :func:`auto_particle_batch` is appended to the list it yields, as
    ``(k, group)`` (``group`` ``None``: all ``k`` at once), so that a timing can say which groups a whole
    computation used (``bootens bench --case groups``)."""
    seen: list[tuple[int, int | None]] = []
    token = _RECORDED.set(seen)
    try:
        yield seen
    finally:
        _RECORDED.reset(token)


@contextlib.contextmanager
def forced_particle_batch(batch: int | None) -> Iterator[None]:
    """Within this block :func:`auto_particle_batch` answers ``batch`` (``None``: all particles at once)
    instead of choosing by the working set, so that whole computations that leave the group to the library
    (a UCI cell, an estimator's fit) can be timed grouped and not grouped in one process
    (``bootens bench --case groups``). Only the default ``particle_batch="auto"`` is affected."""
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(f"a forced particle batch must be a positive integer or None, got {batch!r}")
    token = _FORCED.set(batch)
    try:
        yield
    finally:
        _FORCED.reset(token)


def auto_particle_batch(model: Any, opt: Any, state: Any, x: Any, noise_var: Any,
                        noise_axis: int | None = None) -> int | None:
    """The group size :func:`~bootens_core.ensemble.train` uses by default (``particle_batch="auto"``) for this
    ensemble on the default device: :func:`choose_particle_batch` of :func:`particle_step_bytes`, with the
    last-level cache of :func:`cpu_caches` on a CPU and the device's memory limit elsewhere. Cached by the
    model's and optimizer's program keys and the shapes, so a second call costs nothing. Inside
    :func:`forced_particle_batch` the forced size is returned (capped at ``k``: ``None``); inside
    :func:`recorded_particle_batches` every answer is recorded."""
    k = int(jax.tree.leaves(state.params)[0].shape[0])
    group = _auto_particle_batch(model, opt, state, x, noise_var, noise_axis, k)
    seen = _RECORDED.get()
    if seen is not None:
        seen.append((k, group))
    return group


def _auto_particle_batch(model: Any, opt: Any, state: Any, x: Any, noise_var: Any,
                         noise_axis: int | None, k: int) -> int | None:
    from ..models import program_key

    forced = _FORCED.get()
    if forced is not _UNSET:
        return None if forced is None or forced >= k else forced
    dev = jax.devices()[0]
    shapes = jax.tree.map(lambda a: (tuple(a.shape[1:]), str(a.dtype)), (state.params, state.perturbation))
    key = (program_key(model), opt.program_key(), k, tuple(x.shape), str(x.dtype), tuple(getattr(noise_var, "shape", ())),
           noise_axis, dev.platform, str(jax.tree.leaves(shapes)))
    try:
        return _CHOSEN[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable program key: decide every time
        key = None
    cache = memory = None
    if dev.platform == "cpu":
        caches = cpu_caches()
        cache = caches[max(caches)] if caches else None
    else:
        try:
            memory = (dev.memory_stats() or {}).get("bytes_limit")
        except Exception:  # noqa: BLE001  (a backend without memory statistics)
            memory = None
    group = None
    if cache or memory:
        per = particle_step_bytes(model, state, x, noise_var, noise_axis)
        group = choose_particle_batch(k, per, platform=dev.platform, cache_bytes=cache, memory_bytes=memory)
    if key is not None:
        _CHOSEN[key] = group
    return group
