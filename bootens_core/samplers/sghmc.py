"""Scale-adapted stochastic-gradient Hamiltonian Monte Carlo (Springenberg, Klein, Falkner & Hutter, 2016).

The paper's SGHMC baseline (1-layer networks on UCI: ``lr = 0.001``, ``mdecay = 0.01``, 10 restarts from prior
draws, burn-in 2000 steps, then one kept state every 2000 steps).

**The kernel** (:func:`sghmc_step`), per parameter, with ``G = grad U(theta)`` the (stochastic) gradient of the
negative log posterior ``U``, step size ``eps`` and momentum decay ``C = mdecay``:

1. adaptation, during the burn-in only (``adapt=True``), every right-hand side from the state before the step::

       r     = 1 / (tau + 1)
       tau  <- tau - tau * g**2 / v_hat + 1
       g    <- g - r * g + r * G
       v_hat <- v_hat - r * v_hat + r * G**2

   (the order of the reference implementation: ``r`` from the old ``tau``, ``tau`` from the old ``g`` and
   ``v_hat``). After the burn-in ``tau, g, v_hat`` are frozen, so the sampler is a time-homogeneous SGHMC.
   They start at 1; since ``g**2 <= v_hat`` holds at the start and is kept by the updates (Jensen), ``tau >= 1``
   and ``0 < r <= 1/2`` always.
2. preconditioner ``M^-1 = 1 / sqrt(v_hat)`` from the estimate *after* this step's adaptation;
3. momentum ``v <- v - eps**2 M^-1 G - C v + N(0, s2)`` with ``s2 = max(2 eps**2 C M^-1 - eps**4, 1e-16)``;
4. position ``theta <- theta + v`` (with the new ``v``).

The ``- eps**4`` is the paper's gradient-noise correction (``B = eps V / 2`` with ``V`` estimated by ``v_hat``,
i.e. all of ``E[G**2]`` is taken for minibatch noise, which it nearly is when ``B << N``). Minibatch noise adds
a momentum variance ``eps**4 V / v_hat <= eps**4``, so the correction cancels it at most; with exact (full-batch)
gradients it over-corrects, and the stationary variance is too small by a relative ``~ eps**2 / (2 C M^-1)``.
The Theano and TensorFlow reference code computes ``M^-1`` from ``v_hat`` before the step's adaptation; this
module (like ``pybnn``'s PyTorch sampler) uses the adapted value, which bounds the first step's drift by
``sqrt(2) eps**2`` per coordinate whatever the gradient's scale; both agree once the estimates are frozen.

**Step size.** ``eps`` multiplies a gradient of the *full-data* ``U`` here (``N / B`` times a minibatch sum of
``-log p(y_i | theta)`` gradients, plus ``-grad log p(theta)``), and ``v_hat`` estimates its square. The
reference code (``sgmcmc``, the authors' Theano sampler used by RoBO, and ``pysgmcmc``) instead feeds the
gradient of ``U / N`` and writes its step as ``lr / sqrt(N)`` (in the noise) and ``lr`` (in the drift). Both
terms of the update depend only on ``eps**2 M^-1``, and ``M^-1`` of ``U / N`` is ``N`` times ``M^-1`` of ``U``,
so that code is exactly this kernel with ``eps = lr`` (and its ``tau, g, v_hat`` started at ``1, N, N**2`` in
these units instead of ``1, 1, 1``, a difference the adaptation forgets within a few steps; ``pysgmcmc``'s
``- (lr / sqrt(N))**4`` is ``- lr**4 / N**2`` in these units). Hence :func:`sghmc_model` uses ``eps = lr`` by
default (``lr_scaling="none"``). ``lr_scaling="sqrt_n"`` sets ``eps = lr / sqrt(N)`` on the full-data
gradient: a ``sqrt(N)`` times smaller step, which in the overdamped regime mixes ``N`` times more slowly.
``lr_scaling="sqrt_lr"`` sets ``eps = sqrt(lr)``, the convention of one version of the PyTorch code (``pybnn``'s
Bohamiann passed ``sqrt(lr)`` from October 2018 to February 2019, with a correction of ``eps**4 / N**2``; before
and since, it passes ``lr`` itself, as the Theano code does). The ``eps`` used is recorded in the
result.

**Minibatches** (``batch_size = B < N``): per-epoch shuffles. Epoch ``e`` (of ``N // B`` steps) draws a random
permutation of the ``N`` points and step ``b`` of it uses the points ``perm[b B : (b + 1) B]``: sampling without
replacement within a step and within an epoch; the ``N mod B`` points left over start no batch in that epoch.
Every batch is a uniformly random ``B``-subset, so the gradient is unbiased. ``B = N`` uses the exact gradient
(no shuffling).

**Randomness.** ``k_init, k_restarts = split(key)``; ``k_init`` draws the starting points (prior draws, as
:func:`metropolis_model`); restart ``c`` owns ``k_noise, k_batch = split(split(k_restarts, n_restarts)[c])``.
Step ``t`` (0-based, burn-in included) draws its momentum noise with ``fold_in(k_noise, t)`` (passed as the key
of :func:`sghmc_step`) and epoch ``e`` its permutation with ``permutation(fold_in(k_batch, e), N)``, so the
draws do not depend on how the run is cut into chunks (progress bar or not).

**Divergence.** Steps too large for the posterior's curvature make a restart overflow to NaN/Inf; the first
step at which a restart's position is non-finite is tracked on the device. By default :func:`sghmc_model`
raises :class:`~bootens_core.checks.DivergedParticlesError` (as :func:`ensemble.train` does);
``on_diverged="report"`` returns and flags them in ``info["diverged"]``.

Example::

    res = samplers.sghmc_model(key, model, x, y, noise_var=0.01, n_restarts=10, n_draws=20, burn_in=2000,
                           thin=2000, lr=1e-3, mdecay=0.01, batch_size=20)
    res.params        # leaves (10, 20, ...)

The kernel alone (any pytree, or a flat vector)::

    state = sghmc_init(theta0)
    state, info = sghmc_step(key, state, grad_U(state.position), SGHMCHyper(1e-3, 0.01), adapt=True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..checks import DivergedParticlesError
from ..driver import Chunk, ProgramCache, run_chunks
from ..models import Model, Params, float_dtype, prior_logpdf, program_key, zeros
from ..perturb import gaussian_loglik
from ._common import (
    MCMCResult,
    _check_initial,
    _count,
    _flat_init,
    _positive,
    _prepare,
    unravel_draws,
    log_density_fn,
)

__all__ = ["SGHMCHyper", "SGHMCInfo", "SGHMCState", "sghmc_init", "sghmc_model", "sghmc_step"]

NOISE_VAR_FLOOR = 1e-16  # lower bound of the injected momentum-noise variance (as the reference)
LR_SCALINGS = ("none", "sqrt_n", "sqrt_lr")
DEFAULT_BATCH_SIZE = 20  # the reference implementation's minibatch size
_MAX_STEPS = 2**31 - 1  # the global step counter is an int32


class SGHMCState(NamedTuple):
    """State of one chain; every field is a pytree like the position (or a flat vector).

    Attributes:
        position: ``theta``.
        momentum: ``v`` (the position increment of the next step, in the units of ``theta``).
        tau: adaptive averaging window of the burn-in estimates.
        g: running mean of the gradient.
        v_hat: running mean of the squared gradient; ``M^-1 = 1 / sqrt(v_hat)``.
    """

    position: Params
    momentum: Params
    tau: Params
    g: Params
    v_hat: Params


class SGHMCHyper(NamedTuple):
    """Hyper-parameters of :func:`sghmc_step` (scalars or 0-d arrays; data, not static, so they never recompile).

    Attributes:
        step_size: ``eps`` (see the module docstring for its relation to the user-facing ``lr``).
        mdecay: momentum decay ``C`` in ``(0, 1]``.
    """

    step_size: Any
    mdecay: Any


class SGHMCInfo(NamedTuple):
    """What :func:`sghmc_step` computed on the way, pytrees like the position.

    Attributes:
        minv: the preconditioner ``M^-1 = 1 / sqrt(v_hat)`` used by the step.
        noise_var: the variance of the momentum noise injected by the step.
    """

    minv: Params
    noise_var: Params


def sghmc_init(position: Params) -> SGHMCState:
    """The initial state at ``position``: zero momentum and ``tau = g = v_hat = 1`` (the reference's start)."""
    ones = jax.tree.map(jnp.ones_like, position)
    return SGHMCState(
        position=position,
        momentum=jax.tree.map(jnp.zeros_like, position),
        tau=ones,
        g=ones,
        v_hat=ones,
    )


def sghmc_step(
    key: jax.Array, state: SGHMCState, grad: Params, hyper: SGHMCHyper, adapt: bool | jax.Array
) -> tuple[SGHMCState, SGHMCInfo]:
    """One step of scale-adapted SGHMC (the update equations are in the module docstring).

    Args:
        key: PRNG key of the momentum noise: ``z = jax.random.normal(key, (m,), dtype)`` for the position
            raveled by :func:`jax.flatten_util.ravel_pytree` (``m`` parameters), mapped back onto its leaves;
            a flat-vector state and the same state as a pytree therefore take identical steps.
        state: the current state.
        grad: ``grad U`` at ``state.position`` (a pytree like it), ``U`` the negative log posterior, on the full-
            data scale (a minibatch estimate is fine).
        hyper: step size and momentum decay.
        adapt: update ``tau, g, v_hat`` (the burn-in) or keep them; a Python bool or a traced boolean scalar.

    Returns:
        ``(new_state, info)``.
    """
    flat, unravel = ravel_pytree(state.position)
    z = unravel(jax.random.normal(key, flat.shape, flat.dtype))
    adapt = jnp.asarray(adapt, bool)
    tree = jax.tree.map

    # 1. burn-in adaptation; every right-hand side uses the state before the step.
    r = tree(lambda tau: 1 / (tau + 1), state.tau)
    tau = tree(lambda tau, g, vh: jnp.where(adapt, tau - tau * g * g / vh + 1, tau), state.tau, state.g, state.v_hat)
    g = tree(lambda g, r, gr: jnp.where(adapt, g - r * g + r * gr, g), state.g, r, grad)
    v_hat = tree(lambda vh, r, gr: jnp.where(adapt, vh - r * vh + r * gr * gr, vh), state.v_hat, r, grad)
    # 2. preconditioner from the adapted estimate; 3. momentum; 4. position.
    minv = tree(lambda vh: 1 / jnp.sqrt(vh), v_hat)

    def noise_variance(minv):
        eps = jnp.asarray(hyper.step_size, minv.dtype)
        c = jnp.asarray(hyper.mdecay, minv.dtype)
        return jnp.maximum(2 * eps**2 * c * minv - eps**4, jnp.asarray(NOISE_VAR_FLOOR, minv.dtype))

    def new_momentum(v, minv, gr, s2, z):
        eps = jnp.asarray(hyper.step_size, v.dtype)
        c = jnp.asarray(hyper.mdecay, v.dtype)
        return v - eps**2 * minv * gr - c * v + jnp.sqrt(s2) * z

    noise_var = tree(noise_variance, minv)
    momentum = tree(new_momentum, state.momentum, minv, grad, noise_var, z)
    position = tree(jnp.add, state.position, momentum)
    return SGHMCState(position, momentum, tau, g, v_hat), SGHMCInfo(minv, noise_var)


# ------------------------------------------------------------------------------------------ model driver


class _Carry(NamedTuple):
    """All restarts: the SGHMC states (leaves ``(R, m)``), the current epoch's permutations ``(R, N)`` (``(R, 0)``
    for full batches), the global step ``t`` and the first step with a non-finite position (``-1``: none)."""

    state: SGHMCState
    perm: jax.Array
    step: jax.Array
    first_bad: jax.Array


_DRIVERS = ProgramCache(16)


def _drivers(model: Model, n: int, batch_size: int, dtype: Any) -> tuple[Callable, Callable]:
    """``(run, log_densities)`` of :func:`_driver`, cached by the model's program key, data size, batch size and
    dtype, so that repeated runs (restarts in chunks, a grid of noise variances, equal models) compile once."""
    key = (program_key(model), n, batch_size, jnp.dtype(dtype).name)
    return _DRIVERS.get(key, lambda: _driver(model, n, batch_size, dtype))


def _driver(model: Model, n: int, batch_size: int, dtype: Any) -> tuple[Callable, Callable]:
    """The one jitted SGHMC driver: an outer ``lax.scan`` over ``n_keep`` kept states (static) around an inner
    ``lax.fori_loop`` over steps; slot 0 keeps the state after ``first`` more steps, later slots after ``thin``
    more. Step counts, the burn-in length, the data and the hyper-parameters are arguments, so runs of any length
    share a compilation. Also returns the jitted full-data log joint of a batch of flat states (data as
    arguments too)."""
    _, unravel = ravel_pytree(zeros(model, dtype))
    minibatch = batch_size < n
    n_batches = n // batch_size
    scale = n / batch_size

    def potential(theta, x, y, noise_var):
        params = unravel(theta)
        return -(scale * gaussian_loglik(model.apply(params, x), y, noise_var) + prior_logpdf(model, params))

    grad_u = jax.grad(potential)
    all_steps = jax.vmap(sghmc_step, in_axes=(0, 0, 0, None, None))

    def run(noise_keys, batch_keys, carry, data, hyper, burn_in, first, thin, n_keep):
        x, y, noise_var = data

        def body(_, c: _Carry) -> _Carry:
            t = c.step
            perm = c.perm
            if minibatch:
                epoch, b = t // n_batches, t % n_batches

                def shuffle():
                    keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(batch_keys, epoch)
                    return jax.vmap(lambda k: jax.random.permutation(k, n).astype(jnp.int32))(keys)

                # The predicate is the same for all restarts (not batched): a real branch, one shuffle per epoch.
                perm = jax.lax.cond(b == 0, shuffle, lambda: perm)
                idx = jax.lax.dynamic_slice_in_dim(perm, b * batch_size, batch_size, axis=1)
                grads = jax.vmap(lambda th, i: grad_u(th, x[i], y[i], noise_var[i]))(c.state.position, idx)
            else:
                grads = jax.vmap(grad_u, in_axes=(0, None, None, None))(c.state.position, x, y, noise_var)
            keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(noise_keys, t)
            state, _ = all_steps(keys, c.state, grads, hyper, t < burn_in)
            finite = jnp.all(jnp.isfinite(state.position), axis=1)
            first_bad = jnp.where((c.first_bad < 0) & ~finite, t, c.first_bad)
            return _Carry(state, perm, t + 1, first_bad)

        def keep(c, i):
            c = jax.lax.fori_loop(0, jnp.where(i == 0, first, thin), body, c)
            return c, c.state.position

        return jax.lax.scan(keep, carry, jnp.arange(n_keep, dtype=jnp.int32))

    def log_densities(thetas, x, y, noise_var):
        log_density, _ = log_density_fn(model, x, y, noise_var)
        return jax.vmap(log_density)(thetas)

    return jax.jit(run, static_argnums=8), jax.jit(log_densities)


def sghmc_model(
    key: jax.Array,
    model: Model,
    x: Any,
    y: Any,
    noise_var: float | Any,
    *,
    n_restarts: int = 10,
    n_draws: int = 20,
    burn_in: int = 2000,
    thin: int = 2000,
    lr: float = 1e-3,
    mdecay: float = 0.01,
    batch_size: int | None = None,
    lr_scaling: str = "none",
    init: Params | None = None,
    on_diverged: str = "raise",
    progress: bool | str = False,
    dtype: Any = None,
) -> MCMCResult:
    """Scale-adapted SGHMC on the posterior of ``model`` given ``(x, y)``: likelihood ``N(y | f(theta, x),
    noise_var)`` and the model's diagonal Gaussian prior (the log joint of :func:`log_density_fn`).

    Every restart starts at an independent prior draw (unless ``init`` is given), runs ``burn_in`` adapting
    steps, then ``n_draws * thin`` steps with the adaptation frozen, keeping the state after steps
    ``burn_in + thin``, ``burn_in + 2 thin``, ...; only the kept states are stored. All restarts move together
    (``jax.vmap`` inside one ``jax.lax.scan``).

    Args:
        key: PRNG key (its use is documented in the module docstring).
        model: the model and its prior.
        x, y: training data, validated by :func:`~bootens_core.checks.check_data` (shapes, no NaN/Inf).
        noise_var: likelihood variance ``sigma^2``, scalar or one per point.
        n_restarts: independent chains (the paper: 10).
        n_draws: kept states per restart (the paper: 20, i.e. 200 in all).
        burn_in: adapting steps before the first kept state is approached (the paper: 2000).
        thin: steps between kept states (the paper: 2000).
        lr: the user-facing learning rate (the paper: 0.001); the step size ``eps`` follows from it by
            ``lr_scaling``.
        mdecay: momentum decay ``C`` in ``(0, 1]`` (the paper: 0.01).
        batch_size: minibatch size ``B <= N`` (per-epoch shuffles; ``B = N`` gives exact full-batch gradients).
            ``None``: ``min(20, N)``, the reference implementation's (the paper does not state one).
        lr_scaling: ``"none"`` (default): ``eps = lr``, the dynamics of the reference implementation (its
            ``lr / sqrt(N)`` on the per-point gradient); ``"sqrt_n"``: ``eps = lr / sqrt(N)`` on the full-data
            gradient; ``"sqrt_lr"``: ``eps = sqrt(lr)`` (one ``pybnn`` version). See the module docstring.
        init: a parameter pytree whose leaves have a leading ``n_restarts`` axis (starting points).
        on_diverged: ``"raise"`` (default): raise :class:`~bootens_core.checks.DivergedParticlesError` if a
            restart's position became NaN/Inf; ``"report"``: return them, flagged in ``info["diverged"]``.
        progress: show a tqdm progress bar over the kept states (a string sets its label); same draws.
        dtype: float dtype of data and chains (float32 for large networks); default JAX's default float,
            see :func:`~bootens_core.models.float_dtype`.

    Returns:
        :class:`MCMCResult` with ``params`` (leaves ``(n_restarts, n_draws, ...)``), ``log_density`` (the full-
        data log joint ``log p(D, theta)`` of every kept state), ``accept_rate`` (NaN: SGHMC has no accept
        step), ``info`` (JSON-able: ``lr``, ``mdecay``, ``step_size``, ``lr_scaling``, ``batch_size``,
        ``n_data``, ``minibatches``, ``burn_in``, ``thin``, ``n_steps_per_chain``; per restart
        ``diverged``, ``first_nonfinite_step`` (``None`` if none) and ``minv_median/min/max``, the frozen
        preconditioner ``M^-1`` over the parameters; and ``n_diverged``) and ``sampler``.
    """
    n_restarts = _count("n_restarts", n_restarts, 1)
    n_draws = _count("n_draws", n_draws, 1)
    thin = _count("thin", thin, 1)
    burn_in = _count("burn_in", burn_in, 0)
    lr = _positive("lr", lr)
    mdecay = _positive("mdecay", mdecay)
    if mdecay > 1:
        raise ValueError(f"mdecay must lie in (0, 1] (the momentum keeps a fraction 1 - mdecay), got {mdecay!r}")
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(f"lr_scaling must be one of {LR_SCALINGS}, got {lr_scaling!r}")
    if on_diverged not in ("raise", "report"):
        raise ValueError(f"on_diverged must be 'raise' or 'report', got {on_diverged!r}")
    n_steps = burn_in + n_draws * thin
    if n_steps > _MAX_STEPS:
        raise ValueError(f"burn_in + n_draws * thin = {n_steps} steps exceeds the limit of {_MAX_STEPS}")
    dtype = float_dtype(dtype)
    x, y, noise_var = _prepare(x, y, noise_var, dtype)
    n = int(y.shape[0])
    if batch_size is None:
        batch = min(DEFAULT_BATCH_SIZE, n)
    else:
        batch = _count("batch_size", batch_size, 1)
        if batch > n:
            raise ValueError(
                f"batch_size must be at most the number of training points N = {n}, got {batch}"
            )
    eps = {"none": lr, "sqrt_n": lr / math.sqrt(n), "sqrt_lr": math.sqrt(lr)}[lr_scaling]

    k_init, k_restarts = jax.random.split(key)
    flat0 = _flat_init(k_init, model, init, n_restarts, dtype)
    run, log_densities = _drivers(model, n, batch, dtype)
    _check_initial(np.asarray(log_densities(flat0, x, y, noise_var)))
    keys = jax.vmap(jax.random.split)(jax.random.split(k_restarts, n_restarts))  # (R, 2) keys
    noise_keys, batch_keys = keys[:, 0], keys[:, 1]

    perm_len = n if batch < n else 0
    carry = _Carry(
        sghmc_init(flat0),
        jnp.zeros((n_restarts, perm_len), jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.full((n_restarts,), -1, jnp.int32),
    )
    data = (x, y, jnp.broadcast_to(noise_var, y.shape))
    hyper = SGHMCHyper(jnp.asarray(eps, dtype), jnp.asarray(mdecay, dtype))
    i32 = jnp.int32

    def advance(carry, first, n_keep):
        return run(noise_keys, batch_keys, carry, data, hyper, i32(burn_in), first, i32(thin), n_keep)

    # A chunk's arguments: steps to its first kept state and the kept states (one per chunk with a bar).
    if not progress:
        plan = [Chunk((i32(burn_in + thin), n_draws), n_steps)]
    else:
        plan = [Chunk((i32(burn_in + thin if i == 0 else thin), 1), burn_in + thin if i == 0 else thin)
                for i in range(n_draws)]
    carry, outputs = run_chunks(advance, carry, plan, progress=progress, label="SGHMC")
    positions = outputs[0] if len(outputs) == 1 else jnp.concatenate(outputs)

    draws = jnp.swapaxes(positions, 0, 1)  # (R, n_draws, m)
    first_bad = np.asarray(carry.first_bad)
    diverged = first_bad >= 0
    if diverged.any() and on_diverged == "raise":
        raise DivergedParticlesError(
            f"{int(diverged.sum())} of {n_restarts} SGHMC restarts diverged to NaN/Inf (first at step "
            f"{int(first_bad[diverged].min())} of {n_steps}; burn-in {burn_in}) with lr = {lr:g} (step size "
            f"{eps:g}), mdecay = {mdecay:g}. Lower lr, or pass on_diverged='report' to keep the finite restarts.",
            diverged,
            int(first_bad[diverged].min()),
        )
    m = draws.shape[-1]
    logps = log_densities(draws.reshape(-1, m), x, y, noise_var).reshape(n_restarts, n_draws)
    minv = np.asarray(1 / jnp.sqrt(carry.state.v_hat), np.float64)
    minibatches = (
        f"per-epoch shuffles, {batch} of {n} points per step without replacement" if batch < n else "full batch"
    )
    info = {
        "lr": lr,
        "mdecay": mdecay,
        "step_size": eps,
        "lr_scaling": lr_scaling,
        "batch_size": batch,
        "n_data": n,
        "minibatches": minibatches,
        "burn_in": burn_in,
        "thin": thin,
        "n_steps_per_chain": n_steps,
        "diverged": diverged.tolist(),
        "n_diverged": int(diverged.sum()),
        "first_nonfinite_step": [int(s) if s >= 0 else None for s in first_bad],
        "minv_median": np.median(minv, axis=1).tolist(),
        "minv_min": minv.min(axis=1).tolist(),
        "minv_max": minv.max(axis=1).tolist(),
    }
    sampler = (
        f"scale-adapted SGHMC, lr {lr:g} (step size {eps:g}), mdecay {mdecay:g}, "
        f"{'full batch' if batch == n else f'batch {batch} of {n}'}, {n_restarts} restarts, "
        f"burn-in {burn_in}, thin {thin}"
    )
    return MCMCResult(
        params=unravel_draws(model, draws),
        log_density=np.asarray(logps),
        accept_rate=np.full(n_restarts, np.nan),
        info=info,
        sampler=sampler,
    )
