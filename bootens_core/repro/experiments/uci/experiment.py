"""Tables 1-3: the UCI regression benchmark, ensembles of the paper beside GP baselines, against the paper.

Methods (ids): ``ensemble-1`` / ``ensemble-4`` (Algorithm 1 on ReLU networks with 1 / 4 hidden layers of
``width`` units, ``n_particles`` particles trained together by L-BFGS, sigma^2 selected on validation MNLL);
``gp`` (GPflow: exact GPR with an isotropic squared-exponential kernel, SVGP for the ``svgp_datasets``;
hyper-parameters and noise by the marginal likelihood / ELBO); ``mcd-1`` / ``mcd-4`` (MC dropout on Gal's UCI
protocol, :mod:`bootens_core.baselines.dropout`: its own grid of dropout rate x precision, selected on the last 20% of
the training split); ``sghmc-1`` (scale-adapted SGHMC, :func:`bootens_core.samplers.sghmc_model`, on the ensembles'
network, prior and likelihood; restarts x kept draws are the mixture components; sigma^2 on the validation
grid). The protocol is :mod:`bootens_core.repro.harness`.

**The L-BFGS of the paper** ("32 steps, step size 0.5") is read as ``torch.optim.LBFGS(lr=0.5)`` stepped 32
times: each step up to ``lbfgs_iters_per_step`` (20, torch's ``max_iter``) iterations, 640 at most, of the
L-BFGS direction ``d_k = -P_k g_k`` (two-loop recursion over the last ``lbfgs_memory`` curvature pairs, torch's
``history_size`` 100; initial inverse Hessian ``gamma_k I`` with ``gamma_k = s'y / y'y``; the first step scaled
by ``min(1, 1/|g_0|_1)``; pairs with ``y's <= 1e-10`` skipped) followed by a fixed step ``theta += 0.5 d_k`` --
no line search. That is ``lbfgs.linesearch="torch"`` (:func:`bootens_core.ensemble.lbfgs.torch_lbfgs`,
:meth:`UCIConfig.faithful`). ``lbfgs.linesearch=None`` is optax's L-BFGS at the same fixed step for 640
iterations (``optax.lbfgs(0.5, linesearch=None)``, memory 10, :meth:`UCIConfig.optax_fixed_step`), which
stores every pair and so can step uphill. :func:`lbfgs_check` shows on one particle that optax's directions
are those of scipy's L-BFGS inverse-Hessian product and sets both fixed-step runs beside optax's line-search
L-BFGS and scipy's L-BFGS-B. Both fixed steps diverge for many particles (torch's more often: it never steps
uphill, but a step of 0.5 along a direction built from 100 stale pairs overshoots), so every profile uses
optax's zoom line search (strong Wolfe conditions, first trial step 0.5, at most optax's default number of
line-search evaluations per iteration, memory 10) -- a named deviation.

Each cell is stored as soon as it finishes (see :class:`~bootens_core.repro.harness.CellStore`), under a folder
keyed by the PRNG key and, per method family, by the settings, modules and code that change that family's
numbers (the settings its builder receives, :func:`settings`); a rerun with the same settings resumes, and an
edit to one method keeps the finished cells of the others.

**A run that fits a short device window** (:func:`run_pending`; ``bootens run uci`` with ``--time-budget``,
``--shard``, ``--pack``): the pending cells run in the order of :func:`priority` (ensembles first, 4 layers
first, the large datasets first; then MC dropout and SGHMC; GP last), a cell starts only when its estimated seconds
fit in the budget left (:class:`~bootens_core.repro.cellpack.CellTimes` on :func:`cost_units`), ``--shard I/N``
takes every N-th cell of that order, GP cells are skipped where GPflow/TensorFlow are not installed, every computed
cell carries its provenance and compile seconds, and the finished cells go into one pack file that :func:`fold`
merges into a cell store at home.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import inspect
import io
import json
import math
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ... import cellpack, codekey, harness, report, store
from ....baselines import dropout
from .... import ensemble, samplers, models
from ....driver import CompileCounter
from ...config import (DeepEnsembleConfig, GPConfig, LBFGSConfig, MCDropoutConfig, NetworkConfig, SGHMCConfig, as_dict,
                       from_dict, plain, require_x64)
from .config import UCI_METHODS, UCIConfig
from ....data import uci
from ...harness import Cell, Method
from ....metrics import Prediction

__all__ = [
    "NAME",
    "DESCRIPTION",
    "ARTEFACTS",
    "Config",
    "run",
    "store_dir",
    "compute_cell",
    "compute_cells",
    "cells",
    "expand_methods",
    "method",
    "paper_reference",
    "LEVEL",
    "MIN_SPLITS",
    "EQUIVALENCE_SDS",
    "EQUIVALENCE_FLOOR",
    "EQUIVALENCE_VERDICTS",
    "METRICS",
    "ENSEMBLE_IDS",
    "BASELINE_IDS",
    "PRACTICE_IDS",
    "compare_with_paper",
    "holm",
    "testable_pvalues",
    "method_id",
    "paired",
    "paired_comparisons",
    "ranking",
    "comparative_claim",
    "published_reference",
    "summarise",
    "restate",
    "paper_scale_summary",
    "result_cells",
    "cells_csv",
    "lbfgs_check",
    "sghmc_step_study",
    "deep_lr_check",
    "from_cells",
    "PAPER_METHODS",
    "PRIORITY_METHODS",
    "PRIORITY_DATASETS",
    "TRAIN_SHAPES",
    "GP_SKIPPED",
    "priority",
    "cost_units",
    "grid_batch",
    "grid_batches",
    "ensemble_optimizer",
    "gp_available",
    "reference_times",
    "PendingRun",
    "run_pending",
    "FoldReport",
    "fold",
    "cell_devices",
    "cell_of",
    "lbfgs_label",
    "lbfgs_variant_cells",
    "settings",
    "family_code",
    "stored_cells",
    "record_cells",
    "recorded_cells",
    "pack_cells",
    "repeated_cells",
    "cell_device",
]

NAME = "uci"
DESCRIPTION = "UCI regression: ensembles, MC dropout, SGHMC and GP baselines vs the paper's Tables 1-3"
ARTEFACTS = ("Table 1", "Table 2", "Table 3")
Config = UCIConfig

# The method columns of the paper's Tables 2-3 as (method, hidden layers); GP has no layers.
PAPER_METHODS = (("ensemble", 1), ("ensemble", 4), ("mcd", 1), ("mcd", 4), ("sghmc", 1), ("gp", 0))
# The paper prints two decimals: a published std of 0.00 means "below 0.005".
_PRINT_RESOLUTION = 0.005
# Two-sided level of every test of the UCI chapter (per test; holm() gives the family-wise count).
LEVEL = 0.05
# Fewest splits of ours a comparison with the paper gives a verdict on (compare_with_paper); also the fewest
# common splits of a paired comparison, of the comparative claim and of a method in a ranking.
MIN_SPLITS = 3
# The equivalence margin of a comparison with the paper, in units of the paper's SD over splits (floored at
# EQUIVALENCE_FLOOR, one unit of its last printed digit), fixed before any verdict of this rule was read: the
# paper prints each entry as mean +- that SD, so a difference within it is within the spread the paper itself
# shows from one split to the next; and with 10 splits of ours against its 10, a 90% interval of the
# difference is about 0.8 of that SD wide on each side, so a tighter margin could never be shown.
EQUIVALENCE_SDS = 1.0
EQUIVALENCE_FLOOR = 0.01
# The verdicts of compare_with_paper's equivalence rule, in the order the chapter counts them.
EQUIVALENCE_VERDICTS = ("equivalent", "differs (ours lower)", "differs (ours higher)", "inconclusive",
                        "untestable", "failed", "too few splits")
METRICS = {"rmse": "test_rmse", "mnll": "test_mnll", "coverage95": "coverage95"}
# The paper's ensembles and the baselines of its comparative claim, as method ids.
ENSEMBLE_IDS = ("ensemble-1", "ensemble-4")
BASELINE_IDS = ("mcd-1", "mcd-4", "sghmc-1", "gp")
# The baselines beyond the paper's columns, those a practitioner would use instead: the plain ensemble (the
# same particles, no perturbation) and deep ensembles (Lakshminarayanan et al. 2017). Not in the paper's
# comparative claim, which names MC dropout, SGHMC and the GP.
PRACTICE_IDS = ("plain-1", "plain-4", "deep-1")
# Columns of the metrics the paired comparisons take: the tables' three and the CRPS (calibration fields,
# which cells made before they existed lack).
_PAIRED_COLUMNS = {"rmse": "test_rmse", "mnll": "test_mnll", "coverage95": "coverage95", "crps": "test_crps"}


def _check(cfg: UCIConfig) -> None:
    unknown = [d for d in cfg.datasets if d not in uci.DATASETS]
    if unknown:
        raise ValueError(f"unknown UCI dataset(s) {unknown}: choose from {', '.join(uci.DATASETS)}")
    bad = [m for m in cfg.methods if m not in UCI_METHODS]
    if bad:
        raise ValueError(f"unknown UCI method(s) {bad}: built so far are {', '.join(UCI_METHODS)}")
    if not cfg.datasets or not cfg.methods:
        raise ValueError("no datasets or no methods selected")
    if cfg.max_splits < 0:
        raise ValueError(f"max_splits must be >= 0 (0 = the paper's), got {cfg.max_splits}")


def expand_methods(specs: list[str] | tuple[str, ...]) -> list[str]:
    """Method ids from ids or family names, comma- or space-separated: ``["mcd,sghmc"]`` ->
    ``["mcd-1", "mcd-4", "sghmc-1"]`` (order kept, duplicates dropped)."""
    out: list[str] = []
    for spec in specs:
        for name in filter(None, (s.strip() for s in spec.split(","))):
            ids = [name] if name in UCI_METHODS else [m for m in UCI_METHODS if m.partition("-")[0] == name]
            if not ids:
                raise ValueError(f"unknown UCI method {name!r}: choose method ids ({', '.join(UCI_METHODS)}) or "
                                 f"families ({', '.join(dict.fromkeys(m.partition('-')[0] for m in UCI_METHODS))})")
            out += [m for m in ids if m not in out]
    return out


def cells(cfg: UCIConfig) -> list[Cell]:
    """The cells of a run: dataset-major, then method, then split (the paper's 10 splits, 5 for Protein)."""
    _check(cfg)
    out = []
    for d in cfg.datasets:
        n = uci.PAPER_SPLITS[d] if cfg.max_splits == 0 else min(cfg.max_splits, uci.PAPER_SPLITS[d])
        out += [Cell(d, s, m) for m in cfg.methods for s in range(n)]
    return out


def _mlp(in_dim: int, layers: int, network: NetworkConfig) -> models.Model:
    return models.mlp(in_dim, (network.width,) * layers, "relu", weight_var=network.weight_var,
                      bias_var=network.bias_var, scale_by_fan_in=network.scale_by_fan_in)


def _lbfgs(lbfgs: LBFGSConfig) -> ensemble.Optimizer:
    """The ensembles' L-BFGS for ``lbfgs.linesearch``.

    ``None``/``"zoom"``: optax's L-BFGS (memory ``lbfgs.memory``), one iteration per step. ``"torch"``/
    ``"torch-strong-wolfe"``: ``torch.optim.LBFGS(lr=step_size, max_iter=iters_per_step,
    history_size=memory)``, one outer step per step (its ``iterations_per_step`` is ``iters_per_step``); the
    strong-Wolfe search allows 25 further evaluations (``max_ls=25``, PyTorch before 2.10, the paper's era).
    """
    step_size, memory = lbfgs.step_size, lbfgs.memory
    linesearch, iters_per_step = lbfgs.linesearch, lbfgs.iters_per_step
    if linesearch in (None, "zoom"):
        return ensemble.optimizer("lbfgs", step_size, memory_size=memory, linesearch=linesearch)
    if linesearch == "torch":
        return ensemble.optimizer("torch-lbfgs", step_size, max_iter=iters_per_step, history_size=memory)
    if linesearch == "torch-strong-wolfe":
        return ensemble.optimizer("torch-lbfgs", step_size, max_iter=iters_per_step, history_size=memory,
                                  line_search_fn="strong_wolfe", max_ls=25)
    raise ValueError(f"unknown L-BFGS linesearch {linesearch!r}: choose null, 'zoom', 'torch' or 'torch-strong-wolfe'")


def ensemble_optimizer(cfg: UCIConfig) -> ensemble.Optimizer:
    """The L-BFGS the ensemble cells of ``cfg`` train with (one object per setting: one compilation)."""
    return _lbfgs(cfg.lbfgs)


class _Context(NamedTuple):
    """What a method builder gets besides its settings: where it runs, nothing that decides its numbers but the
    dataset's shape (``grid_batch(n_rows, grid_size)``: how many sigma^2 values an ensemble trains at once)."""

    dataset: str
    layers: int
    in_dim: int
    y_std: float
    grid_batch: Callable[[int, int], int]


def _ensemble_method(network: NetworkConfig, lbfgs: LBFGSConfig, n_particles: int, /, ctx: _Context,
                     perturb: bool = True) -> Method:
    # perturb=False: the plain ensemble (_plain_method), the same particles minimising the unperturbed MAP loss.
    layers, in_dim = ctx.layers, ctx.in_dim
    model = _mlp(in_dim, layers, network)
    opt = _lbfgs(lbfgs)
    # lbfgs.steps x lbfgs.iters_per_step iterations: that many optax steps, or lbfgs.steps torch outer steps.
    steps = opt.steps_for(lbfgs.steps * lbfgs.iters_per_step)
    dtype = jnp.dtype(network.dtype)

    def predict(res, x_eval, noise_var):
        f = np.asarray(models.predict(model, res.params, jnp.asarray(x_eval, dtype)), np.float64)
        ok = ~res.diverged & np.all(np.isfinite(f), axis=1)
        return Prediction(f[ok], noise_var, int((~ok).sum()))

    def fit_ensemble(key, x, y, x_eval, noise_var):
        res = ensemble.train(
            key, model, x, y, noise_var=noise_var, n_particles=n_particles, opt=opt,
            steps=steps, dtype=dtype, on_diverged="report", perturb_labels=perturb, perturb_prior=perturb,
        )
        return predict(res, x_eval, noise_var)

    def fit_ensemble_grid(key, x, y, x_eval, noise_grid):
        # The grid in batches of grid_batch values (ensemble.train_grid); 1 is fit_ensemble value by value.
        size = ctx.grid_batch(np.shape(x)[0], len(noise_grid))
        if size == 1:
            return [fit_ensemble(key, x, y, x_eval, nv) for nv in noise_grid]
        preds = []
        for part, n_real in grid_batches(noise_grid, size):
            results = ensemble.train_grid(key, model, x, y, noise_grid=part, n_particles=n_particles, opt=opt,
                                          steps=steps, dtype=dtype, on_diverged="report",
                                          perturb_labels=perturb, perturb_prior=perturb)
            preds += [predict(res, x_eval, nv) for res, nv in zip(results[:n_real], part[:n_real], strict=True)]
        return preds

    def stacked(keys, xs, ys, noise_vars):
        return ensemble.train_stacked(keys, model, xs, ys, noise_vars=noise_vars, n_particles=n_particles, opt=opt,
                                      steps=steps, dtype=dtype, on_diverged="report", perturb_labels=perturb,
                                      perturb_prior=perturb)

    def fit_many(keys, xs, ys, x_evals, noise_vars):
        # every split at its own sigma^2: one block per problem
        results = stacked(keys, xs, ys, [[nv] for nv in noise_vars])
        return [predict(res[0], x_eval, nv) for res, x_eval, nv in zip(results, x_evals, noise_vars, strict=True)]

    def fit_grid_many(keys, xs, ys, x_evals, noise_grid):
        results = stacked(keys, xs, ys, [list(noise_grid)] * len(xs))
        return [[predict(r, x_eval, nv) for r, nv in zip(res, noise_grid, strict=True)]
                for res, x_eval in zip(results, x_evals, strict=True)]

    return Method("ensemble" if perturb else "plain", layers, True, fit_ensemble, fit_ensemble_grid, fit_many,
                  fit_grid_many)


def _plain_method(network: NetworkConfig, lbfgs: LBFGSConfig, n_particles: int, /, ctx: _Context) -> Method:
    """The plain ensemble: the ensembles' particles (network, prior draws as initialisations, L-BFGS, sigma^2 on
    the validation grid) minimising the MAP loss with neither the labels nor the prior perturbed."""
    return _ensemble_method(network, lbfgs, n_particles, ctx, perturb=False)


def _deep_method(deep: DeepEnsembleConfig, /, ctx: _Context) -> Method:
    """Deep ensembles on their protocol (:class:`~bootens_core.repro.config.DeepEnsembleConfig`): each network
    predicts its own variance, so nothing is selected on the validation rows; the predictive is the
    equal-weight mixture of the networks' Gaussians."""
    from ....baselines import deep_ensemble

    width = deep.width_large if ctx.dataset == "protein" else deep.width

    def fit_deep(key, x, y, x_eval, noise_var):
        ens = deep_ensemble.fit(key, x, y, hidden=(width,) * ctx.layers, n_networks=deep.n_networks,
                                epochs=deep.epochs, batch_size=deep.batch_size, lr=deep.lr,
                                adversarial_eps=deep.adversarial_eps)
        n_div = int(np.sum(ens.diverged))
        if n_div == deep.n_networks:
            return Prediction(np.zeros((0, len(x_eval))), 1.0, n_div, math.nan, {"width": width})
        mean, var = deep_ensemble.predict(ens, x_eval)
        mean, var = np.asarray(mean, np.float64), np.asarray(var, np.float64)
        # The "noise variance" of the record: the networks' predicted variance averaged over the test points.
        info = {"width": width, "selection": "a variance per network and point, learned with the mean"}
        return Prediction(mean, var, n_div, float(np.mean(var)), info)

    return Method("deep", ctx.layers, False, fit_deep)


def grid_batch(cfg: UCIConfig, n_rows: int, in_dim: int, layers: int, grid_size: int,
               device: jax.Device | None = None) -> int:
    """How many sigma^2 values of the grid an ensemble cell trains together (``UCIConfig.noise_grid_batch``).

    A positive ``noise_grid_batch`` is used as given (at most ``grid_size``). 0 (automatic) gives 1 on a CPU,
    where the particles already keep the cores busy and a batch saves nothing; on an accelerator, as many
    values as fit in a quarter of its memory, by an upper estimate of one particle's working set: for every
    row the hidden units' pre-activations, activations and their gradients, and for every weight its value,
    gradient, the L-BFGS pairs and the line search's copies, in ``cfg.network.dtype``.
    """
    if cfg.noise_grid_batch:
        return max(1, min(int(cfg.noise_grid_batch), int(grid_size)))
    device = device or jax.devices()[0]
    if device.platform == "cpu":
        return 1
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    if not limit:
        return 1
    item = jnp.dtype(cfg.network.dtype).itemsize
    width = cfg.network.width
    n_params = (in_dim + 1) * width + (layers - 1) * (width + 1) * width + width + 1
    per_particle = item * (4 * n_rows * layers * width + 3 * n_rows + n_params * (2 * cfg.lbfgs.memory + 8))
    fit = int(limit // 4 // (per_particle * cfg.n_particles))
    return max(1, min(int(grid_size), fit))


def grid_batches(noise_grid: Sequence[float], size: int) -> list[tuple[list[float], int]]:
    """The sigma^2 grid cut into batches of one length, so that a cell compiles one program for all of them.

    At most ``size`` values a batch, as few batches as that allows and as even as possible (9 values at
    ``size`` 4: 3, 3, 3); a batch shorter than the others is padded by repeating its last value. Returns
    ``(values, n_real)`` per batch, in grid order: its first ``n_real`` values are the grid's, the rest padding
    whose results are dropped (a block of :func:`bootens_core.ensemble.train_grid` depends only on its own
    value, so padding changes no real block's particles but by float rounding)."""
    grid = [float(v) for v in noise_grid]
    if not grid:
        raise ValueError("noise_grid is empty")
    if int(size) < 1:
        raise ValueError(f"a grid batch needs at least one value, got size {size}")
    n_batches = -(-len(grid) // int(size))
    length = -(-len(grid) // n_batches)
    out = []
    for start in range(0, len(grid), length):
        part = grid[start:start + length]
        out.append((part + [part[-1]] * (length - len(part)), len(part)))
    return out


def _gp_method(gp: GPConfig, /, ctx: _Context) -> Method:
    kind = "svgp" if ctx.dataset in gp.svgp_datasets else "gpr"

    def fit_gp(key, x, y, x_eval, noise_var):
        from ....baselines import gp as baseline

        # More than 2000 training rows (Kin8nm, Naval, Power: exact GPR; Protein: SGPR) take the objective and
        # its closed-form gradient computed in numpy with LAPACK: the same objective and optimum, 2-20x fewer
        # CPU seconds per evaluation (baselines.gp.fit_predict). Up to 2000 rows GPflow's objective and TensorFlow's
        # automatic gradient: the committed GP cells of the small datasets stay as they are. (A literal here:
        # the family hash reads this function's source.)
        fast = {"gradient": "closed_form"} if len(y) > 2000 else {}
        g = baseline.fit_predict(key, x, y, x_eval, method=kind, n_inducing=gp.n_inducing, max_iter=gp.max_iter,
                                 **fast)
        info = {"kind": kind, "lengthscale": g.lengthscale, "signal_var": g.signal_var,
                "objective": g.objective, "n_iter": g.n_iter, "converged": bool(g.converged),
                "gradient": fast.get("gradient", "autodiff")}
        return Prediction(g.mean[None], g.var, 0, float(g.noise_var), info)

    return Method("gp", 0, False, fit_gp)


def _mcd_method(network: NetworkConfig, mcd: MCDropoutConfig, /, ctx: _Context) -> Method:
    grid = dropout.protocol_grid(ctx.dataset)
    layers, y_std = ctx.layers, ctx.y_std

    def fit_mcd(key, x, y, x_eval, noise_var):
        # Gal's protocol selects its own (dropout rate, tau) on the last 20% of the training split; tau is a
        # precision in original label units, hence y_scale.
        return dropout.fit_select(
            key, x, y, x_eval, hidden_layers=layers, width=network.width, dropout_grid=grid.dropout_rates,
            tau_grid=grid.tau_values, epochs=grid.n_epochs * mcd.epochs_x, n_samples=mcd.samples,
            y_scale=y_std,
        )

    return Method("mcd", layers, False, fit_mcd)


def _sghmc_method(network: NetworkConfig, sghmc: SGHMCConfig, /, ctx: _Context) -> Method:
    layers = ctx.layers
    model = _mlp(ctx.in_dim, layers, network)
    dtype = jnp.dtype(network.dtype)

    def fit_sghmc(key, x, y, x_eval, noise_var):
        res = samplers.sghmc_model(
            key, model, x, y, noise_var, n_restarts=sghmc.restarts, n_draws=sghmc.draws,
            burn_in=sghmc.burn_in, thin=sghmc.thin, lr=sghmc.lr, mdecay=sghmc.mdecay,
            batch_size=min(sghmc.batch_size, x.shape[0]), lr_scaling=sghmc.lr_scaling,
            on_diverged="report", dtype=dtype,
        )
        # A restart that diverged contributes no sample; every kept draw of the others is a mixture component.
        # Every draw is predicted (one shape whatever diverged, so no split compiles the prediction again) and
        # the diverged restarts' draws are dropped after.
        ok_restart = ~np.asarray(res.info["diverged"], bool)
        draws = jax.tree.map(lambda a: a.reshape((-1, *a.shape[2:])), res.params)
        f = np.asarray(models.predict(model, draws, jnp.asarray(x_eval, dtype)), np.float64)
        kept = np.repeat(ok_restart, sghmc.draws)
        f = f[kept]
        ok = np.all(np.isfinite(f), axis=1)
        diverged = int((~ok_restart).sum()) * sghmc.draws + int((~ok).sum())
        info = {"step_size": float(res.info["step_size"]), "batch_size": int(res.info["batch_size"]),
                "diverged_restarts": int((~ok_restart).sum())}
        return Prediction(f[ok], noise_var, diverged, None, info)

    return Method("sghmc", layers, True, fit_sghmc)


class _Family(NamedTuple):
    """A method family: its builder.

    The builder's positional-only parameters are named after :class:`UCIConfig` fields and receive those
    fields' values -- nothing else of the configuration reaches it -- so the settings that decide a family's
    cells are read off the builder's signature (:func:`settings`), never from a list kept by hand. The code that
    decides them is read off the builder too (:func:`family_code`)."""

    build: Callable[..., Method]


_FAMILIES: dict[str, _Family] = {
    "ensemble": _Family(_ensemble_method),
    "plain": _Family(_plain_method),
    "deep": _Family(_deep_method),
    "gp": _Family(_gp_method),
    "mcd": _Family(_mcd_method),
    "sghmc": _Family(_sghmc_method),
}


def _setting_names(family: str) -> tuple[str, ...]:
    params = inspect.signature(_FAMILIES[family].build).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY)


def method(method_id: str, cfg: UCIConfig, dataset: str, in_dim: int, y_std: float = 1.0) -> Method:
    """The :class:`~bootens_core.repro.harness.Method` of a method id for one dataset (``y_std``: the training
    labels' standard deviation, for methods whose hyper-parameters are in original label units)."""
    family, _, layers = method_id.partition("-")
    if method_id not in UCI_METHODS or family not in _FAMILIES:
        raise ValueError(f"unknown UCI method {method_id!r}: built so far are {', '.join(UCI_METHODS)}")
    depth = int(layers or 0)
    ctx = _Context(dataset, depth, in_dim, y_std,
                   lambda n_rows, grid_size: grid_batch(cfg, n_rows, in_dim, depth, grid_size))
    values = [getattr(cfg, name) for name in _setting_names(family)]
    return _FAMILIES[family].build(*values, ctx)


def _cell_key(key: jax.Array, cell: Cell) -> jax.Array:
    k = jax.random.fold_in(key, uci.DATASETS.index(cell.dataset))
    k = jax.random.fold_in(k, UCI_METHODS.index(cell.method))
    return jax.random.fold_in(k, cell.split)


def _protocol(cfg: UCIConfig) -> dict[str, Any]:
    """The settings of the protocol every cell runs (:func:`bootens_core.repro.harness.run_cell`'s keywords):
    what :func:`compute_cell` passes, and so what every family's hash includes."""
    return {"noise_grid": tuple(cfg.noise_grid), "val_seed": cfg.seed, "val_fraction": cfg.val_fraction}


# What decides a cell's numbers. Common to every cell: the protocol's settings (_protocol) and the code that
# computes a cell (compute_cell, _cell_key, method). Per method family: the settings its builder receives
# (_setting_names) and the code it reaches. The code is derived, never listed by hand (codekey.reach): the
# functions of this module that these roots call, transitively, by their source; every package module they use,
# closed under imports, by its bytes. Cells are stored per family under a folder named by a hash of all that,
# so an edit to one method (or a new method) keeps the others' finished cells.
_DISPATCH = (f"{__name__}:_FAMILIES",)  # method()'s table of builders: each family's key follows its own builder


def _common_roots() -> tuple[Callable[..., Any], ...]:
    return (compute_cell, _cell_key, _protocol, method)


@functools.cache
def family_code(family: str) -> codekey.Reach:
    """The code that decides the cells of a method family (``"ensemble"``, ``"gp"``, ...): the functions of this
    module that computing one of its cells reaches and the package modules they import, closed under imports
    (:func:`bootens_core.repro.codekey.reach`). Cached for the process: the source does not change under a
    running program."""
    if family not in _FAMILIES:
        raise ValueError(f"unknown UCI method family {family!r}: known are {', '.join(_FAMILIES)}")
    return codekey.reach((*_common_roots(), _FAMILIES[family].build), skip=_DISPATCH)


def settings(cfg: UCIConfig, method_ids: Iterable[str]) -> dict[str, Any]:
    """The settings of ``cfg`` that decide the numbers of cells of these method ids, as a JSON-ready dict: the
    protocol's (``protocol``) and the :class:`UCIConfig` fields each method family's builder receives (e.g.
    ``network``, ``lbfgs``, ``n_particles`` for the ensembles). Two configurations with equal settings give
    those cells the same numbers (with the same code); a field of another family does not enter."""
    out: dict[str, Any] = {"protocol": plain(_protocol(cfg))}
    for m in method_ids:
        if m not in UCI_METHODS:
            raise ValueError(f"unknown UCI method {m!r}: known are {', '.join(UCI_METHODS)}")
        out.update(_family_settings(cfg, m.partition("-")[0]))
    return dict(sorted(out.items()))


def _family_settings(cfg: UCIConfig, family: str) -> dict[str, Any]:
    """The settings that decide a family's cells: the protocol's and the fields its builder receives."""
    return {"protocol": plain(_protocol(cfg)),
            **{name: plain(getattr(cfg, name)) for name in _setting_names(family)}}


# The values of jax_default_matmul_precision that compute float32 products in float32 on every backend.
_FLOAT32_PRECISIONS = ("highest", "float32")


def _products() -> str:
    """How float32 matrix products are computed here, for the cell keys: a CPU computes them in float32 whatever
    ``jax_default_matmul_precision`` says; an accelerator follows the setting (its default, ``None``, is TF32 on
    NVIDIA GPUs since Ampere), so a cell made in TF32 or bf16 passes is never served as one made in float32.
    An accelerator set to ``"highest"`` (or ``"float32"``) computes them in float32 too: its cells share the
    CPU's key, as any two machines' float32 cells do."""
    backend = jax.default_backend()
    precision = jax.config.jax_default_matmul_precision
    return "float32" if backend == "cpu" or precision in _FLOAT32_PRECISIONS else f"{backend}:{precision}"


def _family_hash(cfg: UCIConfig, family: str) -> str:
    values = _family_settings(cfg, family)
    blob = json.dumps({"cfg": values, "code": codekey.digest(family_code(family)), "products": _products()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


class _CellStore(harness.CellStore):
    """A :class:`~bootens_core.repro.harness.CellStore` whose cells of each method family live in a folder named by
    that family's hash: ``<root>/<dataset>/<method id>-<hash>/split-<k>.json``."""

    def __init__(self, root: str | Path, cfg: UCIConfig):
        super().__init__(root)
        self._hash = {family: _family_hash(cfg, family) for family in _FAMILIES}

    def path(self, cell: Cell) -> Path:
        family = cell.method.partition("-")[0]
        return self.root / cell.dataset / f"{cell.method}-{self._hash[family]}" / f"split-{cell.split}.json"


def store_dir(key: jax.Array, cfg: UCIConfig) -> Path:
    """The cell store of a run's key (the method families' folders inside keep the rest apart; the selection
    of datasets, methods and splits and the number of workers do not change a cell, so runs of subsets share
    cells)."""
    blob = json.dumps({"key": store.key_words(key), "layout": 2}, sort_keys=True)
    return store.cache_dir() / "uci-cells" / hashlib.sha256(blob.encode()).hexdigest()[:16]


def stored_cells(key: jax.Array, cfg: UCIConfig, root: str | Path | None = None) -> set[Cell]:
    """The cells of ``cfg`` already in the cell store of ``key`` (``root``: another store folder), at this code."""
    cell_store = _CellStore(Path(root) if root is not None else store_dir(key, cfg), cfg)
    return {c for c in cells(cfg) if cell_store.get(c) is not None}


def _cell_store(key: jax.Array, cfg: UCIConfig) -> harness.CellStore:
    return _CellStore(store_dir(key, cfg), cfg)


def compute_cells(key: jax.Array, cfg: UCIConfig, cells_: Sequence[Cell]) -> list[dict[str, Any]]:
    """The records of several splits of one dataset and method computed at once (never read from the cell
    store): every split x every sigma^2 x every particle of the validation fits as one program, then the final
    fits of every split as one (:func:`bootens_core.repro.harness.run_cells_at_once`,
    :func:`bootens_core.ensemble.train_stacked`). Each record is :func:`compute_cell`'s up to float rounding,
    from the same key. A method that cannot (not an ensemble), or splits of different sizes: cell by cell.
    Raises ``ValueError`` for cells of more than one dataset or method."""
    if not cells_:
        return []
    if len({(c.dataset, c.method) for c in cells_}) != 1:
        raise ValueError(f"cells computed at once share a dataset and a method, got {[c.label for c in cells_]}")
    datas = [uci.load(c.dataset, c.split) for c in cells_]
    m = method(cells_[0].method, cfg, cells_[0].dataset, datas[0].x_train.shape[1], datas[0].y_std)
    same_shape = len({(d.x_train.shape, d.x_test.shape) for d in datas}) == 1
    if m.fit_many is None or not same_shape:
        return [compute_cell(key, cfg, c) for c in cells_]
    return harness.run_cells_at_once([_cell_key(key, c) for c in cells_], m, datas, **_protocol(cfg))


def compute_cell(key: jax.Array, cfg: UCIConfig, cell: Cell) -> dict[str, Any]:
    """One table cell computed (never read from the cell store): the record :func:`run` stores for it."""
    data = uci.load(cell.dataset, cell.split)
    m = method(cell.method, cfg, cell.dataset, data.x_train.shape[1], data.y_std)
    return harness.run_cell(_cell_key(key, cell), m, data, **_protocol(cfg))


def run(
    key: jax.Array, cfg: UCIConfig, *, use_cache: bool = True, force: bool = False, progress: bool = False
) -> store.Result:
    """Run (or resume) every cell of ``cfg`` and summarise them against the paper (summary keys: README)."""
    require_x64("uci")
    import time

    all_cells = cells(cfg)
    start = time.perf_counter()
    root = store_dir(key, cfg)
    if not use_cache:
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="bootens-uci-cells-"))
    cell_store = _CellStore(root, cfg)
    compute = functools.partial(_timed_cell, key, cfg, _cell_provenance())
    records = harness.run_cells(all_cells, compute, cell_store, workers=cfg.cell_workers, force=force,
                                progress=progress)
    return _result(records, cfg, {**store.provenance(time.perf_counter() - start), "cell_store": str(root)})


def from_cells(
    directory: str | Path,
    cfg: UCIConfig,
    provenance: dict[str, Any],
    kept: Sequence[dict[str, Any]] = (),
) -> store.Result:
    """The result of the cells of ``cfg`` already finished in the cell store ``directory``, computing nothing.

    For assembling a record from cells computed elsewhere (e.g. a GPU run cut short): cells not in the store
    are left out and listed in ``summary["cells_missing"]``; ``provenance`` says where the cells were made.
    ``kept``: rows of an earlier record (:func:`record_cells`) that stand for cells missing from the store (a
    stored cell replaces the kept row of the same dataset, split and method); ``summary["cells_kept"]`` counts
    those used.
    """
    cell_store = _CellStore(directory, cfg)
    by_cell = {cell_of(r): r for r in kept}
    records, missing, n_kept = [], [], 0
    for cell in cells(cfg):
        rec = cell_store.get(cell)
        if rec is None and cell in by_cell:
            rec, n_kept = by_cell[cell], n_kept + 1
        if rec is None:
            missing.append(f"{cell.dataset}/{cell.method}/split-{cell.split}")
        else:
            records.append(rec)
    if not records:
        raise FileNotFoundError(f"no finished cell of this configuration under {directory}")
    result = _result(records, cfg, {**provenance, "cell_store": str(directory)})
    result.summary["cells_missing"] = missing
    result.summary["cells_kept"] = n_kept
    return result


def cell_of(record: dict[str, Any]) -> Cell:
    """The cell a record (a stored cell or a ``cells.csv`` row) belongs to: its method id is the method and, for
    the networks, its depth (``ensemble`` with 4 hidden layers is ``ensemble-4``; GP is ``gp``)."""
    family, layers = str(record["method"]), int(record["hidden_layers"])
    method_id = family if family == "gp" else f"{family}-{layers}"
    if method_id not in UCI_METHODS:
        raise ValueError(f"a cell record of method {family!r} with {layers} hidden layers is no UCI method")
    return Cell(str(record["dataset"]), int(record["split"]), method_id)


_INT_FIELDS = ("split", "hidden_layers", "diverged_particles", "n_components")
_FLOAT_FIELDS = ("noise_var", "noise_var_std_units", "test_rmse", "test_mnll", "coverage95", "wall_s")


def record_cells(folder: str | Path) -> list[dict[str, Any]]:
    """The cells of a committed record folder, read back from its ``cells.csv`` (one record per row with the
    :data:`~bootens_core.repro.harness.CELL_FIELDS`, numbers as numbers), so that a record can be extended by new
    cells without the cell files it was assembled from (:func:`from_cells`' ``kept``). A missing or malformed
    file is a one-line ``ValueError``."""
    table = Path(folder) / "cells.csv"
    try:
        text = table.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{table}: cannot read the record's cells ({exc})") from exc
    return _parse_cells(text, str(table))


def recorded_cells(folders: Sequence[str | Path], cfg: UCIConfig) -> set[Cell]:
    """The cells of ``cfg`` that committed record folders already hold at ``cfg``'s settings: a row of a
    record's ``cells.csv`` counts when the record's ``config.json`` gives its method the same
    :func:`settings` as ``cfg`` (rows made at other settings, e.g. a faithful-optimizer record, do not).
    :func:`run_pending` passes them over, so a window on another machine does not repeat them. A folder
    without a readable ``cells.csv`` and ``config.json`` is a one-line ``ValueError``."""
    wanted = set(cells(cfg))
    out: set[Cell] = set()
    for folder in map(Path, folders):
        try:
            theirs = from_dict(UCIConfig, json.loads((folder / "config.json").read_text()))
        except (OSError, json.JSONDecodeError, TypeError, ValueError) as exc:
            raise ValueError(
                f"--skip-recorded {folder}: no readable config.json of a UCI record ({exc})") from exc
        same: dict[str, bool] = {}
        for rec in record_cells(folder):
            cell = cell_of(rec)
            if cell not in wanted:
                continue
            if cell.method not in same:
                same[cell.method] = settings(theirs, [cell.method]) == settings(cfg, [cell.method])
            if same[cell.method]:
                out.add(cell)
    return out


def pack_cells(
    *paths: str | Path, datasets: Iterable[str] | None = None, methods: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """The cell records of cell packs (:func:`bootens_core.repro.cellpack.read_pack`), in the packs' order, each
    with its own ``provenance``; ``datasets`` and ``methods`` (method ids, e.g. ``ensemble-1``) keep only those.
    A pack that is unreadable, or holds a record that is not a UCI cell, is a one-line ``ValueError`` naming
    it."""
    keep_ds = None if datasets is None else set(datasets)
    keep_m = None if methods is None else set(methods)
    out = []
    for path in paths:
        _, members = cellpack.read_pack(path)
        for name, rec in members.items():
            try:
                cell = cell_of(rec)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"cell pack {path}, {name}: not a UCI cell record ({exc})") from exc
            if (keep_ds is None or cell.dataset in keep_ds) and (keep_m is None or cell.method in keep_m):
                out.append(rec)
    return out


def repeated_cells(
    reference: Sequence[Mapping[str, Any]],
    repeats: Mapping[str, Sequence[Mapping[str, Any]]],
    metrics: Sequence[str] = ("rmse", "mnll"),
    level: float = LEVEL,
) -> list[dict[str, Any]]:
    """The same cells computed again (on another device, say) against a reference, split by split.

    ``reference``: cell records (a record's :func:`record_cells`); ``repeats``: label -> cell records of the
    same cells computed elsewhere (:func:`pack_cells`). Per label, dataset, method id and metric, on the splits
    both hold with finite values: :func:`paired` with ``a`` the repeat (``diff`` = repeat - reference, ``worse``
    = a higher error for the repeat), ``splits`` and ``higher`` (splits where the repeat is higher). A
    (dataset, method) the reference lacks is a ``ValueError``: a repeat needs something to be compared with.
    """
    rows = []
    refs = {metric: _split_values(reference, metric) for metric in metrics}
    for label, recs in repeats.items():
        for metric in metrics:
            ref, rep = refs[metric], _split_values(recs, metric)
            for (ds, mid), theirs in rep.items():
                if (ds, mid) not in ref:
                    raise ValueError(f"repeated cells {label!r}: the reference holds no {ds}/{mid} cell")
                ours = ref[(ds, mid)]
                ok = [s for s in sorted(set(theirs) & set(ours))
                      if math.isfinite(theirs[s]) and math.isfinite(ours[s])]
                res = paired([theirs[s] for s in ok], [ours[s] for s in ok], level)
                higher = sum(theirs[s] > ours[s] for s in ok)
                rows.append({"label": label, "dataset": ds, "method": mid, "metric": metric, "splits": ok,
                             "higher": higher, **res})
    return rows


def result_cells(result: store.Result) -> list[dict[str, Any]]:
    """The cells of a UCI result (its ``cells.csv``), as :func:`record_cells` reads them."""
    return _parse_cells(result.files["cells.csv"], f"{result.name} result")


def _parse_cells(text: str, where: str) -> list[dict[str, Any]]:
    try:
        rows = list(csv.DictReader(io.StringIO(text)))
    except csv.Error as exc:
        raise ValueError(f"{where}: cannot read the record's cells ({exc})") from exc
    out = []
    for i, row in enumerate(rows, start=2):
        if set(harness.CELL_FIELDS) - set(row):
            raise ValueError(f"{where}: not a cells.csv (needs the columns {', '.join(harness.CELL_FIELDS)})")
        try:
            rec: dict[str, Any] = dict(row)
            rec.update({k: int(row[k]) for k in _INT_FIELDS})
            rec.update({k: float(row[k]) for k in _FLOAT_FIELDS})
            for k in harness.CALIBRATION_FIELDS:
                if row.get(k) in (None, ""):
                    rec.pop(k, None)  # a cell made before the calibration fields existed
                elif k == "pit_counts":
                    rec[k] = [int(c) for c in row[k].split()]
                else:
                    rec[k] = float(row[k])
            cell_of(rec)
        except ValueError as exc:
            raise ValueError(f"{where}, line {i}: {exc}") from exc
        out.append(rec)
    return out


def restate(result: store.Result, level: float = LEVEL) -> dict[str, Any]:
    """The summary of a stored UCI result recomputed from its ``cells.csv`` by the current rules
    (:func:`summarise`): a committed record's ``summary.json`` keeps the verdicts of the code that wrote it.
    The record's own keys that the cells cannot give (``cells_missing``, ``cells_kept``) are carried over."""
    cfg = from_dict(UCIConfig, result.config)
    out = summarise(result_cells(result), cfg, level)
    for k in ("cells_missing", "cells_kept"):
        if k in result.summary:
            out[k] = result.summary[k]
    return out


def paper_scale_summary(*folders: str | Path, level: float = LEVEL) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The paper-scale records of ``folders`` read as one table: ``(summary, cells)``.

    The cells of every folder's ``cells.csv`` (records made on the same splits with the same seed and
    harness, e.g. the ensemble-and-GP record and the MC-dropout-and-SGHMC record) are summarised together by
    :func:`summarise` under the paper profile, over every method column of the paper and the datasets that
    have at least one cell (in the paper's order). A dataset × split × method found in two folders is an
    error: the records would disagree on what the cell is."""
    if not folders:
        raise ValueError("paper_scale_summary needs at least one record folder")
    cells: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, int, int], str] = {}
    for folder in folders:
        for rec in record_cells(folder):
            key = (rec["dataset"], rec["method"], int(rec["hidden_layers"]), int(rec["split"]))
            if key in seen:
                raise ValueError(f"cell {key} is in both {seen[key]} and {folder}")
            seen[key] = str(folder)
            cells.append(rec)
    present = {rec["dataset"] for rec in cells}
    paper = UCIConfig.paper()
    cfg = dataclasses.replace(paper, datasets=tuple(d for d in uci.DATASETS if d in present))
    return summarise(cells, cfg, level), cells


def lbfgs_label(linesearch: str | None, memory: int) -> str:
    """A readable name of an L-BFGS variant of :data:`~bootens_core.repro.config.UCI_LBFGS_LINESEARCHES`."""
    names = {None: f"optax, fixed step (memory {memory})", "zoom": f"optax, zoom line search (memory {memory})",
             "torch": f"torch.optim.LBFGS, fixed step (history {memory})",
             "torch-strong-wolfe": f"torch.optim.LBFGS, strong Wolfe (history {memory})"}
    if linesearch not in names:
        raise ValueError(f"unknown L-BFGS linesearch {linesearch!r}")
    return names[linesearch]


def lbfgs_variant_cells(root: str | Path) -> list[dict[str, Any]]:
    """The cells of every record folder directly under ``root`` (one run of one L-BFGS variant each, e.g.
    ``results/paper/uci-lbfgs``), each with the variant's ``optimizer`` (:func:`lbfgs_label` of its
    ``config.json``) and ``lbfgs_step_size``. A folder without ``config.json`` and ``cells.csv`` is skipped;
    a malformed one is a one-line ``ValueError``."""
    out: list[dict[str, Any]] = []
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        if not ((folder / "config.json").is_file() and (folder / "cells.csv").is_file()):
            continue
        try:
            c = json.loads((folder / "config.json").read_text())
            lbfgs = from_dict(UCIConfig, c).lbfgs
            label = lbfgs_label(lbfgs.linesearch, lbfgs.memory)
            step = float(lbfgs.step_size)
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{folder / 'config.json'}: not a UCI record's settings ({exc})") from exc
        out += [{**rec, "optimizer": label, "lbfgs_step_size": step, "record": folder.name}
                for rec in record_cells(folder)]
    return out


def _result(records: list[dict[str, Any]], cfg: UCIConfig, provenance: dict[str, Any]) -> store.Result:
    summary = summarise(records, cfg)
    arrays = {
        name: np.asarray([r[name] for r in records], dtype=dtype)
        for name, dtype in (
            ("dataset", str), ("method", str), ("split", np.int64), ("hidden_layers", np.int64),
            ("test_rmse", np.float64), ("test_mnll", np.float64), ("coverage95", np.float64),
            ("noise_var", np.float64), ("wall_s", np.float64), ("diverged_particles", np.int64),
        )
    }
    return store.Result(
        name=NAME,
        config=as_dict(cfg),
        arrays=arrays,
        summary=summary,
        provenance=provenance,
        files={"cells.csv": cells_csv(records)},
    )


def paper_reference() -> dict[tuple[str, str, int, str], tuple[float, float]]:
    """The paper's Tables 2-3 (published mean and std over splits), keyed by (dataset, method, layers, metric).

    These are the paper's numbers, carried as a reference (``bootens_core/data/paper_uci_tables.csv``, a copy
    of ``shared/paper/paper_uci_tables.csv``); nothing here is computed.
    """
    text = resources.files("bootens_core.data").joinpath("paper_uci_tables.csv").read_text()
    return {
        (r["dataset"], r["method"], int(r["hidden_layers"]), r["metric"]): (float(r["mean"]), float(r["std"]))
        for r in csv.DictReader(io.StringIO(text))
    }


# ------------------------------------------------------------------------------------------------------------
# Statistics: our means against the paper's, methods against each other on the same splits


def _z_of_p(p: float) -> float:
    """The normal quantile ``z`` with two-sided p-value ``p`` (``p = 2 (1 - Phi(z))``): a rerun moves it by
    about one unit, whatever p is."""
    from scipy import stats

    return float(stats.norm.isf(min(max(float(p), 1e-300), 1.0) / 2.0))


def _margin(p: float, level: float) -> float:
    """Distance of a two-sided p-value from the level, in normal-quantile units."""
    return abs(_z_of_p(p) - _z_of_p(level))


def compare_with_paper(
    values: Sequence[float], paper_mean: float, paper_sd: float, paper_n: int, level: float = LEVEL
) -> dict[str, Any]:
    """Our mean over splits against the paper's published mean: a two-sided Welch-type t-test at ``level``.

    The paper reports "the average values ... plus/minus one standard deviation" over its splits (Appendix,
    10 splits, 5 for Protein: ``paper_n``). Its standard error is ``SE_p = max(SD_p, 0.005) / sqrt(n_p)``: a
    printed SD of 0.00 is below half a unit of the last printed digit, taken at that bound. Its mean is
    printed to two decimals, a rounding error uniform on +-0.005 (standard deviation ``0.005 / sqrt(3)``),
    added as a known variance. Ours: ``SE = SD / sqrt(n)`` with the sample SD (ddof 1) over our ``n``
    splits. The statistic is ``t = (ours - paper) / sqrt(SE^2 + SE_p^2 + 0.005^2 / 3)`` with the
    Welch-Satterthwaite degrees of freedom of the two split-level terms; ``p`` is two-sided.

    ``verdict`` (the test of a difference): ``no significant difference`` when ``p >= level`` -- a failure to
    reject, not agreement -- else ``better`` (our mean lower: RMSE and MNLL are errors) or ``worse``;
    ``failed`` when a split's value is not finite; ``too few splits`` below
    :data:`MIN_SPLITS` splits: with one there is no SD of ours, and with two the test has about one degree
    of freedom (two-sided 5% critical value 12.7), so it cannot tell apart a mean of 20.3 from the paper's
    3.17 (Boston, 4 layers, two GPU splits) and would call them alike. ``margin``: distance of ``p`` from
    ``level`` in normal-quantile units (``|z(p) - z(level)|``).

    ``equivalence`` (the chapter's verdict, :data:`EQUIVALENCE_VERDICTS`): the margin ``delta`` is
    :data:`EQUIVALENCE_SDS` times the paper's SD (at least :data:`EQUIVALENCE_FLOOR`), stated before any
    verdict was read. ``ci95``: the 95% interval of ``diff`` (t with the Welch degrees of freedom);
    ``equivalence_bound``: ``|diff| + t_0.95 SE_diff``, the smallest margin two one-sided tests at ``level``
    would accept. *equivalent* when that bound is below ``delta`` (TOST at 5%); else *differs (ours lower /
    higher)* when ``p < level``; else *inconclusive* (the interval is wider than the margin allows).
    *untestable* where the paper prints a mean of 0.00 (Naval's RMSE): its rounding alone is larger than any
    of the values compared. *failed* and *too few splits* as for ``verdict``.
    """
    from scipy import stats

    v = np.asarray(values, dtype=float)
    n = int(v.size)
    out: dict[str, Any] = {"n_splits": n, "paper_mean": float(paper_mean), "paper_std": float(paper_sd),
                           "paper_n_splits": int(paper_n)}
    sd_p = max(float(paper_sd), _PRINT_RESOLUTION)
    se_p = sd_p / math.sqrt(paper_n)
    out["paper_se"] = se_p
    out["equivalence_margin"] = EQUIVALENCE_SDS * max(float(paper_sd), EQUIVALENCE_FLOOR)
    nan = float("nan")
    none = {"ci95": (nan, nan), "equivalence_bound": nan}
    if n == 0 or not np.all(np.isfinite(v)):
        return {**out, **none, "mean": float(np.mean(v)) if n else nan, "sd": nan, "se": nan, "diff": nan,
                "se_diff": nan, "t": nan, "df": nan, "p": nan, "verdict": "failed", "equivalence": "failed",
                "margin": None}
    mean = float(np.mean(v))
    if n < MIN_SPLITS:
        sd = float(np.std(v, ddof=1)) if n > 1 else nan
        return {**out, **none, "mean": mean, "sd": sd, "se": nan, "diff": mean - paper_mean, "se_diff": nan,
                "t": nan, "df": nan, "p": nan, "verdict": "too few splits", "equivalence": "too few splits",
                "margin": None}
    sd = float(np.std(v, ddof=1))
    se = sd / math.sqrt(n)
    var = se**2 + se_p**2 + _PRINT_RESOLUTION**2 / 3.0
    den = se**4 / (n - 1) + se_p**4 / (paper_n - 1)
    df = var**2 / den if den > 0 else math.inf
    diff = mean - float(paper_mean)
    t = diff / math.sqrt(var)
    p = float(2.0 * stats.t.sf(abs(t), df))
    verdict = "no significant difference" if p >= level else ("better" if diff < 0 else "worse")
    se_diff = math.sqrt(var)
    half95 = float(stats.t.ppf(1.0 - level / 2.0, df)) * se_diff
    bound = abs(diff) + float(stats.t.ppf(1.0 - level, df)) * se_diff
    if abs(float(paper_mean)) < _PRINT_RESOLUTION:
        equivalence = "untestable"
    elif bound < out["equivalence_margin"]:
        equivalence = "equivalent"
    elif p < level:
        equivalence = "differs (ours lower)" if diff < 0 else "differs (ours higher)"
    else:
        equivalence = "inconclusive"
    return {**out, "mean": mean, "sd": sd, "se": se, "diff": diff, "se_diff": se_diff, "t": t, "df": df,
            "p": p, "verdict": verdict, "margin": _margin(p, level), "ci95": (diff - half95, diff + half95),
            "equivalence_bound": bound, "equivalence": equivalence}


def testable_pvalues(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """The p-values of comparisons with the paper (:func:`compare_with_paper` rows) that enter a family-wise
    count: NaN for an *untestable* row (the paper's printed 0.00), so :func:`holm` neither rejects nor counts
    it."""
    return [float("nan") if r.get("equivalence") == "untestable" else r["p"] for r in rows]


def holm(pvalues: Sequence[float], level: float = LEVEL) -> list[bool]:
    """Holm's step-down rejections at family-wise ``level`` (:func:`bootens_core.repro.report.holm`)."""
    return report.holm(pvalues, level)


def method_id(record: Mapping[str, Any]) -> str:
    """The method id of a cell record or a summary row (``ensemble`` with 4 hidden layers is ``ensemble-4``,
    the GP is ``gp``)."""
    family, layers = str(record["method"]), int(record["hidden_layers"])
    return family if family == "gp" else f"{family}-{layers}"


def _split_values(records: Sequence[Mapping[str, Any]], metric: str) -> dict[tuple[str, str], dict[int, float]]:
    """(dataset, method id) -> split -> value of ``metric``; a (dataset, split, method) twice is an error; a
    record without the metric's column (the CRPS of a cell made before it existed) is left out."""
    if metric not in _PAIRED_COLUMNS:
        raise ValueError(f"unknown metric {metric!r}: choose from {', '.join(_PAIRED_COLUMNS)}")
    col = _PAIRED_COLUMNS[metric]
    out: dict[tuple[str, str], dict[int, float]] = {}
    for r in records:
        if r.get(col) in (None, ""):
            continue
        cell = out.setdefault((str(r["dataset"]), method_id(r)), {})
        s = int(r["split"])
        if s in cell:
            raise ValueError(f"cell {r['dataset']}/{method_id(r)}/split-{s} appears twice in the records")
        cell[s] = float(r[col])
    return out


def paired(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> dict[str, Any]:
    """Paired comparison of ``a`` and ``b`` on the same splits (two-sided paired t-test at ``level``, as
    ``scipy.stats.ttest_rel``): the mean of ``d = a - b``, its standard error ``SD(d) / sqrt(n)`` (ddof 1),
    ``t``, ``df = n - 1``, ``p``; ``verdict`` ``better`` (a lower) / ``worse`` / ``no significant difference``,
    ``too few splits`` below :data:`MIN_SPLITS` pairs (at 2 the test has one degree of freedom). ``z``: the
    signed normal quantile of ``p`` (positive when a is higher), ``margin``: ``|z(p) - z(level)|``. All
    differences equal: ``p`` is 1 if they are 0, else 0."""
    from scipy import stats

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = int(d.size)
    nan = float("nan")
    base = {"n": n, "mean_a": float(np.mean(a)) if n else nan, "mean_b": float(np.mean(b)) if n else nan,
            "diff": float(np.mean(d)) if n else nan}
    if n < MIN_SPLITS:
        return {**base, "se": nan, "t": nan, "df": nan, "p": nan, "z": nan, "verdict": "too few splits",
                "margin": None}
    mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    se = sd / math.sqrt(n)
    if se > 0:
        t = mean / se
        p = float(2.0 * stats.t.sf(abs(t), n - 1))
    else:
        t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    z = math.copysign(_z_of_p(p), mean) if mean != 0 else 0.0
    verdict = "no significant difference" if p >= level else ("better" if mean < 0 else "worse")
    return {**base, "se": se, "t": t, "df": n - 1, "p": p, "z": z, "verdict": verdict, "margin": _margin(p, level)}


def paired_comparisons(
    records: Sequence[Mapping[str, Any]],
    ensembles: Sequence[str] = ENSEMBLE_IDS,
    baselines: Sequence[str] = BASELINE_IDS,
    metrics: Sequence[str] = ("rmse", "mnll"),
    level: float = LEVEL,
) -> list[dict[str, Any]]:
    """Each ensemble against each baseline on the splits both ran, per dataset and metric (:func:`paired`).

    ``records``: cell records (``cells.csv`` rows, :func:`record_cells`, :func:`result_cells`). A split whose
    value is not finite on either side (a failed fit) is left out of the pair and counted in ``dropped``.
    Rows: dataset, ensemble, baseline, metric, ``splits`` (the common splits used) and :func:`paired`'s fields
    with ``a`` the ensemble (``diff`` = ensemble - baseline; ``better`` = lower error for the ensemble).
    """
    rows = []
    for metric in metrics:
        vals = _split_values(records, metric)
        datasets = list(dict.fromkeys(d for d, _ in vals))
        for ds in datasets:
            for e in ensembles:
                for b in baselines:
                    if (ds, e) not in vals or (ds, b) not in vals:
                        continue
                    ve, vb = vals[(ds, e)], vals[(ds, b)]
                    common = sorted(set(ve) & set(vb))
                    ok = [s for s in common if math.isfinite(ve[s]) and math.isfinite(vb[s])]
                    res = paired([ve[s] for s in ok], [vb[s] for s in ok], level)
                    rows.append({"dataset": ds, "ensemble": e, "baseline": b, "metric": metric, "splits": ok,
                                 "dropped": len(common) - len(ok), **res})
    return rows


def ranking(
    records: Sequence[Mapping[str, Any]], metrics: Sequence[str] = ("rmse", "mnll")
) -> list[dict[str, Any]]:
    """Per dataset and metric, the methods ordered on the splits they share with finite values: ``mean`` over
    those splits and ``mean_rank`` (the average over those splits of the method's rank among the methods,
    1 = lowest error, ties sharing the average rank). Order: by mean rank, then by mean.

    A method enters with at least :data:`MIN_SPLITS` finite splits; while the methods entered share fewer
    than :data:`MIN_SPLITS` splits, the one with the fewest splits leaves (so a method run on one split does
    not cut the others' ranking to that split). A dataset and metric is ranked when at least two methods are
    left. Rows: dataset, metric, position (1 = first), method, splits (how many common splits), mean,
    mean_rank, left_out (the method ids left out there, with their numbers of finite splits)."""
    from scipy import stats

    rows = []
    for metric in metrics:
        vals = _split_values(records, metric)
        for ds in dict.fromkeys(d for d, _ in vals):
            finite = {m: {s for s, x in vals[(ds, m)].items() if math.isfinite(x)}
                      for (d, m) in vals if d == ds}
            ids = [m for m in finite if len(finite[m]) >= MIN_SPLITS]
            while len(ids) >= 2 and len(set.intersection(*(finite[m] for m in ids))) < MIN_SPLITS:
                ids.remove(min(ids, key=lambda m: (len(finite[m]), m)))
            if len(ids) < 2:
                continue
            left_out = {m: len(finite[m]) for m in finite if m not in ids}
            common = sorted(set.intersection(*(finite[m] for m in ids)))
            table = np.array([[vals[(ds, m)][s] for m in ids] for s in common])
            ranks = stats.rankdata(table, axis=1)
            order = sorted(range(len(ids)), key=lambda j: (ranks[:, j].mean(), table[:, j].mean()))
            for pos, j in enumerate(order, start=1):
                rows.append({"dataset": ds, "metric": metric, "position": pos, "method": ids[j],
                             "splits": len(common), "mean": float(table[:, j].mean()),
                             "mean_rank": float(ranks[:, j].mean()), "left_out": left_out})
    return rows


def comparative_claim(
    records: Sequence[Mapping[str, Any]],
    ensembles: Sequence[str] = ENSEMBLE_IDS,
    baselines: Sequence[str] = BASELINE_IDS,
    metrics: Sequence[str] = ("rmse", "mnll"),
    level: float = LEVEL,
) -> dict[str, Any]:
    """The paper's comparative claim -- bootstrap ensembles are competitive with MC dropout, SGHMC and the GP
    (Introduction and Appendix: "either competitive to other methods or better") -- judged on ``records``.

    The rule, fixed before any record was looked at:

    1. A *pair* is a dataset x metric (RMSE, MNLL) on which an ensemble and at least one baseline ran at least
       :data:`MIN_SPLITS` (3) common splits with finite values. (The rule as first fixed said 2; at 2 the
       paired test has one degree of freedom, and the first two 4-layer ensemble splits of Boston and
       Concrete, RMSE 20.3 and 13.2 against baselines near 3 and 5, counted as competitive.)
    2. The *best baseline* of a pair is the baseline with the lowest mean over the splits it shares with the
       ensemble (choosing the strongest opponent after the fact works against the ensemble).
    3. The ensemble is *competitive* on the pair unless a two-sided paired t-test (:func:`paired`, on the
       common splits, at ``level`` = 5%) finds it significantly worse than the best baseline.
    4. The claim *holds* for an ensemble (1 or 4 hidden layers, each judged apart) when it is competitive on
       more than half of its pairs. Overall: ``supported`` when it holds for every ensemble with pairs,
       ``partly supported`` when for some, ``not supported`` when for none, ``not tested`` without any pair.

    Margin (noise units): a pair's is ``|z - z(level)|`` with ``z`` the signed normal quantile of its p-value
    (positive when the ensemble is worse); an ensemble's is the smallest distance at which enough pairs would
    flip to change its outcome (the j-th smallest pair margin on the deciding side, j the number of pairs that
    must flip); the overall one is the smallest of the ensembles'.

    Returns ``{"verdict", "margin", "ensembles": {id: {"pairs", "competitive", "needed", "holds",
    "margin"}}}``, each pair with dataset, metric, best baseline, splits and :func:`paired`'s fields.
    """
    zc = _z_of_p(level)
    per: dict[str, dict[str, Any]] = {}
    vals_by_metric = {m: _split_values(records, m) for m in metrics}
    for e in ensembles:
        pairs = []
        for metric in metrics:
            vals = vals_by_metric[metric]
            for ds in dict.fromkeys(d for d, _ in vals):
                if (ds, e) not in vals:
                    continue
                ve = vals[(ds, e)]
                best = None
                for b in baselines:
                    if (ds, b) not in vals:
                        continue
                    vb = vals[(ds, b)]
                    ok = [s for s in sorted(set(ve) & set(vb)) if math.isfinite(ve[s]) and math.isfinite(vb[s])]
                    if len(ok) < MIN_SPLITS:
                        continue
                    mb = float(np.mean([vb[s] for s in ok]))
                    if best is None or mb < best[1]:
                        best = (b, mb, ok)
                if best is None:
                    continue
                b, _, ok = best
                res = paired([ve[s] for s in ok], [vals[(ds, b)][s] for s in ok], level)
                competitive = res["verdict"] != "worse"
                pairs.append({"dataset": ds, "metric": metric, "baseline": b, "splits": ok, **res,
                              "competitive": competitive, "pair_margin": abs(res["z"] - zc)})
        if not pairs:
            continue
        k, n = sum(p["competitive"] for p in pairs), len(pairs)
        needed = n // 2 + 1
        holds = k >= needed
        side = sorted(p["pair_margin"] for p in pairs if p["competitive"] == holds)
        flips = (k - needed + 1) if holds else (needed - k)
        margin = side[flips - 1] if flips <= len(side) else None
        per[e] = {"pairs": pairs, "competitive": k, "needed": needed, "holds": holds, "margin": margin}
    if not per:
        return {"verdict": "not tested", "margin": None, "ensembles": per}
    held = [v["holds"] for v in per.values()]
    verdict = "supported" if all(held) else ("not supported" if not any(held) else "partly supported")
    margins = [v["margin"] for v in per.values()]
    margin = None if any(m is None for m in margins) else min(margins)
    return {"verdict": verdict, "margin": margin, "ensembles": per}


def published_reference() -> list[dict[str, Any]]:
    """Published UCI results of other papers on the same standard splits (not ours, not the paper's):
    ``bootens_core/data/published_uci.csv``, one row per source x method x dataset x metric, with the ± as
    printed and its convention (``SE``, ``SD`` or ``unstated``), the number of splits, the conversion applied
    (a test log-likelihood LL is stored as MNLL = -LL; the ± is unchanged) and where the number was read."""
    text = resources.files("bootens_core.data").joinpath("published_uci.csv").read_text()
    rows = []
    for r in csv.DictReader(io.StringIO(text)):
        rows.append({**r, "mean": float(r["mean"]), "pm": float(r["pm"]), "n_splits": int(r["n_splits"])})
    return rows


def summarise(records: list[dict[str, Any]], cfg: UCIConfig, level: float = LEVEL) -> dict[str, Any]:
    """Rows of mean, SD and SE over splits per dataset x method x metric, the paper's numbers and the test of
    :func:`compare_with_paper` (its fields in the row); ``std`` is the population SD (ddof 0, as Gal's
    scripts print it), ``sd`` the sample SD (ddof 1) behind ``se``. Counts of verdicts over the RMSE and MNLL
    cells the paper has, and ``cells_differ_holm``: how many of them differ from the paper at family-wise
    ``level`` (Holm's step-down over those cells' p-values)."""
    ref = paper_reference()
    rows = []
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["dataset"], r["method"], int(r["hidden_layers"])), []).append(r)
    for (ds, meth, layers), recs in groups.items():
        for metric, col in METRICS.items():
            vals = np.asarray([float(r[col]) for r in recs])
            mean, std = float(np.mean(vals)), float(np.std(vals))  # std over splits, ddof=0 as Gal's code
            pm = ref.get((ds, meth, layers, metric))
            row = {"dataset": ds, "method": meth, "hidden_layers": layers, "metric": metric, "mean": mean,
                   "std": std, "n_splits": len(recs),
                   "diverged_particles": int(sum(int(r["diverged_particles"]) for r in recs))}
            if pm is not None:
                row.update(compare_with_paper(vals, pm[0], pm[1], uci.PAPER_SPLITS[ds], level))
                row["mean"] = mean  # the plain mean, also where a split failed
            else:
                sd = float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")
                row.update({"sd": sd, "se": sd / math.sqrt(len(vals)), "paper_mean": None, "paper_std": None,
                            "verdict": "not in the paper"})
            rows.append(row)
    compared = [r for r in rows if r["paper_mean"] is not None]
    differ = holm(testable_pvalues(compared), level)
    return {
        "rows": rows,
        "cells_total": len(compared),
        "cells_no_difference": sum(r["verdict"] == "no significant difference" for r in compared),
        "cells_better": sum(r["verdict"] == "better" for r in compared),
        "cells_worse": sum(r["verdict"] == "worse" for r in compared),
        "cells_failed": sum(r["verdict"] == "failed" for r in compared),
        "cells_too_few": sum(r["verdict"] == "too few splits" for r in compared),
        "cells_equivalence": {v: sum(r["equivalence"] == v for r in compared) for v in EQUIVALENCE_VERDICTS},
        "cells_differ_holm": int(sum(differ)),
        "n_cells": len(records),
        "datasets": list(cfg.datasets),
        "methods": list(cfg.methods),
        "n_particles": cfg.n_particles,
        "diverged_particles_total": int(sum(int(r["diverged_particles"]) for r in records)),
        "wall_s_cells_total": float(sum(float(r["wall_s"]) for r in records)),
        "level": level,
        "verdict_rule": (f"Welch-type t-test of our mean over splits against the paper's (SE = SD / sqrt(n) on "
                         f"both sides, the paper's SD at least 0.005 and its printed mean +-0.005), two-sided at "
                         f"{level:g}: no significant difference, else better (lower) or worse; equivalence: "
                         f"TOST at {level:g} within {EQUIVALENCE_SDS:g} x the paper's SD (at least "
                         f"{EQUIVALENCE_FLOOR:g}), else differs (p < {level:g}) or inconclusive; "
                         "untestable where the paper prints 0.00"),
    }


def cell_device(record: Mapping[str, Any]) -> str:
    """Where a cell record was computed: its ``device`` (a ``cells.csv`` row), else the device kind of its
    ``provenance`` (a stored cell), else ``""`` (not recorded)."""
    if record.get("device"):
        return str(record["device"])
    prov = record.get("provenance")
    device = prov.get("device") if isinstance(prov, Mapping) else None
    return str(device.get("kind") or "") if isinstance(device, Mapping) else ""


def cells_csv(records: list[dict[str, Any]]) -> str:
    """``cells.csv``: one row per dataset x split x method with the :data:`~bootens_core.repro.harness.CELL_FIELDS`
    and ``device`` (:func:`cell_device`), so that a record extended later still says where each cell ran, then
    the :data:`~bootens_core.repro.harness.CALIBRATION_FIELDS` (empty for a cell made before they existed;
    ``pit_counts`` as counts separated by spaces) -- when a record has them: a record none of whose cells has
    them keeps the columns it was written with."""
    buf = io.StringIO()
    calibrated = any(r.get(k) not in (None, "") for r in records for k in harness.CALIBRATION_FIELDS)
    fields = [*harness.CELL_FIELDS, "device", *(harness.CALIBRATION_FIELDS if calibrated else ())]
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in records:
        row = {k: (f"{float(r[k]):.6g}" if isinstance(r[k], float) else r[k]) for k in harness.CELL_FIELDS}
        for k in harness.CALIBRATION_FIELDS:
            v = r.get(k)
            if isinstance(v, list | tuple):
                row[k] = " ".join(str(int(c)) for c in v)
            elif v is not None and v != "":
                row[k] = f"{float(v):.6g}"
        w.writerow({**row, "device": cell_device(r)})
    return buf.getvalue()


def lbfgs_check(
    key: jax.Array,
    cfg: UCIConfig,
    *,
    dataset: str = "boston",
    split: int = 0,
    hidden_layers: int = 1,
    noise_var: float = 0.1,
    steps: int | None = None,
    use_cache: bool = True,
) -> dict[str, Any]:
    """One particle of a UCI cell, optimised by the paper's L-BFGS and by references (float64).

    Returns the loss curves (``-log p~`` per iteration) of: ``fixed`` -- the fixed-step L-BFGS of the
    ensembles (a plain loop over ``optax.lbfgs``); ``train`` -- the same particle through
    :func:`bootens_core.ensemble.train` (must equal ``fixed``); ``zoom`` -- optax's L-BFGS with its zoom line
    search; ``scipy`` -- ``scipy.optimize.minimize(method="L-BFGS-B")`` with the same memory and iteration
    budget. ``direction_rel_err`` is, at every fixed step, the relative difference between optax's update
    and ``-step * gamma_k * H_k g_k`` built from the same (s, y) pairs by scipy's ``LbfgsInvHessProduct``
    (which starts from the identity; scaling y by gamma_k and the product by gamma_k gives the gamma_k I
    start).

    The paper's optimizer as written, ``torch.optim.LBFGS(lr=lbfgs_step_size, max_iter=m,
    history_size=lbfgs_memory)`` with ``m = min(lbfgs_iters_per_step, steps)``, stepped ``steps // m`` times
    (:func:`bootens_core.ensemble.lbfgs.torch_lbfgs`): ``torch`` -- its loss at the start of every outer step,
    ``torch_iters`` -- the iterations made before each of them (the x-axis of ``torch`` beside the others),
    ``final["torch"]``; ``torch_pairs`` -- curvature pairs it built, stored and skipped (``y.s <= 1e-10``;
    counted exactly only when ``lbfgs_memory > m``, else ``None``). Why optax's fixed step can climb:
    ``fixed_uphill`` -- the fixed-step iterations whose update points uphill (``g.d >= 0``), and
    ``fixed_negative_pairs`` -- the pairs with ``y.s <= 0`` that optax stored (torch would have skipped
    them).

    The record is kept in the result cache under its arguments (``use_cache=False``: neither read nor written).
    """
    steps = cfg.lbfgs.steps if steps is None else int(steps)
    args = _StudyArgs(cfg, dataset, split, hidden_layers, noise_var, steps)
    return store.cached_record("uci-lbfgs-check", key, args, lambda: _lbfgs_check(key, args), use_cache=use_cache)


@dataclasses.dataclass(frozen=True)
class _StudyArgs:
    """What decides a study of one UCI split beside the configuration (its result-cache key)."""

    cfg: UCIConfig
    dataset: str
    split: int
    hidden_layers: int = 1
    noise_var: float | None = None
    steps: int | None = None
    step_sizes: tuple[float, ...] = ()


def _lbfgs_check(key: jax.Array, args: _StudyArgs) -> dict[str, Any]:
    from scipy.optimize import LbfgsInvHessProduct, minimize

    cfg, dataset, split, hidden_layers, noise_var, steps = (args.cfg, args.dataset, args.split, args.hidden_layers,
                                                             args.noise_var, args.steps)
    data = uci.load(dataset, split)
    model = _mlp(data.x_train.shape[1], hidden_layers, cfg.network)
    x = jnp.asarray(data.x_train, jnp.float64)
    y = jnp.asarray(data.y_train, jnp.float64)
    opt = ensemble.optimizer("lbfgs", cfg.lbfgs.step_size, memory_size=cfg.lbfgs.memory, linesearch=None)
    state = ensemble.init(key, model, y, noise_var, 1, opt)
    pert = state.perturbation
    one = jax.tree.map(lambda a: a[0], pert)
    theta0, unravel = models.ravel(jax.tree.map(lambda a: a[0], state.params))

    from ....perturb import perturbed_log_joint

    def loss_flat(w):
        return -perturbed_log_joint(model, unravel(w), x, one, noise_var)

    loss_grad = jax.jit(jax.value_and_grad(loss_flat))

    # Fixed-step L-BFGS by hand on the flat vector, recording (s, y) pairs and updates.
    tx = optax.lbfgs(cfg.lbfgs.step_size, memory_size=cfg.lbfgs.memory, linesearch=None)
    tx_update = jax.jit(tx.update)
    v, st = theta0, tx.init(theta0)
    fixed, rel_err, s_hist, y_hist, prev, uphill = [], [], [], [], None, 0
    for _ in range(steps):
        val, g = loss_grad(v)
        fixed.append(float(val))
        upd, st = tx_update(g, st, v)
        gn = np.asarray(g)
        uphill += int(float(np.dot(gn, np.asarray(upd))) >= 0)
        if prev is None:
            ref = -cfg.lbfgs.step_size * min(1.0, 1.0 / np.linalg.norm(gn)) * gn
        else:
            s_hist.append(np.asarray(v) - prev[0])
            y_hist.append(gn - prev[1])
            sk, yk = np.array(s_hist[-cfg.lbfgs.memory:]), np.array(y_hist[-cfg.lbfgs.memory:])
            gamma = float(sk[-1] @ yk[-1] / (yk[-1] @ yk[-1]))
            ref = -cfg.lbfgs.step_size * gamma * LbfgsInvHessProduct(sk, gamma * yk).matvec(gn)
        rel_err.append(float(np.linalg.norm(np.asarray(upd) - ref) / np.linalg.norm(ref)))
        prev = (np.asarray(v), gn)
        v = v + upd

    trained = ensemble.train(key, model, x, y, noise_var=noise_var, n_particles=1, opt=opt, steps=steps,
                             on_diverged="report")

    ztx = optax.lbfgs(cfg.lbfgs.step_size, memory_size=cfg.lbfgs.memory)
    vz, sz, zoom = theta0, ztx.init(theta0), []

    def value_only(w):
        return loss_grad(w)[0]

    @jax.jit
    def zoom_step(w, s):
        val, g = optax.value_and_grad_from_state(value_only)(w, state=s)
        upd, s = ztx.update(g, s, w, value=val, grad=g, value_fn=value_only)
        return optax.apply_updates(w, upd), s, val

    for _ in range(steps):
        vz, sz, val = zoom_step(vz, sz)
        zoom.append(float(val))

    sp: list[float] = []

    def fun(w):
        val, g = loss_grad(jnp.asarray(w))
        return float(val), np.asarray(g, np.float64)

    res = minimize(fun, np.asarray(theta0), jac=True, method="L-BFGS-B",
                   options={"maxiter": steps, "maxcor": cfg.lbfgs.memory},
                   callback=lambda w: sp.append(fun(w)[0]))

    # torch.optim.LBFGS(lr, max_iter=m, history_size=lbfgs_memory), stepped steps // m times.
    from ....ensemble.lbfgs import torch_lbfgs

    m_iter = max(1, min(cfg.lbfgs.iters_per_step, steps))
    ttx = torch_lbfgs(cfg.lbfgs.step_size, max_iter=m_iter, history_size=cfg.lbfgs.memory)

    @jax.jit
    def torch_step(w, s):
        val, g = loss_grad(w)
        upd, s = ttx.update(g, s, w, value=val, grad=g, value_fn=loss_flat)
        return w + upd, s, val

    vt, stt = theta0, ttx.init(theta0)
    torch_curve, torch_iters, stored = [], [], 0
    for _ in range(steps // m_iter):
        before = (int(stt.hist_count), int(stt.hist_start))
        torch_iters.append(int(stt.n_iter))
        vt, stt, val = torch_step(vt, stt)
        torch_curve.append(float(val))
        stored += int(stt.hist_count) - before[0] + (int(stt.hist_start) - before[1]) % cfg.lbfgs.memory
    built = max(int(stt.n_iter) - 1, 0)  # every iteration but the very first builds a pair
    exact = cfg.lbfgs.memory > m_iter
    neg_pairs = sum(int(float(np.dot(a, b)) <= 0) for a, b in zip(s_hist, y_hist))
    return {
        "fixed": np.asarray(fixed),
        "train": np.asarray(trained.loss[:, 0]),
        "zoom": np.asarray(zoom),
        "scipy": np.asarray([fun(np.asarray(theta0))[0], *sp]),
        "torch": np.asarray(torch_curve),
        "torch_iters": np.asarray(torch_iters),
        "torch_pairs": {"built": built, "stored": stored if exact else None,
                        "skipped": built - stored if exact else None},
        "fixed_uphill": uphill,
        "fixed_negative_pairs": neg_pairs,
        "final": {"fixed": float(loss_grad(v)[0]), "zoom": float(value_only(vz)), "scipy": float(res.fun),
                  "torch": float(loss_grad(vt)[0])},
        "scipy_nfev": int(res.nfev),
        "direction_rel_err": np.asarray(rel_err),
        "n_params": int(theta0.shape[0]),
        "dataset": dataset, "split": split, "hidden_layers": hidden_layers, "noise_var": noise_var,
    }


def deep_lr_check(
    key: jax.Array,
    cfg: UCIConfig,
    *,
    learning_rates: tuple[float, ...] = (0.1, 0.01),
    datasets: tuple[str, ...] = ("boston", "yacht"),
    splits: int = 3,
) -> list[dict[str, Any]]:
    """The deep-ensemble cells of ``datasets`` (first ``splits`` splits) at each Adam learning rate, every other
    setting from ``cfg``: the evidence behind the harness's learning rate (their protocol as we read it says
    0.1; ``UCIConfig.deep`` takes 0.01). The cells are computed (never read from a store) with the run's keys,
    so the row of ``cfg.deep.lr`` repeats the run's own cells. Rows: ``lr`` and the cell record's fields."""
    if not learning_rates or splits < 1:
        raise ValueError("deep_lr_check needs at least one learning rate and one split")
    rows = []
    for lr in learning_rates:
        c = dataclasses.replace(cfg, deep=dataclasses.replace(cfg.deep, lr=float(lr)))
        for ds in datasets:
            for s in range(min(int(splits), uci.PAPER_SPLITS[ds])):
                rows.append({"lr": float(lr), **compute_cell(key, c, Cell(ds, s, "deep-1"))})
    return rows


def sghmc_step_study(
    key: jax.Array,
    cfg: UCIConfig,
    *,
    dataset: str = "boston",
    split: int = 0,
    step_sizes: tuple[float, ...] = (1e-3, 3e-3, 1e-2, 3e-2),
    noise_var: float | None = None,
    use_cache: bool = True,
) -> dict[str, Any]:
    """Scale-adapted SGHMC on one UCI split for several step sizes ``eps`` (``lr_scaling="none"``), every other
    setting from ``cfg`` (the paper's: 10 restarts x 20 draws, burn-in 2000, thin 2000, batch 20).

    ``noise_var`` (standardised label units) is fixed across step sizes; ``None`` takes the GP's noise fitted
    by the marginal likelihood on the same training split (the data's own noise level, no grid search).
    For every ``eps``: test RMSE, MNLL and 95% coverage of the mixture of the kept draws (original units),
    the restarts that diverged (left out), the predictive R-hat across restarts on the test inputs (mean and
    max over points; 1 = the restarts agree), the median log joint of the last kept draws and the wall time.
    The record is kept in the result cache under its arguments (``use_cache=False``: neither read nor written).
    """
    args = _StudyArgs(cfg, dataset, split, noise_var=noise_var, step_sizes=tuple(float(e) for e in step_sizes))
    return store.cached_record("uci-sghmc-study", key, args, lambda: _sghmc_step_study(key, args),
                               use_cache=use_cache)


def _sghmc_step_study(key: jax.Array, args: _StudyArgs) -> dict[str, Any]:
    from ....baselines import gp

    cfg, dataset, split, noise_var, step_sizes = args.cfg, args.dataset, args.split, args.noise_var, args.step_sizes
    data = uci.load(dataset, split)
    if noise_var is None:
        noise_var = float(gp.fit_predict(key, data.x_train, data.y_train, data.x_test, method="gpr").noise_var)
    model = _mlp(data.x_train.shape[1], 1, cfg.network)
    dtype = jnp.dtype(cfg.network.dtype)
    rows = []
    for eps in step_sizes:
        start = time.perf_counter()
        res = samplers.sghmc_model(
            key, model, data.x_train, data.y_train, noise_var, n_restarts=cfg.sghmc.restarts,
            n_draws=cfg.sghmc.draws, burn_in=cfg.sghmc.burn_in, thin=cfg.sghmc.thin, lr=float(eps),
            mdecay=cfg.sghmc.mdecay, batch_size=min(cfg.sghmc.batch_size, data.x_train.shape[0]),
            lr_scaling="none", on_diverged="report", dtype=dtype,
        )
        wall = time.perf_counter() - start
        ok = ~np.asarray(res.info["diverged"], bool)
        kept = res._replace(params=jax.tree.map(lambda a: a[ok], res.params))
        draws = jax.tree.map(lambda a: a.reshape((-1, *a.shape[2:])), kept.params)
        f = np.asarray(models.predict(model, draws, jnp.asarray(data.x_test, dtype)), np.float64)
        scores = harness.evaluate(data.y_test, Prediction(f, noise_var), data.y_std) if f.size else {
            "test_rmse": math.nan, "test_mnll": math.nan, "coverage95": math.nan}
        diag = samplers.predictive_diagnostics(model, kept, data.x_test) if ok.sum() > 1 else {}
        log_joint = np.asarray(res.log_density)[ok, -1]
        rows.append({
            "step_size": float(eps), **scores, "diverged_restarts": int((~ok).sum()),
            "rhat_mean": diag.get("rhat_mean", math.nan), "rhat_max": diag.get("rhat_max", math.nan),
            "log_joint_last_median": float(np.median(log_joint)) if log_joint.size else math.nan, "wall_s": wall,
        })
    return {"dataset": dataset, "split": split, "noise_var_std_units": noise_var, "rows": rows,
            "settings": plain(cfg.sghmc)}


# --------------------------------------------------------------------------------------------------------------
# A run that fits a short device window: priority order, cost units, budget, shards, packs and folding them.

# The order of :func:`priority`: method ids first (the paper's ensembles, the 4-layer column first; then MC
# dropout and SGHMC; GP; then the baselines beyond the paper's columns), then datasets, largest training set
# first, then splits.
PRIORITY_METHODS = ("ensemble-4", "ensemble-1", "mcd-4", "mcd-1", "sghmc-1", "gp", "deep-1", "plain-1", "plain-4")
PRIORITY_DATASETS = ("protein", "naval", "power", "kin8nm", "wine", "concrete", "energy", "boston", "yacht")
# (training rows, inputs) of every split of each dataset (the splits of a dataset have equal sizes; a test
# checks these against the files).
TRAIN_SHAPES: dict[str, tuple[int, int]] = {
    "boston": (455, 13), "concrete": (927, 8), "energy": (691, 8), "kin8nm": (7373, 8), "naval": (10741, 16),
    "power": (8611, 4), "protein": (41157, 9), "wine": (1439, 11), "yacht": (277, 6),
}
# n_epochs.txt of Gal's protocol (MC dropout trains n_epochs x mcd_epochs_x epochs on every grid point; the
# grid is 4 dropout rates x 3 precisions on every dataset).
_MCD_EPOCHS = {name: (20 if name == "protein" else 40) for name in TRAIN_SHAPES}
GP_SKIPPED = "GP cells skipped: GPflow/TensorFlow not installed"


def priority(cell_list: Sequence[Cell]) -> list[Cell]:
    """``cell_list`` in the order a short window runs it: by method id in :data:`PRIORITY_METHODS` order
    (``ensemble-4``, ``ensemble-1``, ``mcd-4``, ``mcd-1``, ``sghmc-1``, ``gp``), then by dataset in
    :data:`PRIORITY_DATASETS` order (Protein, Naval, Power, Kin8nm, then the rest by decreasing size), then by
    split. Unknown ids or datasets go last, in their given order."""

    def rank(order: tuple[str, ...], name: str) -> int:
        return order.index(name) if name in order else len(order)

    def key(c: Cell) -> tuple[int, int, int]:
        return rank(PRIORITY_METHODS, c.method), rank(PRIORITY_DATASETS, c.dataset), c.split

    return sorted(cell_list, key=key)


def cost_units(method_id: str, dataset: str, cfg: UCIConfig) -> float:
    """The size of a cell, the ``c`` by which :class:`~bootens_core.repro.cellpack.CellTimes` scales a measured cell
    time to another dataset or depth (only ratios within a method family matter).

    ``ensemble`` (full-batch L-BFGS): training rows ``n`` x parameters ``P`` of the network
    (``P = (d + 1) w + (L - 1)(w + 1) w + w + 1`` for ``L`` hidden layers of ``w`` units on ``d`` inputs);
    ``mcd``: that x the protocol's epochs (20 on Protein, else 40; the grid has 12 points everywhere);
    ``sghmc`` (minibatches): ``P`` x (gradient rows, ``restarts x (burn_in + thin x draws) x batch``, plus the
    rows the kept draws predict, ``restarts x draws x 0.2 n``); ``gp``: ``n^3`` (exact GPR) or
    ``n x n_inducing^2`` (SVGP datasets); ``plain`` as ``ensemble``; ``deep`` (minibatches, one pass over the
    rows per epoch): ``n`` x ``P`` of its network (two outputs, its own width) x epochs. The particles, steps
    and grids are the same for every cell of a run.
    """
    if dataset not in TRAIN_SHAPES:
        raise ValueError(f"unknown UCI dataset {dataset!r}")
    n, d = TRAIN_SHAPES[dataset]
    family, _, layers = method_id.partition("-")
    if family == "gp":
        return float(n) * cfg.gp.n_inducing**2 if dataset in cfg.gp.svgp_datasets else float(n) ** 3
    depth, w = max(int(layers or 1), 1), cfg.network.width
    if family == "deep":
        w = cfg.deep.width_large if dataset == "protein" else cfg.deep.width
        return float(n) * ((d + 1) * w + (depth - 1) * (w + 1) * w + 2 * (w + 1)) * cfg.deep.epochs
    params = (d + 1) * w + (depth - 1) * (w + 1) * w + w + 1
    if family == "sghmc":
        steps = cfg.sghmc.restarts * (cfg.sghmc.burn_in + cfg.sghmc.thin * cfg.sghmc.draws)
        predicted = cfg.sghmc.restarts * cfg.sghmc.draws * 0.2 * n
        return float(params) * (steps * min(cfg.sghmc.batch_size, n) + predicted)
    units = float(n) * params
    return units * _MCD_EPOCHS[dataset] if family == "mcd" else units


def gp_available() -> bool:
    """Whether GPflow and TensorFlow can be imported (found without importing them)."""
    import importlib.util

    for name in ("tensorflow", "gpflow"):
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):
            return False
    return True


def reference_times(paths: Sequence[str | Path]) -> list[cellpack.Measurement]:
    """Cell times measured elsewhere, as references for the estimates of :func:`run_pending`.

    Each path is a record folder (its ``cells.csv``, with the device of its ``provenance.json``), a
    ``cells.csv`` file (device unknown) or a cell pack (each cell's own provenance). A path that is none of
    these is a one-line ``ValueError``.
    """
    out: list[cellpack.Measurement] = []
    for path in map(Path, paths):
        device = None
        if path.is_dir():
            table = path / "cells.csv"
            if (path / "provenance.json").is_file():
                try:
                    record = json.loads((path / "provenance.json").read_text())
                    device = (record.get("device") or {}).get("kind")
                except (OSError, json.JSONDecodeError, AttributeError):
                    device = None
        elif path.name.endswith((".tar.gz", ".tgz")):
            _, members = cellpack.read_pack(path)
            out += [m for rec in members.values() if (m := cellpack.measurement(rec, own=False)) is not None]
            continue
        else:
            table = path
        if not table.is_file() or table.suffix != ".csv":
            raise ValueError(f"--cell-times {path}: not a record folder with cells.csv, a cells.csv or a "
                             "cell pack")
        try:
            rows = list(csv.DictReader(io.StringIO(table.read_text())))
        except (OSError, csv.Error, UnicodeDecodeError) as exc:
            raise ValueError(f"--cell-times {table}: unreadable ({exc})") from exc
        if rows and not {"dataset", "method", "hidden_layers", "wall_s"} <= set(rows[0]):
            raise ValueError(f"--cell-times {table}: not a cells.csv (needs dataset, method, hidden_layers, "
                             "wall_s)")
        out += [m for r in rows if (m := cellpack.measurement(r, own=False, device=device)) is not None]
    return out


def _cell_provenance() -> dict[str, Any]:
    """What every cell computed in this process carries: device, float32 matmul precision, versions, git
    commit, source hash, Python."""
    prov = store.provenance()
    return {k: prov[k] for k in ("device", "matmul_precision", "versions", "git_commit", "source_hash", "python",
                                 "machine")}


def _timed_cell(key: jax.Array, cfg: UCIConfig, prov: dict[str, Any], cell: Cell) -> dict[str, Any]:
    """:func:`compute_cell` plus, beside the record's fields, ``compile_s`` / ``compiles`` (XLA compilations in
    this cell's thread) and ``provenance`` (``prov`` + the cell's whole elapsed seconds, data loading included,
    and when it finished)."""
    return _timed(lambda: [compute_cell(key, cfg, cell)], prov)[0]


def _timed_cells(key: jax.Array, cfg: UCIConfig, prov: dict[str, Any], cells_: Sequence[Cell]) -> list[dict[str, Any]]:
    """:func:`compute_cells` with :func:`_timed_cell`'s fields, each cell's its share of the group's: compile
    seconds and elapsed seconds over the cells (the group's compilations are every cell's ``compiles``)."""
    return _timed(lambda: compute_cells(key, cfg, cells_), prov)


def _timed(compute: Callable[[], list[dict[str, Any]]], prov: dict[str, Any]) -> list[dict[str, Any]]:
    start = time.perf_counter()
    with CompileCounter(per_thread=True) as timer:
        recs = compute()
    elapsed = time.perf_counter() - start
    for rec in recs:
        rec["compile_s"] = float(timer.seconds) / len(recs)
        rec["compiles"] = int(timer.compiles)
        rec["provenance"] = {**prov, "elapsed_s": elapsed / len(recs),
                             "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return recs


def _groups(cells_: Sequence[Cell]) -> dict[Cell, list[Cell]]:
    """The cells in runs of one dataset and one ensemble method (consecutive in the given order), by the run's
    first cell; every other cell alone."""
    groups: dict[Cell, list[Cell]] = {}
    last: Cell | None = None
    for c in cells_:
        if (last is not None and (last.dataset, last.method) == (c.dataset, c.method)
                and c.method.partition("-")[0] in _AT_ONCE_FAMILIES):
            groups[last].append(c)
        else:
            last = c
            groups[c] = [c]
    return groups


# The method families whose cells of one dataset run at once (compute_cells): those with Method.fit_many.
_AT_ONCE_FAMILIES = ("ensemble", "plain")


class PendingRun(NamedTuple):
    """What :func:`run_pending` did.

    ``ran``: cells computed and stored now (finishing order); ``remaining``: the shard's cells still not stored,
    in priority order, each with its estimated seconds in a fresh process (compilation counted once per method
    and dataset); ``failed``: cells that raised (one-line reason; they are in ``remaining`` too);
    ``skipped``: cells not attempted here (GP without GPflow/TensorFlow); ``notes``: lines to show;
    ``stored_before``: the shard's cells already stored; ``store_dir`` and ``pack`` (path or ``None``).
    """

    ran: list[Cell]
    remaining: list[tuple[Cell, float]]
    failed: list[tuple[Cell, str]]
    skipped: list[Cell]
    notes: list[str]
    stored_before: list[Cell]
    store_dir: Path
    pack: Path | None


def _rel(cell_store: harness.CellStore, cell: Cell) -> str:
    return cell_store.path(cell).relative_to(cell_store.root).as_posix()


def _pack_cells_kept(path: Path, cell_store: harness.CellStore, cells: Sequence[Cell]) -> dict[Cell, bytes]:
    """The cells an existing pack at ``path`` holds, as bytes by cell, for a run that rewrites it; every member
    must be one of ``cells`` at the store's keys, else a one-line ``ValueError``. No file: nothing."""
    if not path.exists():
        return {}
    _, members = cellpack.read_pack(path)
    by_rel = {_rel(cell_store, c): c for c in cells}
    foreign = sorted(set(members) - set(by_rel))
    if foreign:
        raise ValueError(f"cell pack {path} already holds {len(foreign)} cell(s) of other settings, code or "
                         f"datasets (e.g. {foreign[0]}); a run rewrites its pack, so give --pack another path")
    return {by_rel[rel]: (json.dumps(rec, indent=1, sort_keys=True)).encode() for rel, rec in members.items()}


def run_pending(
    key: jax.Array,
    cfg: UCIConfig,
    *,
    budget_s: float | None = None,
    shard: tuple[int, int] = (0, 1),
    references: Sequence[cellpack.Measurement] = (),
    default_s: float = 600.0,
    safety: float = 1.25,
    pack: str | Path | None = None,
    pack_all: bool = False,
    force: bool = False,
    progress: bool = False,
    clock: Callable[[], float] = time.monotonic,
    start: float | None = None,
    compute: Callable[[Cell], dict[str, Any]] | None = None,
    root: str | Path | None = None,
    recorded: Collection[Cell] = (),
    at_once: bool = False,
) -> PendingRun:
    """Run the cells of ``cfg`` not yet stored, in :func:`priority` order, within ``budget_s`` seconds.

    - **Which cells**: the priority order of every cell of ``cfg``, then ``shard = (I, N)`` keeps the cells at
      positions ``I mod N`` of it (:func:`~bootens_core.repro.cellpack.shard`: independent of what is stored, so the N
      shards cover every cell once), then the stored ones are passed over (all recomputed with ``force``). GP
      cells are skipped, with the note :data:`GP_SKIPPED`, where GPflow/TensorFlow cannot be imported; they stay
      remaining. Cells in ``recorded`` (:func:`recorded_cells`: held by committed records at these settings)
      are passed over and are not remaining; a note counts them.
    - **The budget** (seconds from ``start``, a ``clock()`` value; default now; ``None``: no budget): a cell
      starts only when its estimate fits (:func:`~bootens_core.repro.cellpack.admissible`, which counts the cells
      still running with ``cfg.cell_workers > 1``); one that does not fit is passed over for a later one that does.
    - **Estimates** (:class:`~bootens_core.repro.cellpack.CellTimes`, rule in its docstring, ``safety`` and
      ``default_s`` as there): from the ``wall_s``/``compile_s`` of the configuration's stored cells (those of
      this run join as they finish), else ``references`` (:func:`reference_times`), scaled between datasets and
      depths of one method family by :func:`cost_units`; preferring measurements on this device. A family
      not yet measured on this device gets one probe, its cheapest cell, started although its estimate (from
      another device) does not fit (:meth:`~bootens_core.repro.cellpack.CellTimes.probe`); the run's
      ``notes`` name it.
    - **Records**: each computed cell carries ``compile_s``, ``compiles`` and ``provenance`` (device, versions,
      git commit, source hash, elapsed seconds) beside the usual fields, and is stored at once, atomically.
    - **Pack** (``pack``: a ``.tar.gz`` path): rewritten after every finished cell (it exists from the start,
      empty), with the cells computed now -- or every stored cell of ``cfg`` with ``pack_all`` -- under their
      store-relative paths, and a ``pack.json`` manifest (config, family hashes, provenance, shard, budget,
      what remains). A run cut off keeps a whole pack of what had finished. A pack already at that path keeps
      its cells in the new one (a run resumed on another machine, or with another cell store, loses nothing),
      provided they are cells of ``cfg`` at this code's keys; otherwise the run refuses, before any cell,
      with one ``ValueError`` naming the pack.

    - **At once** (``at_once``): the pending cells of one dataset and ensemble method that follow each other in
      the shard's order run as one group (:func:`compute_cells`: every split in one program), started when
      the sum of their estimates fits; each is still stored, packed and reported as a cell.

    ``compute`` replaces the cell computation (tests: a function of one cell, or with ``at_once`` of a list of
    cells giving their records); ``root`` the cell store's folder.
    """
    t0 = clock() if start is None else float(start)
    all_cells = priority(cells(cfg))
    mine = cellpack.shard(all_cells, *shard)
    recorded = set(recorded)
    held = [c for c in mine if c in recorded]
    mine = [c for c in mine if c not in recorded]
    root = Path(root) if root is not None else store_dir(key, cfg)
    cell_store = _CellStore(root, cfg)
    prov = _cell_provenance()
    times = cellpack.CellTimes(functools.partial(cost_units, cfg=cfg), device=str(prov["device"]["kind"]),
                               default_s=default_s, safety=safety)
    stored_all: set[Cell] = set()
    for cell in all_cells:
        rec = cell_store.get(cell)
        if rec is not None:
            stored_all.add(cell)
            times.add_all([cellpack.measurement(rec, own=True)])
    times.add_all(cellpack.Measurement(*m[:5], own=False) for m in references)
    skipped = [] if gp_available() else [c for c in mine if c.method == "gp"]
    notes = [GP_SKIPPED] if skipped else []
    if held:
        notes.append(f"passed over {len(held)} cell(s) that the records given already hold at these settings")
    runnable = [c for c in mine if c not in set(skipped)]
    ran: list[Cell] = []
    pack_path = None if pack is None else Path(pack)
    carried = _pack_cells_kept(pack_path, cell_store, all_cells) if pack_path is not None else {}

    def write(remaining: list[str] | None = None) -> None:
        if pack_path is None:
            return
        chosen = [c for c in all_cells if c in stored_all] if pack_all else list(ran)
        chosen += [c for c in all_cells if c in carried and c not in set(chosen)]
        files = {_rel(cell_store, c): carried[c] for c in chosen if c in carried}
        files.update({_rel(cell_store, c): cell_store.path(c).read_bytes() for c in chosen
                      if c in stored_all})
        manifest = {
            "format": cellpack.PACK_FORMAT, "experiment": NAME, "config": as_dict(cfg),
            "family_hashes": dict(cell_store._hash), "key": store.key_words(key), "provenance": prov,
            "shard": f"{shard[0]}/{shard[1]}", "budget_s": budget_s, "pack_all": pack_all,
            "cells": [{"path": _rel(cell_store, c), "label": c.label} for c in chosen],
            "ran_now": len(ran), "remaining": remaining,
            "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        cellpack.write_pack(pack_path, files, manifest)

    def on_finish(cell: Cell, rec: dict[str, Any]) -> None:
        ran.append(cell)
        stored_all.add(cell)
        times.add_all([cellpack.measurement(rec, own=True, device=times.device)])
        times.warm(cell.method, cell.dataset)
        write()

    write()
    stored_before = set(stored_all)
    if at_once:
        groups = _groups([c for c in runnable if force or c not in stored_all])
        grouped = compute or functools.partial(_timed_cells, key, cfg, prov)
        later: dict[Cell, dict[str, Any]] = {}

        def compute_group(first: Cell) -> dict[str, Any]:
            recs = grouped(groups[first])
            later.update(zip(groups[first][1:], recs[1:], strict=True))
            return recs[0]

        def finish_group(first: Cell, rec: dict[str, Any]) -> None:
            on_finish(first, rec)
            for c in groups[first][1:]:
                cell_store.put(c, later.pop(c))
                on_finish(c, cell_store.get(c))

        outcome = cellpack.run_budgeted(
            list(groups), compute_group, cell_store,
            estimate=lambda first: sum(times.estimate(c) for c in groups[first]), budget_s=budget_s,
            workers=cfg.cell_workers, clock=clock, start=t0, on_finish=finish_group, force=force,
            progress=progress, probe=times.probe,
        )
        outcome = outcome._replace(
            stored=[c for c in runnable if not force and c in stored_before],
            remaining=[c for first in outcome.remaining for c in groups.get(first, [first])],
            failed=[(c, why) for first, why in outcome.failed for c in groups[first]])
    else:
        outcome = cellpack.run_budgeted(
            runnable, compute or functools.partial(_timed_cell, key, cfg, prov), cell_store,
            estimate=times.estimate, budget_s=budget_s, workers=cfg.cell_workers, clock=clock, start=t0,
            on_finish=on_finish, force=force, progress=progress, probe=times.probe,
        )
    for cell in times.probed:
        notes.append(f"probe: {cell.label} started although its estimate did not fit, as no "
                     f"{cell.method.partition('-')[0]} cell had been measured on {times.device}")
    left = set(outcome.remaining) | set(skipped)
    remaining, seen = [], set()
    for cell in mine:
        if cell in left:
            remaining.append((cell, times.estimate(cell, warm=(cell.method, cell.dataset) in seen)))
            seen.add((cell.method, cell.dataset))
    write([c.label for c, _ in remaining])
    return PendingRun(ran, remaining, outcome.failed, skipped, notes, outcome.stored, root, pack_path)


# A packed cell file: <dataset>/<method id>-<family hash>/split-<k>.json (the layout of _CellStore).
_PACKED = re.compile(r"^(?P<dataset>[a-z0-9]+)/(?P<method>[a-z]+(?:-\d+)?)-(?P<hash>[0-9a-f]{12})/"
                     r"split-(?P<split>\d+)\.json$")


class FoldReport(NamedTuple):
    """What :func:`fold` did: cells written into ``store_dir`` (``replaced`` of them were there already),
    ``outside`` of them not cells of the configuration's selection (stored, but not in its summary), ``forced``
    of them made with another family hash (taken because of ``force``), and ``packs`` read."""

    store_dir: Path
    written: int
    replaced: int
    outside: int
    forced: int
    packs: list[str]


def fold(
    packs: Sequence[str | Path],
    key: jax.Array,
    cfg: UCIConfig,
    *,
    force: bool = False,
    root: str | Path | None = None,
) -> FoldReport:
    """Merge the cells of pack files (:func:`run_pending`'s ``pack``) into the cell store of ``key`` and ``cfg``
    (``root``: another store folder), computing nothing; :func:`from_cells` then assembles the record.

    A packed cell's folder names its method family's hash (settings + code, :func:`_family_hash`). Cells whose
    hash is not the one this configuration and this code give are refused -- nothing is written, one-line
    ``ValueError`` -- unless ``force``, which stores them under the current hash. A later pack's cell replaces
    an earlier one's and a stored one. A malformed pack or cell is a one-line ``ValueError``.
    """
    root = Path(root) if root is not None else store_dir(key, cfg)
    cell_store = _CellStore(root, cfg)
    wanted = set(cells(cfg))
    staged: dict[Cell, dict[str, Any]] = {}
    forced: set[Cell] = set()
    mismatch: dict[tuple[str, str, str], int] = {}
    for p in map(Path, packs):
        manifest, members = cellpack.read_pack(p)
        if manifest.get("experiment") != NAME:
            raise ValueError(f"cell pack {p} holds cells of {manifest.get('experiment')!r}, not of {NAME}")
        for rel, rec in sorted(members.items()):
            m = _PACKED.match(rel)
            if m is None or m["dataset"] not in uci.DATASETS or m["method"] not in UCI_METHODS:
                raise ValueError(f"cell pack {p}: {rel!r} is not a UCI cell file <dataset>/<method id>-<hash>/"
                                 "split-<k>.json")
            cell = Cell(m["dataset"], int(m["split"]), m["method"])
            got = cellpack.measurement(rec)
            if (not all(f in rec for f in harness.CELL_FIELDS) or got is None or got.method != cell.method
                    or rec["dataset"] != cell.dataset or int(rec["split"]) != cell.split):
                raise ValueError(f"cell pack {p}: {rel} is not a complete record of {cell.label}")
            family = cell.method.partition("-")[0]
            if m["hash"] != cell_store._hash[family]:
                mismatch[(p.name, family, m["hash"])] = mismatch.get((p.name, family, m["hash"]), 0) + 1
                if not force:
                    continue
                forced.add(cell)
            else:
                forced.discard(cell)
            staged[cell] = rec
    if mismatch and not force:
        (name, family, h), _ = next(iter(mismatch.items()))
        raise ValueError(
            f"{sum(mismatch.values())} packed cell(s) were made with other settings or code than this "
            f"configuration, e.g. {name}: {family} cells of hash {h}, where this configuration and code give "
            f"{cell_store._hash[family]} (fold at the commit and with the --profile/--set they were made with, "
            "or --force to take them anyway); nothing was folded"
        )
    replaced = 0
    for cell in priority(list(staged)):
        replaced += cell_store.path(cell).is_file()
        cell_store.put(cell, staged[cell])
    return FoldReport(root, len(staged), replaced, sum(c not in wanted for c in staged), len(forced),
                      [str(p) for p in packs])


def cell_devices(records: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many cell records (stored cells or ``cells.csv`` rows) were made on each device (:func:`cell_device`;
    ``"not recorded"`` for cells made before records carried it), sorted by device."""
    counts: dict[str, int] = {}
    for rec in records:
        kind = cell_device(rec) or "not recorded"
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))
