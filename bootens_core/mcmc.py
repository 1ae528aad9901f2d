"""Reference samplers of the unperturbed posterior ``p(theta | D)``, and their convergence diagnostics.

- :func:`metropolis` / :func:`metropolis_model`: random-walk Metropolis-Hastings with a Gaussian proposal
  ``N(theta, proposal_var I)``, the paper's reference for its nonlinear examples (Appendix: 10 restarts from
  prior draws, a burn-in, then one kept state every ``thin`` steps). All chains move together (``jax.vmap``
  over chains inside ``jax.lax.scan`` over steps); only the kept states are stored, so chains of hundreds of
  thousands of steps on models with tens of thousands of parameters fit in memory.
- :func:`nuts_model`: NumPyro's NUTS on the same flattened log joint (a faster reference where gradients help).
- :func:`rhat`, :func:`ess`: ArviZ's rank-normalised split R-hat and effective sample sizes;
  :func:`predictive_diagnostics` applies them to the predictive function values, as the paper reports R-hat
  "on the predictive models".

Randomness of :func:`metropolis`: chain ``c`` owns ``chain_key = jax.random.split(key, n_chains)[c]``; step
``t`` (0-based, burn-in included) uses ``k_proposal, k_accept = jax.random.split(jax.random.fold_in(chain_key,
t))``. Draws therefore do not depend on how the run is cut into chunks (progress bars or not).

NumPyro and ArviZ are optional (the ``mcmc`` extra) and imported only inside the functions that need them.

Example::

    res = mcmc.metropolis_model(key, model, x, y, noise_var=0.01, n_chains=10, proposal_var=0.5,
                                n_draws=20, burn_in=10_000, thin=5_000)
    mcmc.predictive_diagnostics(model, res, x_grid)["rhat_mean"]
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .ensemble import check_data
from .models import Model, Params
from .perturb import log_joint

__all__ = [
    "MCMCResult",
    "ess",
    "log_density_fn",
    "metropolis",
    "metropolis_model",
    "nuts_model",
    "predictive_diagnostics",
    "rhat",
]

_MAX_STEPS = 2**32 - 1  # the step counter folded into the keys is a uint32
_PROGRESS_CHUNKS = 50


class MCMCResult(NamedTuple):
    """What :func:`metropolis_model` and :func:`nuts_model` return.

    Attributes:
        params: kept draws, a pytree like the model's parameters whose leaves have leading axes
            ``(n_chains, n_draws)``.
        log_density: ``(n_chains, n_draws)`` unnormalised log joint ``log p(D, theta)`` of every kept draw.
        accept_rate: ``(n_chains,)``: for MH the acceptance rate over the post-burn-in steps; for NUTS the
            mean acceptance probability of the sampling phase.
        info: JSON-able facts about the sampler. MH: ``proposal_var``, ``burn_in``, ``thin``,
            ``n_steps_per_chain``, ``accept_rate_burn_in`` (per chain; ``None`` entries without burn-in).
            NUTS: ``step_size``, ``n_divergent``, ``mean_num_steps`` (leapfrog steps per draw), each per chain,
            and ``max_tree_depth``, ``target_accept``, ``n_warmup``.
        sampler: one-line description of the sampler and its settings.
    """

    params: Params
    log_density: np.ndarray
    accept_rate: np.ndarray
    info: dict
    sampler: str


# --------------------------------------------------------------------------------------------- validation


def _count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int ``>= minimum``, else a ValueError naming ``name``."""
    integral = isinstance(value, int | np.integer) or (
        isinstance(value, float | np.floating) and float(value).is_integer()
    )
    if isinstance(value, bool) or not integral:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {v}")
    return v


def _positive(name: str, value: Any) -> float:
    v = float(value)
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return v


def _check_initial(log_densities: np.ndarray) -> None:
    bad = np.nonzero(~np.isfinite(log_densities))[0]
    if bad.size:
        raise ValueError(
            f"log density is not finite at the initial state of chain(s) {bad[:10].tolist()}"
            f"{'...' if bad.size > 10 else ''} (values {log_densities[bad[:3]].tolist()}); "
            "start those chains where the log density is finite"
        )


def _leaf_specs(model: Model) -> tuple[list[tuple[int, ...]], Any]:
    """Leaf shapes of one parameter draw (in :func:`models.ravel` order) and the tree structure."""

    def is_shape(s: Any) -> bool:
        return isinstance(s, tuple) and all(isinstance(d, int) for d in s)

    shapes, treedef = jax.tree.flatten(model.shapes, is_leaf=is_shape)
    return shapes, treedef


def _template(model: Model, dtype: Any) -> Params:
    """Zero parameters of ``model`` (the structure and shapes of one draw)."""
    shapes, treedef = _leaf_specs(model)
    return jax.tree.unflatten(treedef, [jnp.zeros(s, dtype) for s in shapes])


def _prepare(x: Any, y: Any, noise_var: Any, dtype: Any):
    x, y = check_data(x, y, noise_var)
    return x.astype(dtype), y.astype(dtype), jnp.asarray(noise_var, dtype)


def _flat_init(key: jax.Array, model: Model, init: Params | None, n_chains: int, dtype: Any) -> jax.Array:
    """Starting points ``(n_chains, m)``: independent prior draws, or the given pytree after checking it."""
    shapes, treedef = _leaf_specs(model)
    if init is None:
        # theta_0 = prior_sd * N(0, I_m): one normal draw for all leaves (a sampler per leaf, as
        # models.prior_sample does, costs one XLA compilation per leaf shape).
        sd = np.concatenate(
            [np.full(math.prod(s), math.sqrt(v)) for s, v in zip(shapes, treedef.flatten_up_to(model.prior_var), strict=True)]
        )
        return jnp.asarray(sd, dtype) * jax.random.normal(key, (n_chains, sd.size), dtype)
    try:
        leaves = treedef.flatten_up_to(init)
    except (ValueError, TypeError) as err:
        raise ValueError(f"init must be a parameter pytree like {treedef} with a leading n_chains axis: {err}") from None
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(_template(model, dtype))[0]]
    for path, leaf, shape in zip(paths, leaves, shapes, strict=True):
        if tuple(np.shape(leaf)) != (n_chains, *shape):
            raise ValueError(
                f"init leaf {path or '<root>'} has shape {tuple(np.shape(leaf))}, expected (n_chains, ...) = "
                f"{(n_chains, *shape)}"
            )
    return jnp.asarray(np.concatenate([np.asarray(leaf).reshape(n_chains, -1) for leaf in leaves], axis=1), dtype)


# ---------------------------------------------------------------------------------------- log density


def log_density_fn(
    model: Model, x: Any, y: Any, noise_var: float | Any
) -> tuple[Callable[[jax.Array], jax.Array], Callable[[jax.Array], Params]]:
    """The unnormalised log posterior of ``model`` on ``(x, y)`` as a function of one flat parameter vector.

    Args:
        model: the model and its prior.
        x, y: training inputs and labels (their float dtype, float64 for integer labels, is the dtype of the
            parameters).
        noise_var: likelihood variance ``sigma^2``, scalar or one per point.

    Returns:
        ``(log_density, unravel)``: ``log_density(theta) = log p(D, theta)`` (:func:`perturb.log_joint`) for a
        vector ``theta`` of length ``m``, and ``unravel(theta)`` -> the parameter pytree.
    """
    x, y = jnp.asarray(x), jnp.asarray(y)
    dtype = y.dtype if jnp.issubdtype(y.dtype, jnp.floating) else jnp.float64
    x = x.astype(dtype) if not jnp.issubdtype(x.dtype, jnp.floating) else x
    y = y.astype(dtype)
    noise_var = jnp.asarray(noise_var, dtype)
    _, unravel = ravel_pytree(_template(model, dtype))

    def log_density(theta: jax.Array) -> jax.Array:
        return log_joint(model, unravel(theta), x, y, noise_var)

    return log_density, unravel


# ------------------------------------------------------------------------------------ Metropolis-Hastings


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
        init = init.astype(jnp.float64)
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

    if not progress:
        state, (positions, logps) = run(
            chain_keys, state, scale, u32(burn_in), u32(burn_in + thin), u32(thin), n_draws, n_draws
        )
    else:
        from tqdm.auto import tqdm

        # About _PROGRESS_CHUNKS calls of the same compiled driver, each of at most `chunk` steps (or one
        # thinning interval): a call either advances without keeping (inside the burn-in or a long thinning
        # interval) or runs to the next kept state and keeps it and the ones that follow within the chunk.
        chunk = max(1, math.ceil(n_steps / _PROGRESS_CHUNKS))
        n_keep = min(n_draws, 1 + chunk // thin)
        kept_pos, kept_lp = [], []
        bar = tqdm(total=n_steps, desc=progress if isinstance(progress, str) else "MH", unit="step")
        try:
            t = kept = 0
            while kept < n_draws:
                next_keep = burn_in + thin * (kept + 1)
                if t + chunk < next_keep:
                    state, _ = run(chain_keys, state, scale, u32(burn_in), u32(chunk), u32(0), 1, n_keep)
                    advanced = chunk
                else:
                    n = min(n_keep, n_draws - kept, 1 + (t + chunk - next_keep) // thin)
                    state, (pos, lp) = run(
                        chain_keys, state, scale, u32(burn_in), u32(next_keep - t), u32(thin), n, n_keep
                    )
                    kept_pos.append(pos[:n])
                    kept_lp.append(lp[:n])
                    kept += n
                    advanced = next_keep - t + (n - 1) * thin
                jax.block_until_ready(state.position)
                t += advanced
                bar.update(advanced)
        finally:
            bar.close()
        positions, logps = jnp.concatenate(kept_pos), jnp.concatenate(kept_lp)

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


def _unravel_draws(model: Model, flat: Any) -> Params:
    """``(C, n, m)`` flat draws -> a pytree with numpy leaves of leading axes ``(C, n)`` (host-side inverse of
    :func:`models.ravel`: leaves in tree order, each raveled in C order)."""
    flat = np.asarray(flat)
    shapes, treedef = _leaf_specs(model)
    sizes = [math.prod(s) for s in shapes]
    parts = np.split(flat, np.cumsum(sizes)[:-1], axis=-1)
    return jax.tree.unflatten(treedef, [p.reshape(*flat.shape[:2], *s) for p, s in zip(parts, shapes, strict=True)])


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
    dtype: Any = jnp.float64,
) -> MCMCResult:
    """Random-walk MH (:func:`metropolis`) on the posterior of ``model`` given ``(x, y)``.

    Chains start at independent prior draws (the paper's "restarts initialised from the prior") unless
    ``init`` is given.

    Args:
        key: PRNG key, split into the initialisation key and the chains' key.
        model: the model and its prior.
        x, y: training data, validated by :func:`ensemble.check_data` (no NaN/Inf).
        noise_var: likelihood variance ``sigma^2``.
        n_chains: number of independent chains (restarts).
        proposal_var, n_draws, burn_in, thin, progress: see :func:`metropolis`.
        init: a parameter pytree whose leaves have a leading ``n_chains`` axis.
        dtype: float dtype of data and chains (float32 for large networks).
    """
    n_chains = _count("n_chains", n_chains, 1)
    _count("n_draws", n_draws, 1), _count("thin", thin, 1), _count("burn_in", burn_in, 0)
    _positive("proposal_var", proposal_var)
    k_init, k_chains = jax.random.split(key)
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
        params=_unravel_draws(model, draws),
        log_density=np.asarray(logps),
        accept_rate=np.asarray(acc, np.float64),
        info=info,
        sampler=sampler,
    )


# ------------------------------------------------------------------------------------------------- NUTS


def nuts_model(
    key: jax.Array,
    model: Model,
    x: Any,
    y: Any,
    *,
    noise_var: float | Any,
    n_chains: int,
    n_warmup: int,
    n_draws: int,
    target_accept: float = 0.8,
    max_tree_depth: int = 10,
    init: Params | None = None,
    progress: bool = False,
    dtype: Any = jnp.float64,
) -> MCMCResult:
    """NumPyro's NUTS on the posterior of ``model``, with ``potential_fn = -log p(D, theta)`` on flat vectors.

    Chains start at independent prior draws unless ``init`` is given, adapt step size and a diagonal mass
    matrix during ``n_warmup`` steps, and run vectorised on one device (``chain_method="vectorized"``).

    Args:
        key: PRNG key, split into the initialisation key and the sampler's key.
        model, x, y, noise_var, n_chains, init, dtype: as in :func:`metropolis_model`.
        n_warmup: adaptation steps (discarded).
        n_draws: kept draws per chain (no thinning).
        target_accept: target mean acceptance probability of the step-size adaptation.
        max_tree_depth: maximal depth of the NUTS trees (at most ``2**max_tree_depth - 1`` leapfrog steps).
        progress: show NumPyro's progress bar.
    """
    with warnings.catch_warnings():
        # numpyro imports tqdm.auto, which warns in a notebook kernel without ipywidgets.
        warnings.filterwarnings("ignore", message="IProgress not found")
        from numpyro.infer import MCMC, NUTS

    n_chains = _count("n_chains", n_chains, 1)
    n_warmup = _count("n_warmup", n_warmup, 0)
    n_draws = _count("n_draws", n_draws, 1)
    max_tree_depth = _count("max_tree_depth", max_tree_depth, 1)
    target_accept = float(target_accept)
    if not 0 < target_accept < 1:
        raise ValueError(f"target_accept must lie in (0, 1), got {target_accept}")
    k_init, k_sampler = jax.random.split(key)
    x, y, noise_var = _prepare(x, y, noise_var, dtype)
    log_density, _ = log_density_fn(model, x, y, noise_var)
    flat0 = _flat_init(k_init, model, init, n_chains, dtype)
    _check_initial(np.asarray(jax.jit(jax.vmap(log_density))(flat0)))

    # NumPyro draws momenta in JAX's default float dtype (float64 under x64) and would mix them with float32
    # positions; its state stays in the default dtype and the model is evaluated in ``dtype``.
    state_dtype = jnp.result_type(float)
    flat0 = flat0.astype(state_dtype)

    def potential(theta: jax.Array) -> jax.Array:
        return -log_density(theta.astype(dtype)).astype(state_dtype)

    kernel = NUTS(potential_fn=potential, target_accept_prob=target_accept, max_tree_depth=max_tree_depth)
    sampler = MCMC(
        kernel,
        num_warmup=n_warmup,
        num_samples=n_draws,
        num_chains=n_chains,
        chain_method="vectorized",
        progress_bar=bool(progress),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not enough devices.*")
        sampler.run(
            k_sampler,
            init_params=flat0,
            extra_fields=("diverging", "accept_prob", "num_steps", "potential_energy"),
        )
    samples = np.asarray(sampler.get_samples(group_by_chain=True)).astype(dtype)
    extra = sampler.get_extra_fields(group_by_chain=True)
    step_size = np.asarray(sampler.last_state.adapt_state.step_size, np.float64).reshape(n_chains)
    diverging = np.asarray(extra["diverging"]).reshape(n_chains, n_draws)
    num_steps = np.asarray(extra["num_steps"], np.float64).reshape(n_chains, n_draws)
    accept = np.asarray(extra["accept_prob"], np.float64).reshape(n_chains, n_draws)
    info = {
        "step_size": step_size.tolist(),
        "n_divergent": diverging.sum(axis=1).astype(int).tolist(),
        "mean_num_steps": num_steps.mean(axis=1).tolist(),
        "max_tree_depth": max_tree_depth,
        "target_accept": target_accept,
        "n_warmup": n_warmup,
    }
    description = (
        f"NUTS (NumPyro), target accept {target_accept:g}, max tree depth {max_tree_depth}, "
        f"{n_chains} chains, warm-up {n_warmup}, {n_draws} draws"
    )
    return MCMCResult(
        params=_unravel_draws(model, samples),
        log_density=-np.asarray(extra["potential_energy"]).reshape(n_chains, n_draws).astype(dtype),
        accept_rate=accept.mean(axis=1),
        info=info,
        sampler=description,
    )


# ------------------------------------------------------------------------------------------ diagnostics


def _arviz():
    """Import ArviZ without its once-a-day FutureWarning (it would make notebook outputs vary by day)."""
    warnings.filterwarnings("ignore", message=r"\s*ArviZ is undergoing a major refactor", category=FutureWarning)
    import arviz

    return arviz


def _per_element(draws: Any, fn: Callable[[np.ndarray], float]) -> np.ndarray:
    arr = np.asarray(draws, np.float64)
    if arr.ndim < 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"draws must have shape (n_chains, n_draws, *event), got {arr.shape}")
    event = arr.shape[2:]
    flat = arr.reshape(arr.shape[0], arr.shape[1], -1)
    out = np.array([fn(flat[:, :, j]) for j in range(flat.shape[2])], np.float64)
    return out.reshape(event)


def rhat(draws: Any) -> np.ndarray:
    """ArviZ's rank-normalised split R-hat of every coordinate.

    Args:
        draws: ``(n_chains, n_draws, *event)``.

    Returns:
        ``event``-shaped array (NaN where it is undefined, e.g. a coordinate constant over all draws).
    """
    az = _arviz()
    with np.errstate(divide="ignore", invalid="ignore"):
        return _per_element(draws, lambda a: float(az.rhat(a, method="rank")))


def ess(draws: Any, kind: str = "bulk") -> np.ndarray:
    """ArviZ's effective sample size of every coordinate.

    Args:
        draws: ``(n_chains, n_draws, *event)``.
        kind: ``"bulk"`` (rank-normalised), ``"tail"`` (of the 5% and 95% quantiles), or ``"mean"`` (ESS of the
            plain mean, the one that sets its Monte-Carlo standard error).

    Returns:
        ``event``-shaped array.
    """
    if kind not in ("bulk", "tail", "mean"):
        raise ValueError(f"kind must be 'bulk', 'tail' or 'mean', got {kind!r}")
    az = _arviz()
    with np.errstate(divide="ignore", invalid="ignore"):
        return _per_element(draws, lambda a: float(az.ess(a, method=kind)))


def predictive_diagnostics(model: Model, result: MCMCResult, x_grid: Any) -> dict:
    """R-hat and ESS of the predictive function values ``f(x_grid)`` of the kept draws.

    The paper reports R-hat "on the predictive models": the convergence of the functions the samples
    define, which is what its comparisons use (parameters of a network are not identifiable).

    Args:
        model: the model the draws belong to.
        result: from :func:`metropolis_model` or :func:`nuts_model`.
        x_grid: ``(g,)`` or ``(g, d)`` inputs.

    Returns:
        ``{"rhat_max", "rhat_mean", "ess_bulk_min", "ess_tail_min", "ess_bulk_median", "n_chains",
        "n_draws"}`` as Python floats/ints; aggregates skip grid points where a statistic is undefined (a
        function value constant over all draws), and are NaN if it is undefined everywhere.
    """
    leaves = jax.tree.leaves(result.params)
    n_chains, n_draws = leaves[0].shape[:2]
    flat = jax.tree.map(lambda p: jnp.asarray(p).reshape(n_chains * n_draws, *p.shape[2:]), result.params)
    x_grid = jnp.asarray(x_grid, leaves[0].dtype)
    f = jax.jit(jax.vmap(model.apply, in_axes=(0, None)))(flat, x_grid)
    f = np.asarray(f).reshape(n_chains, n_draws, -1)
    r, eb, et = rhat(f), ess(f, "bulk"), ess(f, "tail")

    def agg(fn: Callable[[np.ndarray], Any], v: np.ndarray) -> float:
        v = v[np.isfinite(v)]
        return float(fn(v)) if v.size else float("nan")

    return {
        "rhat_max": agg(np.max, r),
        "rhat_mean": agg(np.mean, r),
        "ess_bulk_min": agg(np.min, eb),
        "ess_tail_min": agg(np.min, et),
        "ess_bulk_median": agg(np.median, eb),
        "n_chains": int(n_chains),
        "n_draws": int(n_draws),
    }
