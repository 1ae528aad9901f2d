"""Algorithm 1: an ensemble of perturbed regression models, all particles trained at once.

Each particle ``i`` draws a replicate (perturbed labels ``y~_i``, prior anchor ``theta~_i``), starts at
``theta_i = theta~_i`` (so the ensemble starts as a prior sample) and climbs its own perturbed log joint.
All particles move together: one ``jax.vmap`` over the particle axis inside one ``jax.lax.scan`` over steps,
compiled once. Snapshots of the particles at chosen steps and a per-step ``record`` of any function of the
particles are taken on the device, without host round-trips.

Example::

    opt = ensemble.optimizer("adagrad", 0.01)
    res = ensemble.train(key, model, x, y, noise_var=0.1, n_particles=200, opt=opt, steps=400)
    f = ensemble.predict(model, res.params, x_test)          # (200, n_test)

The kernel under :func:`train`, for a loop of your own (early stopping, a validation metric, your own
``lax.scan``)::

    state = ensemble.init(key, model, y, 0.1, 200, opt)     # replicates and starting particles
    step = jax.jit(functools.partial(ensemble.step, model=model, opt=opt, x=x, noise_var=0.1))
    for t in range(400):
        state, info = step(state)                            # info.loss: (200,) values of -log p~

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
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..checks import DivergedParticlesError, check_data, check_finite, model_outputs
from ..driver import Chunk, run_chunks
from ..models import Model, Params, float_dtype, predict, prior_sample
from ..perturb import Perturbation, perturbed_log_joint
from ..perturb import sample as sample_perturbation

__all__ = [
    "Optimizer",
    "optimizer",
    "State",
    "Info",
    "EnsembleResult",
    "DivergedParticlesError",
    "check_data",
    "check_finite",
    "model_outputs",
    "init",
    "step",
    "particle_step",
    "train",
    "train_grid",
    "predict",
    "particle_mesh",
    "shard_particles",
    "replicate",
    "gather",
]


class Optimizer(NamedTuple):
    """An optax transformation that minimises ``-log p~``, and whether it needs the loss value.

    ``iterations_per_step``: how many optimizer iterations one ``update`` -- one step of :func:`train` --
    makes at most: 1 for every optax optimizer (one update = one iteration), ``max_iter`` for
    ``"torch-lbfgs"`` (one update = one ``torch.optim.LBFGS.step(closure)``, an outer step of up to
    ``max_iter`` iterations). :meth:`steps_for` turns an iteration budget into :func:`train`'s ``steps``.
    """

    tx: optax.GradientTransformation
    needs_value: bool
    description: str
    iterations_per_step: int = 1

    def steps_for(self, iterations: int) -> int:
        """The ``steps`` of :func:`train` that make ``iterations`` iterations: ``iterations / iterations_per_step``.

        Raises ``ValueError`` unless ``iterations`` is a non-negative multiple of ``iterations_per_step``
        (e.g. 640 iterations are 640 steps of optax's L-BFGS but 32 outer steps of ``torch-lbfgs`` with
        ``max_iter=20``; 630 cannot be split into whole outer steps of 20).
        """
        per = int(self.iterations_per_step)
        if isinstance(iterations, bool) or int(iterations) != iterations or iterations < 0:
            raise ValueError(f"iterations must be a non-negative integer, got {iterations!r}")
        if int(iterations) % per:
            raise ValueError(
                f"{int(iterations)} iterations are not a whole number of steps of {self.description}: one step "
                f"makes up to {per} iterations"
            )
        return int(iterations) // per


def optimizer(name: str, learning_rate: float, **kwargs: Any) -> Optimizer:
    """Build one of the optimizers of the paper's experiments.

    Args:
        name: ``"sgd"`` (plain gradient ascent on ``log p~``, Algorithm 1 as written), ``"adagrad"``
            (kwargs ``initial_accumulator_value`` (optax default 0.1), ``eps``), ``"adam"``, ``"lbfgs"``
            (optax's L-BFGS, one iteration per step; kwargs ``memory_size`` (default 10) and ``linesearch``:
            ``None`` for fixed steps of size ``learning_rate`` along the L-BFGS direction, or ``"zoom"`` for
            optax's zoom line search), or ``"torch-lbfgs"`` (``torch.optim.LBFGS(lr=learning_rate, ...)``,
            :func:`bootens_core.ensemble.lbfgs.torch_lbfgs`: **one step is one outer** ``.step(closure)`` of up to
            ``max_iter`` iterations -- ``iterations_per_step = max_iter``; kwargs as torch's: ``max_iter``
            (20), ``max_eval``, ``tolerance_grad``, ``tolerance_change``, ``history_size`` (100),
            ``line_search_fn`` (``None``: fixed step; ``"strong_wolfe"``) and ``max_ls``).
        learning_rate: the step size ``h``.

    Raises:
        ValueError: for an unknown name or line search, or a bad learning rate or torch option;
        TypeError: for an option the optimizer does not take.
    """
    lr = float(learning_rate)
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"learning rate must be a positive finite number, got {learning_rate!r}")
    if name == "sgd":
        _no_extra(name, kwargs)
        return Optimizer(optax.sgd(lr), False, f"gradient ascent, h={lr:g}")
    if name == "adagrad":
        acc = float(kwargs.pop("initial_accumulator_value", 0.1))
        eps = float(kwargs.pop("eps", 1e-7))
        _no_extra(name, kwargs)
        return Optimizer(
            optax.adagrad(lr, initial_accumulator_value=acc, eps=eps), False,
            f"Adagrad, h={lr:g}, initial accumulator {acc:g}",
        )
    if name == "adam":
        _no_extra(name, kwargs)
        return Optimizer(optax.adam(lr), False, f"Adam, lr={lr:g}")
    if name == "lbfgs":
        memory = int(kwargs.pop("memory_size", 10))
        search = kwargs.pop("linesearch", None)
        _no_extra(name, kwargs)
        if search is None:
            tx = optax.lbfgs(learning_rate=lr, memory_size=memory, linesearch=None)
            desc = f"L-BFGS (memory {memory}), fixed step {lr:g}, no line search"
        elif search == "zoom":
            tx = optax.lbfgs(learning_rate=lr, memory_size=memory)
            desc = f"L-BFGS (memory {memory}), zoom line search, initial step {lr:g}"
        else:
            raise ValueError(f"unknown L-BFGS line search {search!r}: use None or 'zoom'")
        # Only the line search reads the loss value (and caches value and gradient in the state).
        return Optimizer(tx, search is not None, desc)
    if name == "torch-lbfgs":
        from .lbfgs import torch_lbfgs

        names = ("max_iter", "max_eval", "tolerance_grad", "tolerance_change", "history_size", "line_search_fn",
                 "max_ls")
        opts = {k: kwargs.pop(k) for k in names if k in kwargs}
        _no_extra(name, kwargs)
        tx = torch_lbfgs(lr, **opts)  # validates the options (ValueError naming the bad one)
        max_iter = int(opts.get("max_iter", 20))
        history = int(opts.get("history_size", 100))
        search = opts.get("line_search_fn")
        how = "fixed step" if search is None else "strong Wolfe line search, initial step"
        desc = (f"torch.optim.LBFGS (history {history}), {how} {lr:g}, up to {max_iter} iterations per step")
        # Every step starts from a loss value and gradient; with strong Wolfe the state caches them.
        return Optimizer(tx, True, desc, max_iter)
    raise ValueError(f"unknown optimizer {name!r}: choose sgd, adagrad, adam, lbfgs or torch-lbfgs")


def _no_extra(name: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise TypeError(f"optimizer {name!r} does not take {sorted(kwargs)}")


class State(NamedTuple):
    """Algorithm 1's state: the particles (leading axis ``k``), their optimizer states, their replicates
    (perturbed labels ``y~_i`` and prior anchors ``theta~_i``) and the number of steps taken."""

    params: Params
    opt_state: Any
    perturbation: Perturbation
    step: jax.Array


class Info(NamedTuple):
    """What one :func:`step` reports: ``loss``, ``(k,)`` values of ``-log p~`` of every particle before it."""

    loss: jax.Array


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


def init(
    key: jax.Array,
    model: Model,
    y: jax.Array,
    noise_var: float | jax.Array,
    n_particles: int,
    opt: Optimizer,
    *,
    perturb_labels: bool = True,
    perturb_prior: bool = True,
) -> State:
    """Draw the replicates and the starting particles of Algorithm 1 (the state :func:`step` advances).

    With ``perturb_prior`` the particles start at their anchors ``theta~`` (Algorithm 1, line 4); without it
    the anchors are 0 (the plain prior) and the particles start at independent prior draws. Without
    ``perturb_labels`` every particle sees the observed labels: both flags off give the *unperturbed*
    ensemble of Section 4.2, whose particles all climb ``log p(D, theta)``.
    """
    if int(n_particles) < 1:
        raise ValueError(f"n_particles must be at least 1, got {n_particles}")
    k_pert, k_init = jax.random.split(key)
    pert = sample_perturbation(k_pert, model, y, noise_var, n_particles)
    if not perturb_labels:
        pert = pert._replace(y=jnp.broadcast_to(y, pert.y.shape))
    if perturb_prior:
        params = pert.anchor
    else:
        pert = pert._replace(anchor=jax.tree.map(jnp.zeros_like, pert.anchor))
        params = prior_sample(k_init, model, n_particles, dtype=y.dtype)
    opt_state = jax.vmap(opt.tx.init)(params)
    return State(params, opt_state, pert, jnp.zeros((), jnp.int32))


def step(
    state: State, model: Model, opt: Optimizer, x: jax.Array, noise_var: float | jax.Array, *,
    noise_per_particle: bool = False,
) -> tuple[State, Info]:
    """One step of Algorithm 1 for every particle: ``theta_i <- theta_i + update of log p~_i`` (one
    ``opt.update``).

    Pure and jittable with ``model`` and ``opt`` closed over, e.g.
    ``jax.jit(functools.partial(step, model=model, opt=opt))``, or inside your own ``jax.lax.scan``;
    :func:`train` is a driver over :func:`init` and this function. ``x``: training inputs in the particles'
    dtype; ``noise_var``: as for :func:`train`, or with ``noise_per_particle`` one variance per particle
    ``(k,)`` (:func:`train_grid`). With a line search the value and gradient stored at the previous step are
    reused (one gradient evaluation per step is saved; see :func:`particle_step`).
    """
    update = _ensemble_update(model, opt, 0 if noise_per_particle else None)
    params, opt_state, loss = update(state.params, state.opt_state, state.perturbation, x, noise_var)
    return State(params, opt_state, state.perturbation, state.step + 1), Info(loss)


def particle_step(model: Model, opt: Optimizer) -> Callable[..., tuple[Params, Any, jax.Array]]:
    """One step of ONE particle, ``(params, opt_state, perturbation, x, noise_var) -> (params, opt_state,
    loss)``: minimise ``-log p~`` (i.e. ascend ``log p~``).

    The reference for :func:`step`: ``jax.vmap`` of it takes the same steps. For an optimizer that reads the
    loss value (the line-search L-BFGS), that ``vmap`` evaluates every particle's gradient at every step
    (``optax.value_and_grad_from_state``'s ``lax.cond`` becomes a ``select``); :func:`step` checks the stored
    values once per ensemble and evaluates nothing while they are finite.
    """

    def step_one(params, opt_state, pert, x, noise_var):
        def loss_fn(p):
            return -perturbed_log_joint(model, p, x, pert, noise_var)

        if opt.needs_value:
            value, grad = optax.value_and_grad_from_state(loss_fn)(params, state=opt_state)
            updates, opt_state = opt.tx.update(
                grad, opt_state, params, value=value, grad=grad, value_fn=loss_fn
            )
        else:
            value, grad = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = opt.tx.update(grad, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step_one


def _ensemble_update(model: Model, opt: Optimizer, noise_axis: int | None = None):
    """One step of every particle (leading axis ``k``), as ``jax.vmap`` of :func:`particle_step`.

    With a line search, the value and gradient at the current particles are those the line search stored in
    the optimizer state at the previous step; only where they are missing (the first step, or a non-finite
    value) are they computed (``optax.value_and_grad_from_state``). Under ``vmap`` that function's
    ``lax.cond`` on a per-particle predicate becomes a ``select`` that evaluates the gradient of every
    particle at every step and throws it away. Here the check is made once for the whole ensemble: while every
    particle's stored value is finite -- every step but the first, for a healthy ensemble -- nothing is
    evaluated; otherwise the gradients are computed and the stored ones kept where finite, as per particle.
    The particles are the same; one gradient evaluation per step is saved. (``"torch-lbfgs"`` stores them
    when its outer step already evaluated them at its end -- always with strong Wolfe, never after a full
    fixed-step outer step -- and ``+inf`` otherwise.)

    ``noise_axis``: ``None`` when every particle sees the same ``noise_var``; ``0`` when ``noise_var`` holds one
    variance per particle (:func:`train_grid`: a grid of ``sigma^2`` trained as one batch).
    """
    if not opt.needs_value:
        return jax.vmap(particle_step(model, opt), in_axes=(0, 0, 0, None, noise_axis))

    def loss_fn(p, pert, x, noise_var):
        return -perturbed_log_joint(model, p, x, pert, noise_var)

    value_and_grad_all = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(0, 0, None, noise_axis))

    def update_one(params, opt_state, pert, x, noise_var, value, grad):
        def value_fn(p):
            return loss_fn(p, pert, x, noise_var)

        updates, opt_state = opt.tx.update(grad, opt_state, params, value=value, grad=grad, value_fn=value_fn)
        return optax.apply_updates(params, updates), opt_state, value

    update_all = jax.vmap(update_one, in_axes=(0, 0, 0, None, noise_axis, 0, 0))

    def step_all(params, opt_state, pert, x, noise_var):
        stored_value = optax.tree.get(opt_state, "value")
        stored_grad = optax.tree.get(opt_state, "grad")
        stored_ok = ~jnp.isinf(stored_value) & ~jnp.isnan(stored_value)

        def fresh(_):
            value, grad = value_and_grad_all(params, pert, x, noise_var)
            keep = lambda s, f: jnp.where(stored_ok.reshape((-1,) + (1,) * (f.ndim - 1)), s, f)  # noqa: E731
            return keep(stored_value, value), jax.tree.map(keep, stored_grad, grad)

        value, grad = jax.lax.cond(jnp.all(stored_ok), lambda _: (stored_value, stored_grad), fresh, None)
        return update_all(params, opt_state, pert, x, noise_var, value, grad)

    return step_all


_RUNNERS: dict[tuple[Any, ...], Callable[..., Any]] = {}
_RUNNERS_MAX = 32


def _chunk_runner(model: Model, opt: Optimizer, record: Callable[[Params], Any] | None, with_snapshots: bool,
                  noise_axis: int | None = None):
    """The compiled scan driver, cached by (model function, optimizer, record, snapshots, noise axis).

    Data, labels, replicates and the noise variance are arguments, so repeated calls with the same model
    and optimizer objects (a grid search over ``noise_var``, one call per split) reuse one compilation per
    data shape instead of recompiling.
    """
    cache_key = (model.apply, opt.tx, record, with_snapshots, noise_axis)
    try:
        return _RUNNERS[cache_key]
    except (KeyError, TypeError):
        pass
    runner = _make_chunk_runner(model, opt, record, with_snapshots, noise_axis)
    try:
        if len(_RUNNERS) >= _RUNNERS_MAX:
            _RUNNERS.pop(next(iter(_RUNNERS)))
        _RUNNERS[cache_key] = runner
    except TypeError:  # an unhashable record function: no caching
        pass
    return runner


def _make_chunk_runner(model: Model, opt: Optimizer, record: Callable[[Params], Any] | None, with_snapshots: bool,
                       noise_axis: int | None = None):
    def run_chunk(state, buf, x, noise_var, slots, valid):
        def body(carry, inp):
            state, buf = carry
            slot, ok = inp

            def advance(s):
                s, info = step(s, model, opt, x, noise_var, noise_per_particle=noise_axis is not None)
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

    return jax.jit(run_chunk)


def particle_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A one-axis mesh ``("particles",)`` over ``devices`` (default: every device of every process)."""
    devs = list(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("particle_mesh needs at least one device")
    return Mesh(np.asarray(devs, dtype=object), ("particles",))


def _place(tree: Any, sharding: NamedSharding) -> Any:
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
    return _place(tree, NamedSharding(mesh, P("particles")))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Place every leaf whole on every device of ``mesh``."""
    return _place(tree, NamedSharding(mesh, P()))


def gather(tree: Any) -> Any:
    """Every leaf as a host ``numpy`` array, gathered across processes when it spans several hosts."""

    def get(leaf):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return np.asarray(leaf)

    return jax.tree.map(get, tree)


def _pad_particles(tree: Any, k_pad: int) -> Any:
    """Append copies of particle 0 until the leading axis has ``k_pad`` entries."""

    def pad(leaf):
        k = leaf.shape[0]
        if k == k_pad:
            return leaf
        return jnp.concatenate([leaf, jnp.repeat(leaf[:1], k_pad - k, axis=0)], axis=0)

    return jax.tree.map(pad, tree)


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
) -> EnsembleResult:
    """Run Algorithm 1 on ``n_particles`` particles for ``steps`` optimizer steps.

    Args:
        key: PRNG key; split into the replicates' key and the (unperturbed-prior) initialisation key.
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
    """
    if on_diverged not in ("raise", "report"):
        raise ValueError(f"on_diverged must be 'raise' or 'report', got {on_diverged!r}")
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

    state = init(
        key, model, y, noise_var, n_particles, opt, perturb_labels=perturb_labels, perturb_prior=perturb_prior
    )

    run = _drive(model, opt, state, x, noise_var, steps=steps, snaps=snaps, record=record,
                 progress=progress, n_chunks=n_chunks, shard=shard)
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
) -> _Run:
    """Run ``steps`` steps of every particle of ``state`` (the scan in chunks, sharding, snapshots, records)."""
    init_params = state.params
    k = int(jax.tree.leaves(state.params)[0].shape[0])
    mesh = None
    if shard is not False and shard is not None:
        mesh = shard if isinstance(shard, Mesh) else particle_mesh(None if shard is True else shard)
        n_dev = mesh.devices.size
        k_pad = -(-k // n_dev) * n_dev
        if k_pad != k and record is not None:
            raise ValueError(
                f"shard with record needs n_particles divisible by the {n_dev} devices (got {k}): padding "
                "particles would change what record sees"
            )
        state = State(*shard_particles(_pad_particles((state.params, state.opt_state, state.perturbation), k_pad),
                                       mesh),
                      replicate(state.step, mesh))
        x = replicate(x, mesh)
        if noise_axis is None:
            noise_var = replicate(noise_var, mesh)
        else:
            noise_var = shard_particles(_pad_particles(noise_var, k_pad), mesh)

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
            buf = _place(gather(buf), NamedSharding(mesh, P(None, "particles")))

    runner = _chunk_runner(model, opt, record, with_snapshots, noise_axis)

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
) -> list[EnsembleResult]:
    """Algorithm 1 for every ``sigma^2`` of ``noise_grid`` at once: ``len(noise_grid) * n_particles`` particles
    in one batch, particle block ``g`` seeing ``noise_grid[g]``.

    Block ``g`` is the ensemble ``train(key, model, x, y, noise_var=noise_grid[g], ...)`` would train -- the same
    ``key`` for every value, so the grid shares its random numbers (the label noise scaled by each
    ``sqrt(sigma^2)``, the same prior anchors) -- and its particles equal that call's up to float rounding
    (one compiled program for the whole grid instead of one call per value: on an accelerator the grid costs
    about one call's time while the batch fits the device). Returns one :class:`EnsembleResult` per grid value,
    in grid order (no snapshots or records). ``noise_grid``: positive finite scalars. Other arguments as
    :func:`train`; ``on_diverged="raise"`` names the grid values whose particles diverged.
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
    blocks = [init(key, model, y, jnp.asarray(v, dtype), k, opt) for v in grid]
    state = State(*jax.tree.map(lambda *a: jnp.concatenate(a),
                                *[(b.params, b.opt_state, b.perturbation) for b in blocks]), blocks[0].step)
    noise_var = jnp.repeat(jnp.asarray(grid, dtype), k)
    run = _drive(model, opt, state, x, noise_var, steps=steps, progress=progress, n_chunks=n_chunks,
                 shard=shard, noise_axis=0)
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
