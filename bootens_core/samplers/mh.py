"""Random-walk Metropolis-Hastings, all chains at once (the paper's reference sampler)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..driver import Chunk, run_chunks
from ..models import Model, Params, float_dtype
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

__all__ = ["metropolis", "metropolis_model"]

_MAX_STEPS = 2**32 - 1  # the step counter folded into the keys is a uint32
_PROGRESS_CHUNKS = 50


class _MHState(NamedTuple):
    """All chains: positions ``(C, m)``, their log densities ``(C,)``, acceptances counted during the burn-in
    and after it ``(C,)`` each, and the global step counter ``t`` (a ``uint32`` scalar shared by the chains)."""

    position: jax.Array
    log_density: jax.Array
    n_accepted_burn_in: jax.Array
    n_accepted: jax.Array
    step: jax.Array


def _mh_kernel(log_density: Callable[[jax.Array], jax.Array]):
    """One MH step of every chain: ``(chain_keys, state, scale, burn_in) -> state``."""

    def one_chain(chain_key, position, logp, t, scale):
        k_proposal, k_accept = jax.random.split(jax.random.fold_in(chain_key, t))
        proposal = position + scale * jax.random.normal(k_proposal, position.shape, position.dtype)
        logp_proposal = log_density(proposal).astype(logp.dtype)
        log_u = jnp.log(jax.random.uniform(k_accept, (), position.dtype))
        # NaN compares False; a non-finite proposal (-inf, +inf, NaN) is always rejected.
        accept = jnp.isfinite(logp_proposal) & (log_u < logp_proposal - logp)
        return jnp.where(accept, proposal, position), jnp.where(accept, logp_proposal, logp), accept

    all_chains = jax.vmap(one_chain, in_axes=(0, 0, 0, None, None))

    def step(chain_keys: jax.Array, state: _MHState, scale: jax.Array, burn_in: jax.Array) -> _MHState:
        position, logp, accept = all_chains(chain_keys, state.position, state.log_density, state.step, scale)
        in_burn_in = state.step < burn_in
        return _MHState(
            position,
            logp,
            state.n_accepted_burn_in + (accept & in_burn_in),
            state.n_accepted + (accept & ~in_burn_in),
            state.step + jnp.uint32(1),
        )

    return step


def _mh_driver(step):
    """The one jitted MH driver: an outer ``lax.scan`` over ``n_keep`` kept states (static) around an inner
    ``lax.fori_loop`` over steps. Slot ``i < n_valid`` keeps the state after ``first`` more steps (``i = 0``)
    or ``thin`` more steps (``i > 0``); slots ``i >= n_valid`` take no step (the caller drops them). Step
    counts are data, not shapes, so burn-in, thinning and any chunking share a single compilation."""

    def run(chain_keys, state, scale, burn_in, first, thin, n_valid, n_keep):
        def keep(s, i):
            n = jnp.where(i >= n_valid, 0, jnp.where(i == 0, first, thin))
            s = jax.lax.fori_loop(jnp.uint32(0), n, lambda _, s: step(chain_keys, s, scale, burn_in), s)
            return s, (s.position, s.log_density)

        return jax.lax.scan(keep, state, jnp.arange(n_keep, dtype=jnp.int32))

    return jax.jit(run, static_argnums=7)


def metropolis(
    key: jax.Array,
    log_density: Callable[[jax.Array], jax.Array],
    init: Any,
    *,
    proposal_var: float,
    n_draws: int,
    burn_in: int,
    thin: int,
    progress: bool | str = False,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Random-walk Metropolis-Hastings with Gaussian proposal ``N(theta, proposal_var I)`` on flat vectors.

    Every chain runs ``burn_in`` steps, then ``n_draws * thin`` steps keeping every ``thin``-th state (the state
    after steps ``burn_in + thin``, ``burn_in + 2 thin``, ...). A proposal is accepted iff
    ``log(u) < log_density(proposal) - log_density(current)`` with ``u ~ U(0, 1)``; proposals whose log density
    is NaN or infinite are rejected. The current log density is carried, never recomputed.

    Args:
        key: PRNG key; chain ``c`` uses ``jax.random.split(key, n_chains)[c]`` and step ``t`` of it the key
            ``fold_in(chain_key, t)`` (see the module docstring).
        log_density: ``theta (m,) -> scalar`` unnormalised log target (e.g. from :func:`log_density_fn`).
        init: ``(n_chains, m)`` starting states; their dtype is the dtype of the chains.
        proposal_var: variance of each coordinate of the random-walk increment.
        n_draws: kept states per chain.
        burn_in: discarded steps before the first kept one.
        thin: steps between kept states.
        progress: show a tqdm progress bar (a string sets its label); the run is then cut into about 50 chunks
            run by the same compiled function. Draws are identical with and without it.

    Returns:
        ``(draws, log_densities, accept_rate, accept_rate_burn_in)`` of shapes ``(n_chains, n_draws, m)``,
        ``(n_chains, n_draws)``, ``(n_chains,)`` (over the ``n_draws * thin`` sampling steps) and ``(n_chains,)``
        (over the burn-in steps; NaN when ``burn_in == 0``).
    """
    n_draws = _count("n_draws", n_draws, 1)
    thin = _count("thin", thin, 1)
    burn_in = _count("burn_in", burn_in, 0)
    scale = math.sqrt(_positive("proposal_var", proposal_var))
    init = jnp.asarray(init)
    if not jnp.issubdtype(init.dtype, jnp.floating):
        init = init.astype(float_dtype())
    if init.ndim != 2 or init.shape[0] < 1 or init.shape[1] < 1:
        raise ValueError(f"init must have shape (n_chains, m) with n_chains, m >= 1, got {init.shape}")
    n_steps = burn_in + n_draws * thin
    if n_steps > _MAX_STEPS:
        raise ValueError(f"burn_in + n_draws * thin = {n_steps} steps exceeds the limit of {_MAX_STEPS}")
    n_chains = init.shape[0]

    chain_keys = jax.random.split(key, n_chains)
    logp0 = jax.jit(jax.vmap(log_density))(init).astype(init.dtype)
    _check_initial(np.asarray(logp0))
    zeros = jnp.zeros((n_chains,), jnp.uint32)
    state = _MHState(init, logp0, zeros, zeros, jnp.zeros((), jnp.uint32))
    run = _mh_driver(_mh_kernel(log_density))
    scale = jnp.asarray(scale, init.dtype)
    u32 = jnp.uint32

    def advance(state, first, every, n_valid, n_keep):
        return run(chain_keys, state, scale, u32(burn_in), first, every, n_valid, n_keep)

    # A chunk's arguments: steps to its first kept state, steps between kept states, kept states, slots.
    if not progress:
        plan, kept_per_chunk = [Chunk((u32(burn_in + thin), u32(thin), n_draws, n_draws), n_steps)], [n_draws]
    else:
        # About _PROGRESS_CHUNKS calls of the same compiled driver, each of at most `chunk` steps (or one
        # thinning interval): a call either advances without keeping (inside the burn-in or a long thinning
        # interval) or runs to the next kept state and keeps it and the ones that follow within the chunk.
        chunk = max(1, math.ceil(n_steps / _PROGRESS_CHUNKS))
        n_keep = min(n_draws, 1 + chunk // thin)
        plan, kept_per_chunk = [], []
        t = kept = 0
        while kept < n_draws:
            next_keep = burn_in + thin * (kept + 1)
            if t + chunk < next_keep:
                plan.append(Chunk((u32(chunk), u32(0), 1, n_keep), chunk))
                kept_per_chunk.append(0)
            else:
                n = min(n_keep, n_draws - kept, 1 + (t + chunk - next_keep) // thin)
                plan.append(Chunk((u32(next_keep - t), u32(thin), n, n_keep), next_keep - t + (n - 1) * thin))
                kept_per_chunk.append(n)
                kept += n
            t += plan[-1].steps
    state, outputs = run_chunks(advance, state, plan, progress=progress, label="MH")
    kept_out = [(pos[:n], lp[:n]) for (pos, lp), n in zip(outputs, kept_per_chunk, strict=True) if n]
    if len(kept_out) == 1:
        positions, logps = kept_out[0]
    else:
        positions = jnp.concatenate([pos for pos, _ in kept_out])
        logps = jnp.concatenate([lp for _, lp in kept_out])

    accept_rate = np.asarray(state.n_accepted, np.float64) / (n_draws * thin)
    accept_burn = (
        np.asarray(state.n_accepted_burn_in, np.float64) / burn_in if burn_in else np.full(n_chains, np.nan)
    )
    return (
        jnp.swapaxes(positions, 0, 1),
        jnp.swapaxes(logps, 0, 1),
        jnp.asarray(accept_rate),
        jnp.asarray(accept_burn),
    )


def metropolis_model(
    key: jax.Array,
    model: Model,
    x: Any,
    y: Any,
    *,
    noise_var: float | Any,
    n_chains: int,
    proposal_var: float,
    n_draws: int,
    burn_in: int,
    thin: int,
    init: Params | None = None,
    progress: bool | str = False,
    dtype: Any = None,
) -> MCMCResult:
    """Random-walk MH (:func:`metropolis`) on the posterior of ``model`` given ``(x, y)``.

    Chains start at independent prior draws (the paper's "restarts initialised from the prior") unless
    ``init`` is given.

    Args:
        key: PRNG key, split into the initialisation key and the chains' key.
        model: the model and its prior.
        x, y: training data, validated by :func:`~bootens_core.checks.check_data` (no NaN/Inf).
        noise_var: likelihood variance ``sigma^2``.
        n_chains: number of independent chains (restarts).
        proposal_var, n_draws, burn_in, thin, progress: see :func:`metropolis`.
        init: a parameter pytree whose leaves have a leading ``n_chains`` axis.
        dtype: float dtype of data and chains (float32 for large networks); default JAX's default float,
            see :func:`~bootens_core.models.float_dtype`.
    """
    n_chains = _count("n_chains", n_chains, 1)
    _count("n_draws", n_draws, 1), _count("thin", thin, 1), _count("burn_in", burn_in, 0)
    _positive("proposal_var", proposal_var)
    k_init, k_chains = jax.random.split(key)
    dtype = float_dtype(dtype)
    x, y, noise_var = _prepare(x, y, noise_var, dtype)
    log_density, _ = log_density_fn(model, x, y, noise_var)
    flat0 = _flat_init(k_init, model, init, n_chains, dtype)
    draws, logps, acc, acc_burn = metropolis(
        k_chains, log_density, flat0, proposal_var=proposal_var, n_draws=n_draws, burn_in=burn_in, thin=thin,
        progress=progress,
    )
    acc_burn = np.asarray(acc_burn, np.float64)
    info = {
        "proposal_var": float(proposal_var),
        "burn_in": int(burn_in),
        "thin": int(thin),
        "n_steps_per_chain": int(burn_in) + int(n_draws) * int(thin),
        "accept_rate_burn_in": [None if np.isnan(a) else float(a) for a in acc_burn],
    }
    sampler = (
        f"random-walk MH, proposal N(0, {float(proposal_var):g} I), {n_chains} chains, "
        f"burn-in {int(burn_in)}, thin {int(thin)}"
    )
    return MCMCResult(
        params=unravel_draws(model, draws),
        log_density=np.asarray(logps),
        accept_rate=np.asarray(acc, np.float64),
        info=info,
        sampler=sampler,
    )


# ------------------------------------------------------------------------------------------------- NUTS
