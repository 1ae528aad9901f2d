"""Reference samplers of the unperturbed posterior ``p(theta | D)``, and their convergence diagnostics.

- :func:`metropolis` / :func:`metropolis_model`: random-walk Metropolis-Hastings with a Gaussian proposal
  ``N(theta, proposal_var I)``, the paper's reference for its nonlinear examples (Appendix: 10 restarts from
  prior draws, a burn-in, then one kept state every ``thin`` steps). All chains move together (``jax.vmap``
  over chains inside ``jax.lax.scan`` over steps); only the kept states are stored, so chains of hundreds of
  thousands of steps on models with tens of thousands of parameters fit in memory.
- :func:`nuts_model`: NumPyro's NUTS on the same flattened log joint (a faster reference where gradients help);
  :func:`nuts` runs it on any log density of flat vectors (e.g. a classification likelihood), with
  :func:`prior_starts` for starting points and :func:`unravel_draws` to turn its flat draws into parameters.
- :func:`resumable_nuts` / :func:`run_resumable`: the same NUTS a chunk at a time, its state and every chunk's
  kept values (e.g. the predictive on a grid) saved to a directory, so that a reference needing days resumes
  after an interrupt with the draws an uninterrupted run gives; :func:`read_run` reads them back.
- :func:`sghmc_model`: scale-adapted stochastic-gradient HMC (Springenberg et al., 2016), the paper's SGHMC
  baseline on UCI (restarts from prior draws, an adapting burn-in, then thinned draws; minibatch gradients);
  its kernel :func:`sghmc_init` / :func:`sghmc_step` (state :class:`SGHMCState`, :class:`SGHMCHyper`) works on
  any parameter pytree or flat vector.
- :func:`rhat`, :func:`ess`: ArviZ's rank-normalised split R-hat and effective sample sizes;
  :func:`predictive_diagnostics` applies them to the predictive function values, as the paper reports R-hat
  "on the predictive models".

Randomness of :func:`metropolis`: chain ``c`` owns ``chain_key = jax.random.split(key, n_chains)[c]``; step
``t`` (0-based, burn-in included) uses ``k_proposal, k_accept = jax.random.split(jax.random.fold_in(chain_key,
t))``. Draws therefore do not depend on how the run is cut into chunks (progress bars or not).

NumPyro and ArviZ are optional (the ``mcmc`` extra) and imported only inside the functions that need them.

Example::

    res = samplers.metropolis_model(key, model, x, y, noise_var=0.01, n_chains=10, proposal_var=0.5,
                                   n_draws=20, burn_in=10_000, thin=5_000)
    samplers.predictive_diagnostics(model, res, x_grid)["rhat_mean"]
"""

from __future__ import annotations

from ._common import MCMCResult, log_density_fn, prior_starts, unravel_draws
from .diagnostics import ess, predictive_diagnostics, rhat
from .mh import metropolis, metropolis_model
from .nuts import NUTS_CHAIN_METHODS, nuts, nuts_model, resolve_chain_method
from .resumable import read_run, resumable_nuts, run_resumable
from .sghmc import SGHMCHyper, SGHMCInfo, SGHMCState, sghmc_init, sghmc_model, sghmc_step

__all__ = [
    "MCMCResult",
    "SGHMCHyper",
    "SGHMCInfo",
    "SGHMCState",
    "ess",
    "log_density_fn",
    "metropolis",
    "metropolis_model",
    "nuts",
    "nuts_model",
    "NUTS_CHAIN_METHODS",
    "resolve_chain_method",
    "predictive_diagnostics",
    "prior_starts",
    "read_run",
    "resumable_nuts",
    "rhat",
    "run_resumable",
    "sghmc_init",
    "sghmc_model",
    "sghmc_step",
    "unravel_draws",
]
