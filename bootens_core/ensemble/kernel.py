"""Algorithm 1's kernel: the replicates and starting particles (:func:`init`) and one step of every particle
(:func:`step`), pure and jittable.

Each particle ``i`` draws a replicate (perturbed labels ``y~_i``, prior anchor ``theta~_i``), starts at
``theta_i = theta~_i`` (so the ensemble starts as a prior sample) and climbs its own perturbed log joint
``log p~_i(theta) = log N(y~_i | f(x; theta), sigma^2) + log N(theta | theta~_i, prior)``
(:func:`bootens_core.perturb.perturbed_log_joint`). :func:`step` moves every particle once: ``jax.vmap`` of
the single-particle step :func:`particle_step` over the particle axis. :func:`bootens_core.ensemble.train`
is a driver over these two (a ``lax.scan`` of :func:`step` in chunks, snapshots, records, progress,
sharding); for a loop of your own (early stopping, a validation metric, your own ``lax.scan``)::

    state = ensemble.init(key, model, y, 0.1, 200, opt)     # replicates and starting particles
    step = jax.jit(functools.partial(ensemble.step, model=model, opt=opt, x=x, noise_var=0.1))
    for t in range(400):
        state, info = step(state)                            # info.loss: (200,) values of -log p~
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ..models import Model, Params, prior_sample
from ..perturb import Perturbation, particle_keys, perturbed_log_joint
from ..perturb import sample as sample_perturbation
from .optimizers import Optimizer

__all__ = ["State", "Info", "init", "replicates", "start", "step", "particle_step"]


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
    pert, params = replicates(key, model, y, noise_var, n_particles, perturb_labels=perturb_labels,
                              perturb_prior=perturb_prior)
    return start(params, pert, opt)


def replicates(
    key: jax.Array,
    model: Model,
    y: jax.Array,
    noise_var: float | jax.Array,
    n_particles: int,
    *,
    perturb_labels: bool = True,
    perturb_prior: bool = True,
) -> tuple[Perturbation, Params]:
    """The random part of :func:`init`: the replicates and the starting particles, ``(perturbation, params)``
    (no optimizer involved, so it compiles once per model, shape and flags whatever the optimizer)."""
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
        params = jax.vmap(lambda k: prior_sample(k, model, dtype=y.dtype))(particle_keys(k_init, n_particles))
    return pert, params


def start(params: Params, perturbation: Perturbation, opt: Optimizer) -> State:
    """The state :func:`step` advances from particles ``params`` (leading axis ``k``) and their replicates:
    every particle's optimizer state from ``opt`` (which carries the learning rate), at step 0."""
    opt_state = jax.vmap(opt.tx.init)(params)
    return State(params, opt_state, perturbation, jnp.zeros((), jnp.int32))


def step(
    state: State, model: Model, opt: Optimizer, x: jax.Array, noise_var: float | jax.Array, *,
    noise_per_particle: bool = False, particle_batch: int | None = None,
) -> tuple[State, Info]:
    """One step of Algorithm 1 for every particle: ``theta_i <- theta_i + update of log p~_i`` (one
    ``opt.update``).

    Pure and jittable with ``model`` and ``opt`` closed over, e.g.
    ``jax.jit(functools.partial(step, model=model, opt=opt))``, or inside your own ``jax.lax.scan``;
    :func:`train` is a driver over :func:`init` and this function. ``x``: training inputs in the particles'
    dtype; ``noise_var``: as for :func:`train`, or with ``noise_per_particle`` one variance per particle
    ``(k,)`` (:func:`train_grid`). With a line search the value and gradient stored at the previous step are
    reused (one gradient evaluation per step is saved; see :func:`particle_step`). ``particle_batch``: step
    the particles this many at a time (``jax.lax.map`` over groups, the remainder in one more group) instead
    of all in one ``vmap``; the same particles up to float rounding, faster or slower on a CPU by model (a
    line search then stops per group; see ``bootens bench --case particle-batch``). The learning rate is the
    one in ``state.opt_state`` (set by :func:`init` from its optimizer; see
    :func:`bootens_core.ensemble.optimizer`): ``opt`` decides the program, so one compiled step serves every rate.
    """
    update = _ensemble_update(model, opt, 0 if noise_per_particle else None, particle_batch)
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

    def loss_fn(p, pert, x, noise_var):
        return -perturbed_log_joint(model, p, x, pert, noise_var)

    def step_one(params, opt_state, pert, x, noise_var):
        data = {"pert": pert, "x": x, "noise_var": noise_var}
        if opt.needs_value:
            value, grad = optax.value_and_grad_from_state(loss_fn)(params, **data, state=opt_state)
            updates, opt_state = opt.tx.update(grad, opt_state, params, value=value, grad=grad, value_fn=loss_fn,
                                               **data)
        else:
            value, grad = jax.value_and_grad(loss_fn)(params, **data)
            updates, opt_state = opt.tx.update(grad, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step_one


def _in_groups(update, size: int, noise_axis: int | None):
    """``update`` (one step of every particle) applied to the particles ``size`` at a time: ``jax.lax.map``
    over the groups of ``size``, the remaining ``k mod size`` particles in one more call; with ``k <= size``,
    the update itself."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"particle_batch must be a positive integer or None, got {size!r}")

    def grouped(params, opt_state, pert, x, noise_var):
        k = jax.tree.leaves(params)[0].shape[0]
        if k <= size:  # one group: the plain update, without a loop of one iteration around it
            return update(params, opt_state, pert, x, noise_var)
        b = size
        q = k // b
        per = (params, opt_state, pert, noise_var if noise_axis is not None else None)

        def call(group):
            p, o, pe, nv = group
            return update(p, o, pe, x, noise_var if noise_axis is None else nv)

        head = jax.tree.map(lambda a: a[: q * b].reshape((q, b) + a.shape[1:]), per)
        out = jax.tree.map(lambda a: a.reshape((q * b,) + a.shape[2:]), jax.lax.map(call, head))
        if q * b == k:
            return out
        rest = call(jax.tree.map(lambda a: a[q * b:], per))
        return jax.tree.map(lambda a, r: jnp.concatenate([a, r]), out, rest)

    return grouped


def _ensemble_update(model: Model, opt: Optimizer, noise_axis: int | None = None,
                     particle_batch: int | None = None):
    if particle_batch is not None:
        return _in_groups(_ensemble_update(model, opt, noise_axis), particle_batch, noise_axis)
    return _ensemble_update_all(model, opt, noise_axis)


def _ensemble_update_all(model: Model, opt: Optimizer, noise_axis: int | None = None):
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
        # The loss's data as keyword arguments (optax's convention), not closed over: the line search's
        # batching rule (linesearch.batched_zoom_linesearch) sees which of them are per particle.
        updates, opt_state = opt.tx.update(grad, opt_state, params, value=value, grad=grad, value_fn=loss_fn,
                                           pert=pert, x=x, noise_var=noise_var)
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
