"""Algorithm 1's drivers: an ensemble of perturbed regression models, all particles trained at once.

Each particle ``i`` draws a replicate (perturbed labels ``y~_i``, prior anchor ``theta~_i``), starts at
``theta_i = theta~_i`` (so the ensemble starts as a prior sample) and climbs its own perturbed log joint.
All particles move together: one ``jax.vmap`` over the particle axis (on a CPU, over groups of particles
sized by the working set: :mod:`~bootens_core.ensemble.groups`) inside one ``jax.lax.scan`` over steps,
compiled once. Snapshots of the particles at chosen steps and a per-step ``record`` of any function of the
particles are taken on the device, without host round-trips.

Example::

    opt = ensemble.optimizer("adagrad", 0.01)
    res = ensemble.train(key, model, x, y, noise_var=0.1, n_particles=200, opt=opt, steps=400)
    f = ensemble.predict(model, res.params, x_test)          # (200, n_test)

The kernel under :func:`train` (:func:`~bootens_core.ensemble.kernel.init`,
:func:`~bootens_core.ensemble.kernel.step`) is in :mod:`bootens_core.ensemble.kernel`.

**Devices.** ``train(..., shard=True)`` lays the particle axis of the particles, their optimizer states and
their replicates over a one-axis mesh ``("particles",)`` of every device (``jax.sharding``); data are
replicated. Particles never interact, so XLA partitions each step without communication and the particles
are those of the unsharded run. ``k`` need not divide by the device count: the particle axis is padded with
copies of particle 0, whose results are dropped. On several hosts, call ``jax.distributed.initialize()``
in every process first: the mesh then spans the devices of all processes, every process builds the same
replicates from the same key (nothing random is communicated), places its own slice
(``jax.make_array_from_callback``) and gathers the trained particles at the end
(``multihost_utils.process_allgather``).
"""


from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..checks import DivergedParticlesError, check_data, check_finite, check_observed, model_outputs
from ..driver import Chunk, ProgramCache, run_chunks
from ..models import Model, Params, float_dtype, given_features, predict, program_key
from ..perturb import Perturbation
from .groups import auto_particle_batch
from .kernel import State, replicates, start, step
from .optimizers import Optimizer
from .sharding import place, gather, pad_particles, particle_mesh, replicate, shard_particles

__all__ = [
    "EnsembleResult",
    "DivergedParticlesError",
    "check_data",
    "check_finite",
    "model_outputs",
    "train",
    "train_grid",
    "predict",
    "CPU_REDUCE_WITHOUT_YNN",
]

# XLA compiler options (for ``train(..., compiler_options=...)``) under which the CPU backend of jaxlib 0.11
# reduces with its own loops instead of YNNPACK kernels: XLA's default set of YNNPACK fusions (dots,
# individual dots and convolutions, reductions) without the reductions, as the flag
# ``--xla_cpu_experimental_ynn_fusion_type=-reduce`` gives it (the same compiled program; jax-ml/jax#37465
# reports YNNPACK reductions as a CPU slowdown). Measured on a 2-core CPU, one core, float64: 10 000
# particles of the two-weight toy ReLU network on 24 points step 4x as fast (1000 steps 2.16 -> 0.55 s),
# but the linear model of 1024 trigonometric features (200 particles) 1.5x slower and a 1-layer network of
# Boston's shape with L-BFGS 1.3x slower: an option for many particles with few points, not a default.
# The option is read by the CPU backend only.
#: XLA options under which the CPU backend reduces with its own loops instead of YNNPACK kernels (for
#: :func:`train`'s ``compiler_options``; measured faster for many particles on few points, slower otherwise).
CPU_REDUCE_WITHOUT_YNN: dict[str, str] = {
    "xla_cpu_experimental_ynn_fusion_type":
        "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION",
}


class EnsembleResult(NamedTuple):
    """What :func:`train` returns.

    Attributes:
        params: final particles, leading axis ``k``.
        init_params: the particles before the first step (prior draws).
        snapshots: particles at ``snapshot_steps``, leading axes ``(len(snapshot_steps), k)``; ``None`` if none.
        snapshot_steps: the steps of the snapshots (0 = before any step).
        loss: ``(steps, k)`` values of ``-log p~`` of every particle before each step.
        records: ``record(params)`` before the first step and after every step, stacked on a leading axis
            of length ``steps + 1``; ``None`` without ``record``.
        perturbation: the replicates (perturbed labels and anchors) of the particles.
        diverged: ``(k,)`` booleans: particles with a NaN or Inf parameter at the end.
    """

    params: Params
    init_params: Params
    snapshots: Params | None
    snapshot_steps: tuple[int, ...]
    loss: np.ndarray
    records: Any
    perturbation: Perturbation
    diverged: np.ndarray


_RUNNERS = ProgramCache()
_REPLICATES = ProgramCache()


def _replicates(model: Model, n_particles: int, perturb_labels: bool, perturb_prior: bool):
    """:func:`~bootens_core.ensemble.kernel.replicates` compiled as one program, ``(key, y, noise_var) ->
    (perturbation, params)``, cached by the model's program key, the ensemble size and the flags: run op by op
    it compiled some 60 small programs (random draws, splits, broadcasts) on a first call."""
    cache_key = (program_key(model), int(n_particles), bool(perturb_labels), bool(perturb_prior))

    def build():
        def draw(key, y, noise_var):
            return replicates(key, model, y, noise_var, n_particles, perturb_labels=perturb_labels,
                              perturb_prior=perturb_prior)

        return jax.jit(draw)

    return _REPLICATES.get(cache_key, build)


def _chunk_runner(model: Model, opt: Optimizer, record: Callable[[Params], Any] | None, with_snapshots: bool,
                  noise_axis: int | None = None, particle_batch: int | None = None,
                  compiler_options: tuple[tuple[str, str], ...] = ()):
    """The compiled scan driver, cached by what decides it: the model's and optimizer's program keys, the
    record function, snapshots, the noise axis, the particle batch and the XLA compiler options.

    Data, labels, replicates and the noise variance are arguments, so repeated calls (a grid search over
    ``noise_var``, one call per split, equal models built anew) reuse one compilation per data shape.
    """
    cache_key = (program_key(model), opt.program_key(), record, with_snapshots, noise_axis, particle_batch,
                 compiler_options)
    return _RUNNERS.get(cache_key, lambda: _make_chunk_runner(model, opt, record, with_snapshots, noise_axis,
                                                              particle_batch, compiler_options))


def _make_chunk_runner(model: Model, opt: Optimizer, record: Callable[[Params], Any] | None, with_snapshots: bool,
                       noise_axis: int | None = None, particle_batch: int | None = None,
                       compiler_options: tuple[tuple[str, str], ...] = ()):
    def run_chunk(state, buf, x, noise_var, slots, valid):
        def body(carry, inp):
            state, buf = carry
            slot, ok = inp

            def advance(s):
                s, info = step(s, model, opt, x, noise_var, noise_per_particle=noise_axis is not None,
                               particle_batch=particle_batch)
                return s, info.loss

            def hold(s):
                k = jax.tree.leaves(s.params)[0].shape[0]
                return s, jnp.full((k,), jnp.nan, dtype=x.dtype)

            state, loss = jax.lax.cond(ok, advance, hold, state)
            if with_snapshots:
                buf = jax.lax.cond(
                    slot >= 0,
                    lambda b: jax.tree.map(lambda bb, p: bb.at[slot].set(p), b, state.params),
                    lambda b: b,
                    buf,
                )
            rec = record(state.params) if record is not None else None
            return (state, buf), (loss, rec)

        (state, buf), (loss, rec) = jax.lax.scan(body, (state, buf), (slots, valid))
        return state, buf, loss, rec

    return jax.jit(run_chunk, compiler_options=dict(compiler_options) or None)


def _options(compiler_options: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """``compiler_options`` as the sorted, hashable pairs that key the compiled driver."""
    if compiler_options is None:
        return ()
    if not isinstance(compiler_options, Mapping) or not all(isinstance(k, str) for k in compiler_options):
        raise ValueError(f"compiler_options must map XLA option names to values, got {compiler_options!r}")
    return tuple(sorted((k, str(v)) for k, v in compiler_options.items()))


def train(
    key: jax.Array,
    model: Model,
    x: Any,
    y: Any,
    *,
    noise_var: float | Any,
    n_particles: int,
    opt: Optimizer,
    steps: int,
    snapshot_steps: Sequence[int] = (),
    record: Callable[[Params], Any] | None = None,
    perturb_labels: bool = True,
    perturb_prior: bool = True,
    dtype: Any = None,
    on_diverged: str = "raise",
    progress: bool | str = False,
    n_chunks: int = 1,
    shard: bool | Sequence[jax.Device] | Mesh = False,
    particle_batch: int | str | None = "auto",
    compiler_options: Mapping[str, Any] | None = None,
    observed: Any = None,
) -> EnsembleResult:
    """Run Algorithm 1 on ``n_particles`` particles for ``steps`` optimizer steps.

    Args:
        key: PRNG key; split into the replicates' key and the (unperturbed-prior) initialisation key, of
            which particle ``i`` uses ``fold_in(·, i)`` (:func:`bootens_core.perturb.particle_keys`): the
            first ``k`` particles of a larger ensemble are the ``k``-particle ensemble.
        model: the model and its prior.
        x, y: training inputs ``(n,)``/``(n, d)`` and labels ``(n,)`` (``(n, C)`` for a model with ``C``
            outputs); validated by :func:`check_data`.
        noise_var: likelihood variance ``sigma^2``: scalar, one per point, or one per label.
        n_particles: ensemble size ``k``.
        opt: from :func:`optimizer`.
        steps: number of optimizer steps (``opt.update`` calls). One step is one iteration for the optax
            optimizers but one outer step of up to ``opt.iterations_per_step`` iterations for
            ``"torch-lbfgs"``: pass ``steps=opt.steps_for(iterations)`` to budget iterations.
        snapshot_steps: steps (0..steps) at which to keep a copy of all particles.
        record: a function of the particles (leading axis ``k``) evaluated before the first step and after
            every step on the device, e.g. a projection used for a KL curve.
        perturb_labels, perturb_prior: see :func:`init`.
        dtype: float dtype of data and parameters (float32 for large networks); default JAX's default float,
            see :func:`~bootens_core.models.float_dtype`.
        on_diverged: ``"raise"`` (default) raises :class:`DivergedParticlesError` if any particle ends with a
            NaN/Inf parameter; ``"report"`` returns and flags them in ``diverged``.
        progress: show a progress bar (a description string sets its label).
        n_chunks: split the scan into this many equal chunks (one compilation) so that a progress bar can
            advance between them; progress bars use at least 50.
        shard: split the particle axis over devices: ``True`` for every device (of every process, after
            ``jax.distributed.initialize()``), a sequence of devices, or a :func:`particle_mesh`. ``k`` is padded
            to a multiple of the device count with copies of particle 0 (dropped from the results), which
            ``record`` would see: with ``record``, ``k`` must divide evenly. The particles equal the
            unsharded run's.
        particle_batch: step the particles this many at a time (:func:`step`); ``None`` steps all in one
            ``vmap``; ``"auto"`` (the default) lets the working set decide
            (:func:`~bootens_core.ensemble.groups.auto_particle_batch`): on a CPU, groups of as many particles
            as touch half the last-level cache in one step (by XLA's count of the bytes one more particle adds,
            at least 10), all at once when they all fit; on an accelerator, all at once unless the particles
            would not fit its memory. Unsharded only (sharded runs step all at once). Groups give the particles
            of all at once up to float rounding, not to the bit: XLA picks a product's kernel by its size (see
            :mod:`~bootens_core.ensemble.groups`).
        compiler_options: XLA options of the compiled training loop, as :func:`jax.jit` takes them (an
            option's value as a string), e.g. :data:`CPU_REDUCE_WITHOUT_YNN`; the same particles up to float
            rounding.
        observed: ``(n,)`` booleans, ``False`` for padding rows: a padding row adds nothing to any particle's
            objective and its label is not perturbed (its variance is ``+inf``, see :mod:`bootens_core.perturb`),
            so the particles are those trained on the observed rows alone, up to float rounding, as long as the
            padding comes after them (each row's perturbation is drawn by its index, with JAX's default
            ``jax_threefry_partitionable``). One compiled program then serves every row count up to the
            padded one (a grid search's folds, a validation split and the final fit). ``None``: every row is
            observed.
    """
    if on_diverged not in ("raise", "report"):
        raise ValueError(f"on_diverged must be 'raise' or 'report', got {on_diverged!r}")
    options = _options(compiler_options)
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"steps must be non-negative, got {steps}")
    snaps = tuple(sorted({int(s) for s in snapshot_steps}))
    if snaps and (snaps[0] < 0 or snaps[-1] > steps):
        raise ValueError(f"snapshot steps must lie in [0, {steps}], got {list(snaps)}")
    dtype = float_dtype(dtype)
    x, y = check_data(x, y, noise_var, outputs=model_outputs(model, np.asarray(x)))
    x, y = x.astype(dtype), y.astype(dtype)
    noise_var = jnp.asarray(noise_var, dtype)
    if noise_var.ndim == 1 and y.ndim == 2:  # one variance per row of a multi-output model
        noise_var = noise_var[:, None]
    if observed is not None:
        rows = check_observed(observed, y.shape[0])
        shape = noise_var.shape if noise_var.ndim else (y.shape[0],) + (1,) * (y.ndim - 1)
        rows = jnp.asarray(rows).reshape((y.shape[0],) + (1,) * (len(shape) - 1))
        noise_var = jnp.where(rows, jnp.broadcast_to(noise_var, shape), jnp.inf).astype(dtype)

    if int(n_particles) < 1:
        raise ValueError(f"n_particles must be at least 1, got {n_particles}")
    pert, params = _replicates(model, n_particles, perturb_labels, perturb_prior)(key, y, noise_var)
    state = start(params, pert, opt)

    run = _drive(model, opt, state, x, noise_var, steps=steps, snaps=snaps, record=record,
                 progress=progress, n_chunks=n_chunks, shard=shard, particle_batch=particle_batch,
                 compiler_options=options)
    if run.diverged.any() and on_diverged == "raise":
        raise _diverged_error(run.diverged, run.loss, steps, opt)
    return EnsembleResult(
        params=run.params,
        init_params=state.params,
        snapshots=run.snapshots,
        snapshot_steps=snaps,
        loss=run.loss,
        records=run.records,
        perturbation=state.perturbation,
        diverged=run.diverged,
    )


class _Run(NamedTuple):
    params: Params
    snapshots: Params | None
    loss: np.ndarray
    records: Any
    diverged: np.ndarray


def _diverged_error(diverged: np.ndarray, loss: np.ndarray, steps: int, opt: Optimizer,
                    where: str = "") -> DivergedParticlesError:
    bad_steps = np.nonzero(~np.isfinite(loss).all(axis=1))[0]
    first = int(bad_steps[0]) if bad_steps.size else None
    when = f"; the loss first became non-finite at step {first}" if first is not None else ""
    return DivergedParticlesError(
        f"{int(diverged.sum())} of {diverged.size} particles{where} diverged to NaN/Inf during {steps} steps of "
        f"{opt.description}{when}. Lower the step size, or pass on_diverged='report' to keep the "
        "finite ones and inspect the rest.",
        diverged,
        first,
    )


def _drive(
    model: Model,
    opt: Optimizer,
    state: State,
    x: jax.Array,
    noise_var: jax.Array,
    *,
    steps: int,
    snaps: tuple[int, ...] = (),
    record: Callable[[Params], Any] | None = None,
    progress: bool | str = False,
    n_chunks: int = 1,
    shard: bool | Sequence[jax.Device] | Mesh = False,
    noise_axis: int | None = None,
    particle_batch: int | str | None = "auto",
    compiler_options: tuple[tuple[str, str], ...] = (),
) -> _Run:
    """Run ``steps`` steps of every particle of ``state`` (the scan in chunks, sharding, snapshots, records)."""
    if particle_batch is not None and particle_batch != "auto" and (
            isinstance(particle_batch, bool) or not isinstance(particle_batch, int) or particle_batch < 1):
        raise ValueError(f"particle_batch must be a positive integer, None or 'auto', got {particle_batch!r}")
    init_params = state.params
    k = int(jax.tree.leaves(state.params)[0].shape[0])
    if model.features is not None:
        # A model linear in its parameters: its features computed once here, not at every step (the linear
        # chapter's 1024 cosine features of 64 points were 30% of its Adagrad step on a CPU).
        x = model.features(x)
        model = given_features(model)
    mesh = None
    sharded = shard is not False and shard is not None
    if particle_batch == "auto":
        particle_batch = None if sharded else auto_particle_batch(model, opt, state, x, noise_var, noise_axis)
    if sharded:
        mesh = shard if isinstance(shard, Mesh) else particle_mesh(None if shard is True else shard)
        n_dev = mesh.devices.size
        k_pad = -(-k // n_dev) * n_dev
        if k_pad != k and record is not None:
            raise ValueError(
                f"shard with record needs n_particles divisible by the {n_dev} devices (got {k}): padding "
                "particles would change what record sees"
            )
        state = State(*shard_particles(pad_particles((state.params, state.opt_state, state.perturbation), k_pad),
                                       mesh),
                      replicate(state.step, mesh))
        x = replicate(x, mesh)
        if noise_axis is None:
            noise_var = replicate(noise_var, mesh)
        else:
            noise_var = shard_particles(pad_particles(noise_var, k_pad), mesh)

    if progress:
        n_chunks = max(n_chunks, min(50, max(steps, 1)))
    n_chunks = max(1, min(int(n_chunks), max(steps, 1)))
    chunk = max(1, math.ceil(steps / n_chunks)) if steps else 1
    n_chunks = math.ceil(steps / chunk) if steps else 0
    total = n_chunks * chunk
    # slots[t-1] = index of the snapshot taken after step t, or -1.
    slots = np.full(total, -1, dtype=np.int32)
    for i, s in enumerate(snaps):
        if s > 0:
            slots[s - 1] = i
    valid = np.arange(total) < steps

    with_snapshots = bool(snaps)
    buf = None
    if with_snapshots:
        buf = jax.tree.map(lambda p: jnp.zeros((len(snaps), *p.shape), p.dtype), state.params)
        if snaps[0] == 0:
            buf = jax.tree.map(lambda b, p: b.at[0].set(p), buf, state.params)
        if mesh is not None:
            buf = place(gather(buf), NamedSharding(mesh, P(None, "particles")))

    runner = _chunk_runner(model, opt, record, with_snapshots, noise_axis, particle_batch, compiler_options)

    def advance(carry, chunk_slots, chunk_valid):
        state, buf, loss, rec = runner(*carry, x, noise_var, chunk_slots, chunk_valid)
        return (state, buf), (loss, rec)

    def schedule(c: int) -> tuple[Any, Any]:
        sl = slice(c * chunk, (c + 1) * chunk)
        # Sharded: host arrays for the step schedule (every process passes the same, replicated values).
        return (slots[sl], valid[sl]) if mesh is not None else (jnp.asarray(slots[sl]), jnp.asarray(valid[sl]))

    plan = [Chunk(schedule(c), min(chunk, steps - c * chunk)) for c in range(n_chunks)]
    (state, buf), outputs = run_chunks(advance, (state, buf), plan, progress=progress, label="particles")
    losses = [loss for loss, _ in outputs]
    recs = [rec for _, rec in outputs]

    params = state.params
    if mesh is not None:
        # Back to host arrays (gathered across processes), padding particles dropped.
        params = jax.tree.map(lambda a: jnp.asarray(a[:k]), gather(params))
        buf = None if buf is None else jax.tree.map(lambda a: jnp.asarray(a[:, :k]), gather(buf))
        losses = [np.asarray(v)[:, :k] for v in gather(losses)]
        recs = gather(recs)
    loss = np.concatenate([np.asarray(v) for v in losses])[:steps] if losses else np.zeros((0, k))
    records = None
    if record is not None:
        first = jax.tree.map(lambda r: r[None], record(init_params))
        records = jax.tree.map(lambda *rs: np.concatenate([np.asarray(r) for r in rs])[: steps + 1], first, *recs)

    finite = jnp.ones((k,), bool)
    for leaf in jax.tree.leaves(params):
        finite = finite & jnp.all(jnp.isfinite(leaf.reshape(k, -1)), axis=1)
    return _Run(params, buf, loss, records, ~np.asarray(finite))


def _block(tree: Any, i: int, k: int) -> Any:
    return jax.tree.map(lambda a: a[i * k:(i + 1) * k], tree)


def train_grid(
    key: jax.Array,
    model: Model,
    x: Any,
    y: Any,
    *,
    noise_grid: Sequence[float],
    n_particles: int,
    opt: Optimizer,
    steps: int,
    dtype: Any = None,
    on_diverged: str = "raise",
    progress: bool | str = False,
    n_chunks: int = 1,
    shard: bool | Sequence[jax.Device] | Mesh = False,
    particle_batch: int | str | None = "auto",
    perturb_labels: bool = True,
    perturb_prior: bool = True,
) -> list[EnsembleResult]:
    """Algorithm 1 for every ``sigma^2`` of ``noise_grid`` at once: ``len(noise_grid) * n_particles`` particles
    in one batch, particle block ``g`` seeing ``noise_grid[g]``.

    Block ``g`` is the ensemble ``train(key, model, x, y, noise_var=noise_grid[g], ...)`` would train -- the same
    ``key`` for every value, so the grid shares its random numbers (the label noise scaled by each
    ``sqrt(sigma^2)``, the same prior anchors) -- and its particles equal that call's up to float rounding
    (one compiled program for the whole grid instead of one call per value: on an accelerator the grid costs
    about one call's time while the batch fits the device). Returns one :class:`EnsembleResult` per grid value,
    in grid order (no snapshots or records). ``noise_grid``: positive finite scalars. Other arguments as
    :func:`train` (``particle_batch`` groups the whole batch of ``len(noise_grid) * n_particles``;
    ``perturb_labels`` and ``perturb_prior`` off give the plain ensemble's grid); ``on_diverged="raise"`` names
    the grid values whose particles diverged.
    """
    if on_diverged not in ("raise", "report"):
        raise ValueError(f"on_diverged must be 'raise' or 'report', got {on_diverged!r}")
    grid = np.asarray(noise_grid, dtype=np.float64)
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"noise_grid must be a non-empty sequence of scalars, got shape {grid.shape}")
    if not np.all(np.isfinite(grid) & (grid > 0)):
        raise ValueError(f"every noise_grid value must be positive and finite, got {grid.tolist()}")
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"steps must be non-negative, got {steps}")
    k = int(n_particles)
    dtype = float_dtype(dtype)
    x, y = check_data(x, y, None, outputs=model_outputs(model, np.asarray(x)))
    x, y = x.astype(dtype), y.astype(dtype)
    draw = _replicates(model, k, perturb_labels, perturb_prior)  # train's replicates, bit for bit

    def block(v: float) -> State:
        pert, params = draw(key, y, jnp.asarray(v, dtype))
        return start(params, pert, opt)

    blocks = [block(v) for v in grid]
    state = State(*jax.tree.map(lambda *a: jnp.concatenate(a),
                                *[(b.params, b.opt_state, b.perturbation) for b in blocks]), blocks[0].step)
    noise_var = jnp.repeat(jnp.asarray(grid, dtype), k)
    run = _drive(model, opt, state, x, noise_var, steps=steps, progress=progress, n_chunks=n_chunks,
                 shard=shard, noise_axis=0, particle_batch=particle_batch)
    if run.diverged.any() and on_diverged == "raise":
        bad = sorted({float(grid[i // k]) for i in np.nonzero(run.diverged)[0]})
        raise _diverged_error(run.diverged, run.loss, steps, opt, where=f" (at sigma^2 {', '.join(f'{v:g}' for v in bad)})")
    return [
        EnsembleResult(
            params=_block(run.params, g, k),
            init_params=blocks[g].params,
            snapshots=None,
            snapshot_steps=(),
            loss=run.loss[:, g * k:(g + 1) * k],
            records=None,
            perturbation=blocks[g].perturbation,
            diverged=run.diverged[g * k:(g + 1) * k],
        )
        for g in range(grid.size)
    ]
