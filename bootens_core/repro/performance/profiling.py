"""Where the time of the whole goes: compilation against computation, call after call.

The book's long computations are a UCI cell (one split of one method, with the grid search over the noise
variance) and the MCMC references. :func:`measure` runs each of them twice in one process -- the second call
on another split or another key, as the book does -- and records, per call, the wall time, the number of XLA
compilations and the seconds spent tracing, lowering and compiling (from ``jax.monitoring``'s compile events,
:class:`CompileCounter`). A second call that compiles nothing shows the compiled drivers are reused across
cells (no recompilation per cell); what remains is computation. It also measures, in one run, the ensemble
step with the line search's stored value checked once per ensemble (:func:`ensemble.step`) against ``vmap``
of the single-particle step (:func:`ensemble.particle_step`, which evaluates every particle's gradient at
every step).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import ensemble, models
from ...driver import CompileCounter
from .. import store
from ..experiments.uci.config import UCIConfig
from .config import ProfileConfig

__all__ = ["NAME", "Config", "CompileCounter", "timed_call", "line_search_step", "measure", "measure_groups",
           "measure_first_fit", "run", "load_ci_records"]

NAME = "profile"
Config = ProfileConfig

def timed_call(fn: Callable[[], Any]) -> dict[str, Any]:
    """Run ``fn()`` to completion; return ``{"wall_s", "compiles", "compile_s", "compute_s"}`` where
    ``compute_s`` is the wall time less the compile time."""
    with CompileCounter() as counter:
        start = time.perf_counter()
        jax.block_until_ready(fn())
        wall = time.perf_counter() - start
    return {"wall_s": wall, "compiles": counter.compiles, "compile_s": counter.seconds,
            "compute_s": max(wall - counter.seconds, 0.0)}


def line_search_step(key: jax.Array, cfg: ProfileConfig) -> dict[str, Any]:
    """Steps/s of the L-BFGS (zoom line search) ensemble on a UCI-shaped problem, two ways, in one run.

    ``ensemble``: the library's step (the stored value and gradient checked once for the whole ensemble);
    ``vmapped``: ``vmap`` of the single-particle step, whose per-particle ``lax.cond`` becomes a ``select``
    that evaluates every gradient at every step. Repeats alternate the two; the speed-up is the median of the
    paired ratios. (That both give the same particles is a unit test, in float64: here, in float32, the stored
    and the recomputed gradients differ by rounding, which L-BFGS amplifies over the steps.)
    """
    from .bench import SHAPES, setup, spread

    in_dim, n = SHAPES[cfg.line_search_dataset]
    n = min(n, cfg.line_search_rows) if cfg.line_search_rows else n
    p = setup(key, in_dim, n, cfg.line_search_layers, cfg.line_search_particles)
    model = p["model"]
    opt = ensemble.optimizer("lbfgs", 0.5, linesearch="zoom")
    state = ensemble.init(jax.random.fold_in(key, 1), model, jnp.zeros(n, jnp.float32), p["noise_var"],
                          cfg.line_search_particles, opt)
    x, nv = p["x"], p["noise_var"]
    pert = state.perturbation
    state = state._replace(perturbation=pert._replace(
        y=jax.random.normal(jax.random.fold_in(key, 2), pert.y.shape, pert.y.dtype)))
    one = jax.vmap(ensemble.particle_step(model, opt), in_axes=(0, 0, 0, None, None))

    def vmapped(s: ensemble.State) -> ensemble.State:
        params, opt_state, _ = one(s.params, s.opt_state, s.perturbation, x, nv)
        return s._replace(params=params, opt_state=opt_state, step=s.step + 1)

    def scan_of(step: Callable[[ensemble.State], ensemble.State]) -> Callable:
        @jax.jit
        def go(s):
            return jax.lax.scan(lambda c, _: (step(c), None), s, None, length=cfg.line_search_steps)[0]

        return go

    runs = {"ensemble": scan_of(lambda s: ensemble.step(s, model, opt, x, nv)[0]), "vmapped": scan_of(vmapped)}
    for go in runs.values():  # warm-up: compilation excluded from the timings
        jax.block_until_ready(go(state))
    secs: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(cfg.repeats):
        for name, go in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(go(state))
            secs[name].append(time.perf_counter() - start)
    rate = {name: [cfg.line_search_particles * cfg.line_search_steps / s for s in v] for name, v in secs.items()}
    ratios = [a / b for a, b in zip(rate["ensemble"], rate["vmapped"], strict=True)]
    return {
        "shape": {"dataset": cfg.line_search_dataset, "rows": n, "inputs": in_dim,
                  "hidden_layers": cfg.line_search_layers, "particles": cfg.line_search_particles,
                  "steps": cfg.line_search_steps},
        "particle_steps_per_s": {name: statistics.median(v) for name, v in rate.items()},
        "spread": {name: spread(v) for name, v in rate.items()},
        "speedup": statistics.median(ratios),
        "speedup_spread": spread(ratios),
    }


def _uci_calls(key: jax.Array, cfg: ProfileConfig) -> list[dict[str, Any]]:
    from ...data import uci as uci_data
    from ..experiments import uci
    from ..harness import Cell

    quick = UCIConfig.quick()
    ucfg = dataclasses.replace(quick, n_particles=cfg.uci_particles,
                               lbfgs=dataclasses.replace(quick.lbfgs, steps=cfg.uci_lbfgs_steps),
                               sghmc=dataclasses.replace(quick.sghmc, restarts=cfg.uci_sghmc_restarts,
                                                         draws=cfg.uci_sghmc_draws))
    out = []
    for method in cfg.uci_methods:
        for call, split in enumerate(cfg.uci_splits):
            cell = Cell(cfg.uci_dataset, split, method)
            uci_data.load(cfg.uci_dataset, split)  # reading the files is not the cell's computation
            row = timed_call(lambda cell=cell: uci.compute_cell(key, ucfg, cell))
            out.append({"stage": f"UCI cell {method}", "call": call + 1, "detail": f"{cfg.uci_dataset} split {split}",
                        **row})
    return out


def _mcmc_calls(key: jax.Array, cfg: ProfileConfig) -> list[dict[str, Any]]:
    from ...samplers import metropolis_model, nuts_model

    model = models.mlp(1, (cfg.mcmc_width,), "relu")
    k_data, k_run = jax.random.split(key)
    x = np.linspace(-2.0, 2.0, cfg.mcmc_points)
    y = np.sin(2.0 * x) + 0.3 * np.asarray(jax.random.normal(k_data, (cfg.mcmc_points,)), np.float64)
    out = []
    samplers = {
        "NUTS (NumPyro)": lambda k: nuts_model(k, model, x, y, noise_var=0.1, n_chains=cfg.mcmc_chains,
                                               n_warmup=cfg.mcmc_warmup, n_draws=cfg.mcmc_draws),
        "Metropolis-Hastings": lambda k: metropolis_model(k, model, x, y, noise_var=0.1, n_chains=cfg.mcmc_chains,
                                                          proposal_var=1e-3, n_draws=cfg.mcmc_draws,
                                                          burn_in=cfg.mh_burn_in, thin=cfg.mh_thin),
    }
    for name, sample in samplers.items():
        for call in range(2):
            row = timed_call(lambda k=jax.random.fold_in(k_run, call): sample(k).params)
            out.append({"stage": name, "call": call + 1, "detail": f"key {call}", **row})
    return out


def measure(key: jax.Array, cfg: ProfileConfig) -> dict[str, Any]:
    """Profile of the whole (see the module docstring): ``calls`` (one row per call: ``stage``, ``call``,
    ``detail``, ``wall_s``, ``compiles``, ``compile_s``, ``compute_s``), ``line_search`` and ``config``."""
    k_uci, k_mcmc, k_ls = jax.random.split(key, 3)
    calls = []
    if cfg.uci_methods:
        calls += _uci_calls(k_uci, cfg)
    calls += _mcmc_calls(k_mcmc, cfg)
    return {"calls": calls, "line_search": line_search_step(k_ls, cfg)}


def measure_groups(key: jax.Array, cfg: UCIConfig, dataset: str = "boston", hidden_layers: int = 1, split: int = 0,
                   repeats: int = 1, estimator: bool = True, progress: bool = False) -> dict[str, Any]:
    """Particles in groups against all at once, end to end (``bootens bench --case groups``): one UCI ensemble
    cell (``dataset``, ``split``, ``hidden_layers``; ``cfg``'s particles, L-BFGS and sigma^2 grid) and, with
    ``estimator``, the scikit-learn estimator's fit with its defaults on 80% of scikit-learn's diabetes data,
    each computed with the library's groups (``particle_batch="auto"``) and with every particle in one ``vmap``
    (:func:`bootens_core.ensemble.forced_particle_batch` of ``None``), in one process.

    The two ways alternate (grouped first on even repeats, all at once first on odd ones), so that a drift
    of the machine's load falls on both; every call compiles its own programs (a group size is a program of
    its own) and :func:`timed_call` separates compile from compute seconds. Rows: ``what``, ``way``
    (``"grouped"``, ``"all at once"``), ``repeat``, the seconds, and the call's test RMSE and MNLL (the same
    computation up to float rounding), and ``groups``: the ``[particles, group]`` pairs the library used
    (group ``None``: all at once). ``summary``: per ``what``, the median compute seconds of each way and
    their ratio (all at once over grouped: above 1 when the groups are faster)."""
    from sklearn.model_selection import train_test_split

    from ...data import uci as uci_data
    from ...estimators import BootstrapEnsembleRegressor
    from ..experiments import uci
    from ..harness import Cell
    from . import rivals

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if dataset not in uci_data.DATASETS:
        raise ValueError(f"dataset must be among {', '.join(uci_data.DATASETS)}, got {dataset!r}")
    if hidden_layers not in (1, 4):
        raise ValueError(f"hidden layers must be 1 or 4 (the paper's ensembles), got {hidden_layers}")
    start = time.perf_counter()
    cell = Cell(dataset, int(split), f"ensemble-{int(hidden_layers)}")
    uci_data.load(dataset, int(split))  # reading the files is not the cell's computation
    diabetes = rivals.make_problem("diabetes")
    x_tr, x_te, y_tr, y_te = train_test_split(diabetes.x, diabetes.y, test_size=0.2, random_state=0)

    def run_cell() -> dict[str, float]:
        rec = uci.compute_cell(key, cfg, cell)
        return {"rmse": float(rec["test_rmse"]), "mnll": float(rec["test_mnll"])}

    def fit_estimator() -> dict[str, float]:
        est = BootstrapEnsembleRegressor(random_state=0).fit(x_tr, y_tr)
        s = rivals.score_mixture(y_te, est.predict_particles(x_te), est.noise_var_)
        return {"rmse": s.rmse, "mnll": s.nll}

    layers = f"{int(hidden_layers)} hidden layer{'s' if int(hidden_layers) != 1 else ''}"
    jobs = [(f"UCI cell: {dataset.capitalize()}, {layers}, split {int(split)}", run_cell)]
    jobs += [("estimator fit: diabetes", fit_estimator)] if estimator else []
    ways = ("grouped", "all at once")  # the library's groups; every particle in one vmap
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs) * repeats * len(ways), desc="groups", unit="call")
    rows = []
    try:
        for what, fn in jobs:
            for r in range(repeats):
                for way in (ways if r % 2 == 0 else ways[::-1]):
                    scores: dict[str, float] = {}

                    def call(fn: Callable[[], dict[str, float]] = fn, scores: dict[str, float] = scores) -> None:
                        scores.update(fn())

                    with ensemble.recorded_particle_batches() as seen:
                        if way == "grouped":
                            row = timed_call(call)
                        else:
                            with ensemble.forced_particle_batch(None):
                                row = timed_call(call)
                    # the groups used: (particles trained at once, group; None = all), each once
                    used = sorted(set(seen), key=lambda kg: (kg[0], kg[1] or 0))
                    rows.append({"what": what, "way": way, "repeat": r, **row, **scores,
                                 "groups": [[k, g] for k, g in used]})
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    summary = []
    for what, _ in jobs:
        med = {way: statistics.median(x["compute_s"] for x in rows if x["what"] == what and x["way"] == way)
               for way in ways}
        summary.append({"what": what, "grouped_compute_s": med["grouped"], "all_compute_s": med["all at once"],
                        "speedup": med["all at once"] / med["grouped"] if med["grouped"] > 0 else float("nan")})
    caches = ensemble.cpu_caches() if jax.devices()[0].platform == "cpu" else {}
    return {"case": "groups", "rows": rows, "summary": summary, "caches": {str(k): v for k, v in caches.items()},
            "dataset": dataset, "hidden_layers": int(hidden_layers), "split": int(split), "repeats": int(repeats),
            "n_particles": cfg.n_particles, "provenance": store.provenance(time.perf_counter() - start),
            "wall_s": time.perf_counter() - start}


def measure_first_fit(settings: dict[str, Any] | None = None, timeout_s: float = 900.0) -> dict[str, Any]:
    """The estimator's time to a first answer (``bootens bench --case first-fit``), in a fresh process.

    A child Python process (JAX's persistent compilation cache off, so that nothing compiled before is
    reused) imports the estimator, fits ``BootstrapEnsembleRegressor(**settings)`` on 80% of scikit-learn's
    diabetes data, fits it again with another seed (the same shapes), fits it on 90% of those rows (a fold of
    a grid search, another shape) and predicts the held-out rows. Rows: ``what``, the wall seconds, the
    compilations and their seconds (tracing, lowering and compiling, :class:`CompileCounter`), the seconds
    XLA's backend compiled for (``backend_s``) and its largest programs (``programs``: name, seconds, from
    JAX's compile log). ``summary``: the first fit's and the later fits' seconds and how much of the first
    fit was compilation."""
    import json
    import subprocess
    import sys

    settings = dict(settings or {})
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    start = time.perf_counter()
    cmd = [sys.executable, "-c", "import sys; from bootens_core.repro.performance import profiling; "
           "profiling._first_fit_child(sys.argv[1])", json.dumps(settings)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ValueError(f"the first-fit process took longer than {timeout_s:g} s") from None
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise ValueError(f"the first-fit process failed ({tail[0]})")
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    by = {r["what"]: r for r in rows}
    first, later = by["first fit"], [by["second fit, same shapes"], by["fit on 90% of the rows"]]
    summary = {"first_fit_s": first["wall_s"], "first_fit_compile_s": first["compile_s"],
               "first_fit_backend_s": first["backend_s"], "second_fit_s": later[0]["wall_s"],
               "other_shape_fit_s": later[1]["wall_s"], "other_shape_compile_s": later[1]["compile_s"]}
    return {"case": "first-fit", "settings": settings, "rows": rows, "summary": summary,
            "provenance": store.provenance(time.perf_counter() - start), "wall_s": time.perf_counter() - start}


def _first_fit_child(settings_json: str) -> None:
    """The child process of :func:`measure_first_fit`: prints its rows as one JSON line."""
    import io
    import json
    import logging
    import re

    start = time.perf_counter()
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    from ...estimators import BootstrapEnsembleRegressor

    imported = time.perf_counter() - start
    settings = json.loads(settings_json)
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setLevel(logging.DEBUG)
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    jax.config.update("jax_log_compiles", True)
    x, y = load_diabetes(return_X_y=True)
    x_tr, x_te, y_tr, _ = train_test_split(x, y, test_size=0.2, random_state=0)
    n_fold = int(round(0.9 * len(y_tr)))
    rows = [{"what": "import", "wall_s": imported, "compiles": 0, "compile_s": 0.0, "backend_s": 0.0,
             "programs": []}]
    fitted: list[Any] = []

    def fit(seed: int, n: int) -> Any:
        fitted[:] = [BootstrapEnsembleRegressor(**{"random_state": seed, **settings}).fit(x_tr[:n], y_tr[:n])]
        return 0

    calls = (("first fit", lambda: fit(0, len(y_tr))), ("second fit, same shapes", lambda: fit(1, len(y_tr))),
             ("fit on 90% of the rows", lambda: fit(2, n_fold)), ("predict", lambda: fitted[0].predict(x_te)))
    for what, fn in calls:
        log.seek(0)
        log.truncate()
        row = timed_call(fn)
        found = [(m.group(1), float(m.group(2))) for m in
                 re.finditer(r"Finished XLA compilation of (.+?) in ([0-9.e+-]+) sec", log.getvalue())]
        programs: dict[str, float] = {}
        for name, sec in found:
            programs[name] = programs.get(name, 0.0) + sec
        top = sorted(programs.items(), key=lambda kv: -kv[1])[:5]
        rows.append({"what": what, **row, "backend_s": float(sum(sec for _, sec in found)),
                     "programs": [[name, sec] for name, sec in top]})
    print(json.dumps(rows))


def run(key: jax.Array, cfg: ProfileConfig, *, use_cache: bool = True, force: bool = False) -> store.Result:
    """:func:`measure`, cached in the result store (``summary`` holds the document)."""
    return store.cached(NAME, key, cfg, lambda: ({}, measure(key, cfg)), use_cache=use_cache, force=force)


def load_ci_records(directory: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Committed CI timing records ``<directory>/<label>.json`` by label (empty when there are none). Each
    holds ``stages`` (seconds per stage of ``make test``), ``total_s``, ``machine``, ``commit`` and ``date``; a
    record without ``stages`` or ``total_s`` is an error naming the file. ``.ci/run`` prints the numbers."""
    import json
    from pathlib import Path

    out = {}
    for path in sorted(Path(directory).glob("*.json")):
        rec = json.loads(path.read_text())
        if not isinstance(rec, dict) or "stages" not in rec or "total_s" not in rec:
            raise ValueError(f"{path} is not a CI timing record (no stages or total_s)")
        out[path.stem] = rec
    return out
