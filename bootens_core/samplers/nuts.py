"""NumPyro's NUTS on a model's flat log joint."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..models import Model, Params, float_dtype
from ._common import MCMCResult, _check_initial, _count, _flat_init, _prepare, unravel_draws, log_density_fn

__all__ = ["nuts", "nuts_model", "NUTS_CHAIN_METHODS", "resolve_chain_method", "nuts_settings"]

#: How the chains can run, "vectorized" (one vmapped program for all chains), "sequential" (one chain after
#: another) or "auto" (sequential on a CPU, vectorized on an accelerator).
NUTS_CHAIN_METHODS = ("auto", "vectorized", "sequential")


def nuts_settings(n_warmup: Any, max_tree_depth: Any, target_accept: Any, chain_method: str, dtype: Any
                  ) -> tuple[int, int, float, str, Any]:
    """The settings NUTS takes, checked (one ``ValueError`` naming the first bad one) and resolved: ``(n_warmup,
    max_tree_depth, target_accept, chain method, dtype)`` (:func:`resolve_chain_method`, ``float_dtype``)."""
    n_warmup = _count("n_warmup", n_warmup, 0)
    max_tree_depth = _count("max_tree_depth", max_tree_depth, 1)
    target_accept = float(target_accept)
    if not 0 < target_accept < 1:
        raise ValueError(f"target_accept must lie in (0, 1), got {target_accept}")
    return n_warmup, max_tree_depth, target_accept, resolve_chain_method(chain_method), float_dtype(dtype)


def resolve_chain_method(chain_method: str) -> str:
    """The chain method NumPyro is given for ``chain_method`` (one of :data:`NUTS_CHAIN_METHODS`).

    Vectorized chains build their trees in one vmapped loop that runs until the deepest tree of all the
    chains is built, every chain computing a leapfrog step on every pass; sequential chains build only their
    own trees, but each pass costs its overhead once per chain. On a CPU (one core, NUTS alone, compile
    included) sequential chains win where a gradient is expensive: the deep-ReLU chapter's reference (4 chains,
    an 8-layer network of 18 001 parameters, 40 points) 165 s vectorized, 105 s sequential; and lose where it
    is cheap: the classification chapter's reference 11.6 s vectorized, 24.3 s sequential, a 1-layer network of
    50 units on 40 points (4 chains) 15.0 s and 20.8 s (10 units, 2 chains: 15.2 s and 11.1 s). "auto" is
    sequential on a CPU and vectorized on an accelerator, where the chains run side by side: for expensive
    gradients; the default stays "vectorized".
    """
    if chain_method not in NUTS_CHAIN_METHODS:
        raise ValueError(f"unknown NUTS chain_method {chain_method!r}: choose one of {', '.join(NUTS_CHAIN_METHODS)}")
    if chain_method == "auto":
        return "sequential" if jax.default_backend() == "cpu" else "vectorized"
    return chain_method


def nuts(
    key: jax.Array,
    log_density: Callable[[jax.Array], jax.Array],
    init: Any,
    *,
    n_warmup: int,
    n_draws: int,
    target_accept: float = 0.8,
    max_tree_depth: int = 10,
    progress: bool = False,
    dtype: Any = None,
    chain_method: str = "vectorized",
) -> tuple[np.ndarray, dict, np.ndarray, np.ndarray, str]:
    """NumPyro's NUTS on any log density of flat vectors, one chain per row of ``init``.

    Chains adapt step size and a diagonal mass matrix during ``n_warmup`` steps, then keep ``n_draws``
    states each (no thinning), on one device, vectorised or one after another (``chain_method``, see
    :func:`resolve_chain_method`; the two give the same chains up to rounding, which NUTS amplifies into
    other, equally valid draws).

    Args:
        key: the sampler's PRNG key.
        log_density: ``log p(theta)`` (unnormalised) of a vector ``theta`` of length ``m``, in ``dtype``
            (default JAX's default float, see :func:`~bootens_core.models.float_dtype`).
        init: ``(n_chains, m)`` starting points; the log density must be finite at each.
        n_warmup, n_draws, target_accept, max_tree_depth, progress, chain_method: as in :func:`nuts_model`.

    Returns:
        ``(samples, info, log_density, accept_rate, description)``: ``(n_chains, n_draws, m)`` draws, the
        :class:`MCMCResult` ``info`` dict, ``(n_chains, n_draws)`` log densities, per-chain mean acceptance
        probabilities and a one-line description.
    """
    with warnings.catch_warnings():
        # numpyro imports tqdm.auto, which warns in a notebook kernel without ipywidgets.
        warnings.filterwarnings("ignore", message="IProgress not found")
        from numpyro.infer import MCMC, NUTS

    n_warmup, max_tree_depth, target_accept, method, dtype = nuts_settings(
        n_warmup, max_tree_depth, target_accept, chain_method, dtype)
    n_draws = _count("n_draws", n_draws, 1)
    flat0 = jnp.asarray(init, dtype)
    if flat0.ndim != 2:
        raise ValueError(f"init must have shape (n_chains, m), got {flat0.shape}")
    n_chains = flat0.shape[0]
    _check_initial(np.asarray(jax.jit(jax.vmap(log_density))(flat0)))

    # NumPyro draws momenta in JAX's default float dtype (float64 under x64) and would mix them with float32
    # positions; its state stays in the default dtype and the model is evaluated in ``dtype``.
    state_dtype = jnp.result_type(float)
    flat0 = flat0.astype(state_dtype)

    # Compiled: NumPyro evaluates the potential and its gradient outside its compiled loop when it initialises
    # each chain, where op-by-op dispatch compiles every primitive of the gradient on its own (measured, the
    # deep-ReLU chapter's 8-layer network, 4 chains one after another, 3 warm-up steps: 62 s, compiled 32 s).
    @jax.jit
    def potential(theta: jax.Array) -> jax.Array:
        return -log_density(theta.astype(dtype)).astype(state_dtype)

    kernel = NUTS(potential_fn=potential, target_accept_prob=target_accept, max_tree_depth=max_tree_depth)
    sampler = MCMC(
        kernel,
        num_warmup=n_warmup,
        num_samples=n_draws,
        num_chains=n_chains,
        chain_method=method,
        progress_bar=bool(progress),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not enough devices.*")
        sampler.run(
            key,
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
        "chain_method": method,
    }
    description = (
        f"NUTS (NumPyro), target accept {target_accept:g}, max tree depth {max_tree_depth}, "
        f"{n_chains} chains, warm-up {n_warmup}, {n_draws} draws"
    )
    log_dens = -np.asarray(extra["potential_energy"]).reshape(n_chains, n_draws).astype(dtype)
    return samples, info, log_dens, accept.mean(axis=1), description


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
    dtype: Any = None,
    chain_method: str = "vectorized",
) -> MCMCResult:
    """NumPyro's NUTS on the posterior of ``model``, with ``potential_fn = -log p(D, theta)`` on flat vectors.

    Chains start at independent prior draws unless ``init`` is given, adapt step size and a diagonal mass
    matrix during ``n_warmup`` steps, and run on one device, vectorised or one after another (``chain_method``).

    Args:
        key: PRNG key, split into the initialisation key and the sampler's key.
        model, x, y, noise_var, n_chains, init, dtype: as in :func:`metropolis_model`.
        n_warmup: adaptation steps (discarded).
        n_draws: kept draws per chain (no thinning).
        target_accept: target mean acceptance probability of the step-size adaptation.
        max_tree_depth: maximal depth of the NUTS trees (at most ``2**max_tree_depth - 1`` leapfrog steps).
        progress: show NumPyro's progress bar.
        chain_method: "vectorized", "sequential" or "auto" (sequential on a CPU, vectorized otherwise; for
            expensive gradients: :func:`resolve_chain_method` gives the measurements).
    """
    n_chains = _count("n_chains", n_chains, 1)
    k_init, k_sampler = jax.random.split(key)
    dtype = float_dtype(dtype)
    x, y, noise_var = _prepare(x, y, noise_var, dtype)
    log_density, _ = log_density_fn(model, x, y, noise_var)
    flat0 = _flat_init(k_init, model, init, n_chains, dtype)
    samples, info, log_dens, accept, description = nuts(
        k_sampler, log_density, flat0, n_warmup=n_warmup, n_draws=n_draws, target_accept=target_accept,
        max_tree_depth=max_tree_depth, progress=progress, dtype=dtype, chain_method=chain_method,
    )
    return MCMCResult(
        params=unravel_draws(model, samples),
        log_density=log_dens,
        accept_rate=accept,
        info=info,
        sampler=description,
    )


# ------------------------------------------------------------------------------------------ diagnostics
