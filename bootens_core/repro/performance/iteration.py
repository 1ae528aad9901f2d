"""Where one L-BFGS iteration of a paper-scale UCI ensemble spends its time, and how far from the roofline it runs.

``bootens bench --case uci-dataset`` (:func:`measure_uci_dataset`) builds, for a UCI dataset and a network
depth, the ensemble a paper-scale cell trains -- the fit rows of split 0 after the validation share (real
data, standardised on those rows as the cell does), the dataset's inputs, ``n_particles`` particles per sigma^2,
the sigma^2 grid batched as :func:`bootens_core.repro.experiments.uci.grid_batch` batches it on this device
(the first batch of :func:`~bootens_core.repro.experiments.uci.grid_batches`; one sigma^2 on a CPU), the
L-BFGS of :func:`~bootens_core.repro.experiments.uci.ensemble_optimizer` (memory 10, the batched zoom line
search; ``direction``: its compact direction, the default, or optax's two-loop recursion) -- runs ``warmup`` iterations of it (the L-BFGS memory fills, the first searches settle), and from that
state times compiled programs that each do part of an iteration:

``eval``
    the loss and gradient of every particle's perturbed log joint (one evaluation of the ensemble);
``two_loop``
    the L-BFGS direction alone on the stored histories: the memory update and the product with the
    inverse-Hessian approximation -- optax's two-loop recursion, or the compact form
    (:mod:`bootens_core.ensemble.compact_lbfgs`), as the row's ``direction`` says;
``one_trial``
    the kernel's update while the stored value and gradient are finite (every iteration but the first) with a
    line search allowed one trial step: two-loop + one evaluation of every particle + the search's bookkeeping
    of one round + the parameter update;
``group_eval``
    one evaluation of a group of the ``ceil(K / 16)`` particles the line search steps together after its first
    trial (:func:`bootens_core.ensemble.batched_zoom_linesearch`);
``step``
    the real iteration (:func:`bootens_core.ensemble.step`), along the real trajectory.

Each runs ``steps`` times inside one jitted ``lax.scan``; the fixed-state programs take their parameters as
``theta + z * carry`` with ``z = 0`` a traced argument, so XLA cannot hoist them out of the loop. Seconds per
iteration are medians of ``repeats`` timed calls (taken in turns, so that all see the same machine) over
``steps``. The split of a real iteration (it sums to ``step`` by construction):

- ``model_eval_s`` = ``eval`` + the further evaluations, estimated as ``(E - 1) K / g`` group evaluations
  (``E``: the mean search steps, i.e. loss-and-gradient evaluations, per particle and iteration over the
  timed iterations; ``K`` particles; ``g`` the group size): a lower bound (groups may be part-empty, and a
  group may run both branches of a search step);
- ``two_loop_s`` = ``two_loop``;
- ``line_search_bookkeeping_s`` = the rest: ``(one_trial - eval - two_loop)`` (the first round's bookkeeping
  and the update) + ``(step - one_trial - further evaluations)`` (the further rounds' bookkeeping).

The measured differences themselves are in ``differences`` (``first_round_s = one_trial - eval - two_loop``,
``further_rounds_s = step - one_trial``).

**FLOPs and bytes** come from XLA's cost analysis of the compiled programs
(``jax.jit(f).lower(...).compile().cost_analysis()``), never from the whole step's program: XLA counts a
``while`` loop's body once whatever its trip count, takes the dearer branch of a ``cond``, and the step holds a
``cond`` that evaluates the gradients afresh only on the first iteration (its cost is in ``xla_step_raw``, for
the record). Per iteration: ``one_trial`` (its search loop runs exactly once, so XLA's count is that of one
round) + ``(E - 1) K / g`` x ``group_eval``. The bookkeeping of the further rounds is not counted (elementwise
selects, gathers and scatters: bytes more than FLOPs).

**Peaks.** On a GPU whose model is in :data:`VENDOR_PEAKS` the FP32 (non-tensor) FLOP/s and memory bandwidth of
the vendor's datasheet. On a CPU the bench's own: the best float32 matmul FLOP/s over several sizes
(:func:`bootens_core.repro.performance.bench.measure_matmul_peak`) and the bandwidth of every cache level and of
memory (``measure_cache_bandwidth``); a row's bandwidth roof is that of the smallest level holding the working
set of its one-trial iteration (XLA's memory analysis: arguments, outputs, temporaries; ``roof_level``,
``working_set``). The fractions: achieved FLOP/s over the FLOP peak, achieved bytes/s over that bandwidth, and
achieved FLOP/s over the roofline ``min(peak, bandwidth x AI)`` at the iteration's arithmetic intensity (XLA's
FLOPs over XLA's bytes). XLA's bytes count every operand of every operation, so where a fused program keeps
them in registers or a smaller cache than the working set's level, the bandwidth fraction can still pass 1:
the record then says that the iteration is not bound by the bandwidth of that level.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ... import ensemble, models, perturb
from ...ensemble.compact_lbfgs import CompactLBFGSState, compact_lbfgs, scale_by_compact_lbfgs
from ...ensemble.linesearch import batched_zoom_linesearch
from .. import store
from ..config import as_dict
from . import bench

__all__ = [
    "VENDOR_PEAKS",
    "ROW_KEYS",
    "PART_KEYS",
    "DIRECTIONS",
    "vendor_peak",
    "xla_cost",
    "Problem",
    "uci_problem",
    "part_programs",
    "split_iteration",
    "measure_uci_dataset",
]

#: FP32 (non-tensor-core) FLOP/s and memory bandwidth (bytes/s) from the vendors' datasheets, by a substring of
#: the device kind JAX reports (matched case-insensitively, first match wins).
VENDOR_PEAKS: dict[str, tuple[float, float]] = {
    "H100": (67e12, 3.35e12),  # NVIDIA H100 SXM5 80 GB: 67 TFLOP/s FP32, 3.35 TB/s HBM3
    "H200": (67e12, 4.8e12),  # NVIDIA H200 SXM 141 GB: 67 TFLOP/s FP32, 4.8 TB/s HBM3e
}

#: The keys every row of ``uci-dataset.json`` carries (rows carry more).
ROW_KEYS = ("dataset", "hidden_layers", "direction", "n_rows", "in_dim", "n_particles", "grid_values", "particles",
            "flops_per_iteration", "bytes_per_iteration", "seconds_per_iteration", "compile_s",
            "search_evals_per_particle", "flop_fraction", "bandwidth_fraction", "roofline_fraction", "parts",
            "split", "differences", "xla")

#: The parts of an iteration's time (:func:`split_iteration`), in seconds; they sum to the iteration.
PART_KEYS = ("model_eval_s", "two_loop_s", "line_search_bookkeeping_s")

#: The L-BFGS directions a row can time: the compact form (the ensembles' default) and optax's two-loop recursion.
DIRECTIONS = ("compact", "two-loop")


def vendor_peak(device_kind: str) -> tuple[float, float] | None:
    """``(FP32 FLOP/s, bytes/s)`` of :data:`VENDOR_PEAKS` for a device kind (e.g. ``"NVIDIA H100 80GB HBM3"``),
    or ``None`` when no entry matches."""
    kind = str(device_kind).upper()
    for name, peaks in VENDOR_PEAKS.items():
        if name in kind:
            return peaks
    return None


def xla_cost(fn: Callable[..., Any], *args: Any) -> dict[str, float]:
    """``{"flops", "bytes"}`` of ``jax.jit(fn)`` compiled for ``args``, as XLA's cost analysis counts them
    (a ``while`` body once, the dearer branch of a ``cond``)."""
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0))}


class Problem(NamedTuple):
    """One ensemble as a UCI cell trains it: ``model``, ``opt``, inputs ``x`` (fit rows), ``noise_var`` (a
    scalar, or one per particle when the grid is batched), the starting ``state``, and what it is: ``dataset``,
    ``hidden_layers``, ``grid_values`` (the sigma^2 trained together), ``n_particles`` (per value)."""

    model: models.Model
    opt: ensemble.Optimizer
    x: jax.Array
    noise_var: jax.Array
    state: ensemble.State
    dataset: str
    hidden_layers: int
    grid_values: tuple[float, ...]
    n_particles: int
    width: int
    direction: str = "compact"


def uci_problem(key: jax.Array, cfg: Any, dataset: str, hidden_layers: int, *, n_particles: int | None = None,
                max_rows: int = 0, grid_batch: int = 0, split: int = 0, direction: str = "compact") -> Problem:
    """The ensemble of a paper-scale UCI cell's validation fits (see the module text).

    ``cfg``: a :class:`~bootens_core.repro.experiments.uci.config.UCIConfig` (network, L-BFGS, grid, validation
    share, particles); ``n_particles`` overrides its particles; ``max_rows`` > 0 keeps the first that many fit
    rows; ``grid_batch``: sigma^2 values trained together, 0 = as the UCI cell would on this device;
    ``direction``: one of :data:`DIRECTIONS` (the L-BFGS direction; ``"two-loop"`` needs the zoom line search
    or none, the profiles' ``lbfgs.linesearch``).
    """
    import dataclasses

    from ...data import uci as uci_data
    from ..experiments import uci
    from ..harness import validation_rows

    if direction not in DIRECTIONS:
        raise ValueError(f"uci-dataset L-BFGS directions are {' and '.join(DIRECTIONS)}, got {direction!r}")
    if dataset not in uci_data.DATASETS:
        raise ValueError(f"uci-dataset datasets must be among {', '.join(uci_data.DATASETS)}, got {dataset!r}")
    if isinstance(hidden_layers, bool) or int(hidden_layers) not in (1, 4):
        raise ValueError(f"uci-dataset hidden layers must be 1 or 4 (the paper's ensembles), got {hidden_layers!r}")
    k = int(cfg.n_particles if n_particles is None else n_particles)
    if k < 1 or max_rows < 0 or grid_batch < 0:
        raise ValueError(f"need particles >= 1, max_rows >= 0 and grid_batch >= 0, got {k}, {max_rows}, {grid_batch}")
    h = int(hidden_layers)
    data = uci_data.load(dataset, split)
    n_train, in_dim = data.x_train.shape
    fit, _ = validation_rows(n_train, split, cfg.seed, cfg.val_fraction)
    if max_rows:
        fit = fit[:max_rows]
    x_orig = data.x_train[fit] * data.x_std + data.x_mean
    y_orig = data.y_train[fit] * data.y_std + data.y_mean
    xm, xs, ym, ys = uci_data.standardisation(x_orig, y_orig)
    dtype = jnp.dtype(cfg.network.dtype)
    x = jnp.asarray((x_orig - xm) / xs, dtype)
    y = jnp.asarray((y_orig - ym) / ys, dtype)
    c = dataclasses.replace(cfg, noise_grid_batch=int(grid_batch))
    size = uci.grid_batch(c, len(fit), in_dim, h, len(cfg.noise_grid))
    values = tuple(uci.grid_batches(cfg.noise_grid, size)[0][0])
    net = cfg.network
    model = models.mlp(in_dim, (net.width,) * h, "relu", weight_var=net.weight_var, bias_var=net.bias_var,
                       scale_by_fan_in=net.scale_by_fan_in)
    opt = uci.ensemble_optimizer(cfg)
    if direction != "compact":
        if cfg.lbfgs.linesearch not in (None, "zoom"):
            raise ValueError(f"the two-loop direction is optax's L-BFGS: lbfgs.linesearch None or 'zoom', got "
                             f"{cfg.lbfgs.linesearch!r}")
        opt = ensemble.optimizer("lbfgs", cfg.lbfgs.step_size, memory_size=cfg.lbfgs.memory,
                                 linesearch=cfg.lbfgs.linesearch, direction=direction)
    if len(values) == 1:
        noise_var = jnp.asarray(values[0], dtype)
        state = ensemble.init(key, model, y, noise_var, k, opt)
    else:  # as ensemble.train_grid: the same key for every value, the blocks side by side
        blocks = [ensemble.init(key, model, y, jnp.asarray(v, dtype), k, opt) for v in values]
        state = ensemble.State(*jax.tree.map(lambda *a: jnp.concatenate(a),
                                             *[(b.params, b.opt_state, b.perturbation) for b in blocks]),
                               blocks[0].step)
        noise_var = jnp.repeat(jnp.asarray(values, dtype), k)
    return Problem(model, opt, x, noise_var, state, dataset, h, values, k, int(net.width), direction)


_LBFGS_STATES = (optax.ScaleByLBFGSState, CompactLBFGSState)


def _lbfgs_state(opt_state: Any) -> Any:
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, _LBFGS_STATES))
             if isinstance(s, _LBFGS_STATES)]
    if len(found) != 1:
        raise ValueError("the optimizer state holds no single L-BFGS state: uci-dataset times the ensembles' "
                         "L-BFGS (optax's, or its compact form)")
    return found[0]


def _direction(state: Any, batched: bool) -> tuple[optax.GradientTransformation, Callable[..., Any], int]:
    """``(the direction's transformation, the L-BFGS with it, its memory)`` for an L-BFGS state (``batched``:
    with a particle axis first)."""
    lead = 1 if batched else 0
    if isinstance(state, CompactLBFGSState):
        memory = int(state.sy.shape[lead])
        return scale_by_compact_lbfgs(memory), compact_lbfgs, memory
    memory = int(state.weights_memory.shape[lead])
    return optax.scale_by_lbfgs(memory_size=memory), optax.lbfgs, memory


def _one_trial_optimizer(opt: ensemble.Optimizer) -> ensemble.Optimizer:
    """The UCI L-BFGS with its line search allowed a single trial step (the same state layout)."""
    _, alias, memory = _direction(_lbfgs_state(jax.eval_shape(opt.tx.init, {"w": jnp.zeros(1, jnp.float32)})),
                                  False)
    lbfgs = optax.inject_hyperparams(alias, static_args=("memory_size", "linesearch"))
    return ensemble.Optimizer(lbfgs(learning_rate=1.0, memory_size=memory,
                                    linesearch=batched_zoom_linesearch(1, "one")), True, "one trial step")


def part_programs(p: Problem) -> dict[str, Callable[..., Any]]:
    """The single-iteration programs of the module text, by name: ``eval``, ``two_loop``, ``one_trial`` and
    ``group_eval`` take ``(state, z)`` (parameters ``theta + z``-perturbed by the caller), ``step`` takes
    ``state``. Each returns a pytree shaped like the parameters first (what the next call's carry is made of)."""
    model, x, nv = p.model, p.x, p.noise_var
    per = nv.ndim == 1
    nv_axis = 0 if per else None
    K = jax.tree.leaves(p.state.params)[0].shape[0]
    g = max(1, math.ceil(K / 16))

    def loss_fn(params, pert, x, noise_var):
        return -perturb.perturbed_log_joint(model, params, x, pert, noise_var)

    vg = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(0, 0, None, nv_axis))
    lbfgs_tx = _direction(_lbfgs_state(p.state.opt_state), True)[0]
    one = _one_trial_optimizer(p.opt)

    def ev(s):
        value, grad = vg(s.params, s.perturbation, x, nv)
        return grad, value

    def group(s):
        take = lambda a: a[:g]  # noqa: E731
        value, grad = vg(jax.tree.map(take, s.params), jax.tree.map(take, s.perturbation), x,
                         nv[:g] if per else nv)
        return jax.tree.map(lambda full, part: full.at[:g].set(part), s.params, grad), value

    def two_loop(s):
        grad = optax.tree.get(s.opt_state, "grad")
        upd, _ = jax.vmap(lbfgs_tx.update)(grad, _lbfgs_state(s.opt_state), s.params)
        return upd, None

    def update_one(params, opt_state, pert, noise_var, value, grad):
        upd, opt_state = one.tx.update(grad, opt_state, params, value=value, grad=grad, value_fn=loss_fn,
                                       pert=pert, x=x, noise_var=noise_var)
        return optax.apply_updates(params, upd), opt_state

    def one_trial(s):
        value = optax.tree.get(s.opt_state, "value")
        grad = optax.tree.get(s.opt_state, "grad")
        params, opt_state = jax.vmap(update_one, in_axes=(0, 0, 0, nv_axis, 0, 0))(
            s.params, s.opt_state, s.perturbation, nv, value, grad)
        return params, opt_state

    def step(s):
        return ensemble.step(s, model, p.opt, x, nv, noise_per_particle=per)[0]

    return {"eval": ev, "two_loop": two_loop, "one_trial": one_trial, "group_eval": group, "step": step,
            "_group_size": g}


def _scanned(fn: Callable[[ensemble.State], Any], steps: int) -> Callable[[ensemble.State, jax.Array], Any]:
    """``steps`` calls of a fixed-state program in one ``lax.scan``: call ``i`` sees ``theta + z * out_{i-1}``."""

    def go(state, z):
        def body(carry, _):
            s = state._replace(params=jax.tree.map(lambda t, c: t + z * c, state.params, carry))
            out = fn(s)[0]
            return jax.tree.map(lambda t, o: o.astype(t.dtype), state.params, out), None

        return jax.lax.scan(body, jax.tree.map(jnp.zeros_like, state.params), None, length=steps)[0]

    return jax.jit(go)


def _scanned_steps(step: Callable[[ensemble.State], ensemble.State], steps: int):
    """``steps`` real iterations in one ``lax.scan``; also the search steps of every particle and iteration."""

    def go(state):
        def body(s, _):
            s = step(s)
            return s, optax.tree.get(s.opt_state, "info").num_linesearch_steps

        return jax.lax.scan(body, state, None, length=steps)

    return jax.jit(go)


def split_iteration(seconds: dict[str, float], evals_per_particle: float, particles: int, group: int,
                    ) -> tuple[dict[str, float], dict[str, float]]:
    """The parts of one iteration's time (``PART_KEYS``) and the measured differences, from the seconds per
    call of the programs ``eval``, ``two_loop``, ``one_trial``, ``group_eval`` and ``step`` (module text).

    ``evals_per_particle``: the mean search steps per particle and iteration (``E`` >= 1); ``particles``
    (``K``) and ``group`` (``g``): the ensemble and the line search's group size.
    """
    if evals_per_particle < 1 or particles < 1 or group < 1:
        raise ValueError(f"need evaluations per particle >= 1 and positive particles and group, got "
                         f"{evals_per_particle}, {particles}, {group}")
    t = seconds
    further = (evals_per_particle - 1.0) * particles / group * t["group_eval"]
    first_round = t["one_trial"] - t["eval"] - t["two_loop"]
    further_rounds = t["step"] - t["one_trial"]
    parts = {"model_eval_s": t["eval"] + further, "two_loop_s": t["two_loop"],
             "line_search_bookkeeping_s": first_round + further_rounds - further}
    diffs = {"first_round_s": first_round, "further_rounds_s": further_rounds, "further_evals_est_s": further}
    return parts, diffs


def _peaks(key: jax.Array, peak_repeats: int) -> dict[str, Any]:
    dev = jax.devices()[0]
    k_peak, k_bw = jax.random.split(key)
    cpu = dev.platform == "cpu"
    vendor = None if cpu else vendor_peak(getattr(dev, "device_kind", ""))
    if cpu:
        # The best of several matmul sizes (a large one over both cores waits for the busiest), and the bandwidth
        # of every cache level: a row's roof is the level its iteration's working set fits in.
        measured_peak = bench.measure_matmul_peak(k_peak, (128, 256, 512, 2048), peak_repeats)
        levels = bench.measure_cache_bandwidth(k_bw, peak_repeats)
        measured_bw = levels[-1]
    else:
        measured_peak = bench.measure_peak_flops(k_peak, 8192, peak_repeats)
        measured_bw = bench.measure_bandwidth(k_bw, 2048, peak_repeats)
        levels = None
    if vendor is not None:
        flops, bw, source = vendor[0], vendor[1], "vendor datasheet (FP32 non-tensor FLOP/s, memory bandwidth)"
    else:
        flops, bw = measured_peak["flops_per_s"], measured_bw["bytes_per_s"]
        source = ("measured: best float32 matmul FLOP/s over sizes, and a <- a*s + b bytes/s at each cache level "
                  "and in memory (bench.measure_matmul_peak, bench.measure_cache_bandwidth); a row's roof is the "
                  "level holding its iteration's working set")
    return {"flops_per_s": flops, "bytes_per_s": bw, "source": source, "levels": levels,
            "measured": {"matmul": measured_peak, "bandwidth": measured_bw}}


def _compiled(fn: Callable[..., Any], *args: Any) -> tuple[Any, float, dict[str, float]]:
    """``jax.jit(fn)`` compiled for ``args``: the executable, its compile seconds, XLA's cost of it."""
    t0 = time.perf_counter()
    exe = jax.jit(fn).lower(*args).compile()
    seconds = time.perf_counter() - t0
    cost = exe.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return exe, seconds, {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0))}


def _row(p: Problem, peak: dict[str, Any], steps: int, warmup: int, repeats: int) -> dict[str, Any]:
    progs = part_programs(p)
    g = int(progs.pop("_group_size"))
    K = int(jax.tree.leaves(p.state.params)[0].shape[0])
    dtype = jax.tree.leaves(p.state.params)[0].dtype
    state = p.state
    real, compile_s, real_cost = _compiled(_scanned_steps(progs["step"], steps), state)
    for _ in range(-(-warmup // steps)):  # the warm-up: whole calls of the timed program
        state = jax.block_until_ready(real(state)[0])
    z = jnp.zeros((), dtype)
    exes, costs = {}, {}
    for name in ("eval", "two_loop", "one_trial", "group_eval"):
        exes[name], _, costs[name] = _compiled(_scanned(progs[name], steps), state, z)
    mem = exes["one_trial"].memory_analysis()
    working_set = float(sum(int(getattr(mem, f, 0) or 0) for f in (
        "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"))) if mem is not None else 0.0
    level = bench.roof_level(working_set, peak["levels"]) if peak.get("levels") else None
    bandwidth = level["bytes_per_s"] if level is not None else peak["bytes_per_s"]
    # XLA counts a loop's body once, whatever its trip count: check that convention on the evaluation alone
    # (cheap to compile), so that the scanned programs' costs are one iteration's.
    single = xla_cost(lambda s: progs["eval"](s)[0], state)["flops"]
    per_call = 1.0 if costs["eval"]["flops"] < 1.5 * single else float(steps)
    costs = {name: {u: v / per_call for u, v in c.items()} for name, c in costs.items()}
    calls = {name: (lambda e=e: e(state, z)) for name, e in exes.items()}
    last: list[Any] = [None]

    def call_real():
        last[0] = real(state)
        return last[0]

    calls["step"] = call_real
    for c in calls.values():  # warm every program
        jax.block_until_ready(c())
    secs: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):  # in turns: every program sees the same machine
        for name, c in calls.items():
            t = time.perf_counter()
            jax.block_until_ready(c())
            secs[name].append((time.perf_counter() - t) / steps)
    med = {name: statistics.median(v) for name, v in secs.items()}
    counts = np.asarray(last[0][1], np.float64)
    evals = float(counts.mean())
    parts, diffs = split_iteration(med, evals, K, g)
    extra = (evals - 1.0) * K / g
    flops = costs["one_trial"]["flops"] + extra * costs["group_eval"]["flops"]
    nbytes = costs["one_trial"]["bytes"] + extra * costs["group_eval"]["bytes"]
    sec = med["step"]
    ai = flops / nbytes
    roof = bench.roofline(peak["flops_per_s"], bandwidth, ai)
    ws = bench.widths(int(p.x.shape[1]), p.hidden_layers, p.width)
    return {
        "dataset": p.dataset, "hidden_layers": p.hidden_layers, "direction": p.direction, "n_rows": int(p.x.shape[0]),
        "in_dim": int(p.x.shape[1]), "n_particles": p.n_particles, "grid_values": list(p.grid_values),
        "particles": K, "group_size": g, "dtype": str(dtype), "steps": steps, "warmup": warmup,
        "repeats": repeats,
        "flops_per_iteration": flops, "bytes_per_iteration": nbytes, "arithmetic_intensity": ai,
        "hand_matmul_flops_per_evaluation": K * bench.step_flops(ws, int(p.x.shape[0]))["total"],
        "seconds_per_iteration": sec, "seconds_spread": bench.spread(secs["step"]),
        "compile_s": compile_s, "search_evals_per_particle": evals,
        "search_evals_per_particle_max": float(counts.max()),
        "flops_per_s": flops / sec, "bytes_per_s": nbytes / sec,
        "flop_fraction": flops / sec / peak["flops_per_s"],
        "bandwidth_fraction": nbytes / sec / bandwidth, "working_set": working_set,
        "roof_level": level["level"] if level is not None else "memory", "roof_bytes_per_s": bandwidth,
        "roofline_flops_per_s": roof, "roofline_fraction": flops / sec / roof,
        "parts": {name: {"seconds_per_iteration": med[name], "spread": bench.spread(v)} for name, v in secs.items()},
        "split": parts, "differences": diffs,
        "xla": {**costs, "step_raw": {u: v / per_call for u, v in real_cost.items()}},
    }


def measure_uci_dataset(key: jax.Array, cfg: Any, datasets: Sequence[str], hidden_layers: Sequence[int], *,
                        n_particles: int | None = None, max_rows: int = 0, grid_batch: int = 0, steps: int = 10,
                        warmup: int = 20, repeats: int = 5, peak_repeats: int = 5,
                        directions: Sequence[str] = ("compact",),
                        on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """One L-BFGS iteration of paper-scale UCI ensembles, split and set against the roofline (``bootens bench
    --case uci-dataset``): the ``uci-dataset.json`` document (see the module text).

    One row per dataset x hidden layers (1 or 4) x L-BFGS direction (``directions``, of :data:`DIRECTIONS`:
    the same ensemble from the same key, so the rows of one dataset and depth compare the two): :data:`ROW_KEYS`, the seconds of every part program
    (``parts``), the split of an iteration (``split``: :data:`PART_KEYS`), the measured differences and XLA's
    costs. ``cfg``: the UCI configuration of the profile; ``n_particles`` overrides its particles per sigma^2,
    ``max_rows`` > 0 caps the fit rows, ``grid_batch`` the sigma^2 values trained together (0: as the UCI
    cell on this device). ``steps`` iterations per timed call, ``warmup`` iterations before, ``repeats`` timed
    calls. ``on_row`` receives the document so far (``complete`` false) after every row.
    """
    if steps < 1 or warmup < 0 or repeats < 1 or peak_repeats < 1:
        raise ValueError(f"need steps >= 1, warmup >= 0, repeats >= 1 and peak_repeats >= 1, got {steps}, {warmup}, "
                         f"{repeats}, {peak_repeats}")
    if not datasets or not hidden_layers or not directions:
        raise ValueError("uci-dataset needs at least one dataset, one depth and one L-BFGS direction")
    if any(d not in DIRECTIONS for d in directions):
        raise ValueError(f"uci-dataset L-BFGS directions are {' and '.join(DIRECTIONS)}, got {list(directions)}")
    from ...data import uci as uci_data

    bad = [d for d in datasets if d not in uci_data.DATASETS]
    if bad:
        raise ValueError(f"uci-dataset datasets must be among {', '.join(uci_data.DATASETS)}, got {bad}")
    if any(isinstance(h, bool) or int(h) not in (1, 4) for h in hidden_layers):
        raise ValueError(f"uci-dataset hidden layers must be 1 or 4 (the paper's ensembles), got {list(hidden_layers)}")
    start = time.perf_counter()
    load_before = os.getloadavg()
    k_peak, k_data = jax.random.split(key)
    peak = _peaks(k_peak, peak_repeats)
    rows: list[dict[str, Any]] = []

    def document(complete: bool) -> dict[str, Any]:
        prov = store.provenance(time.perf_counter() - start)
        return {
            "case": "uci-dataset", "complete": complete, "rows": list(rows),
            "device": bench.device_info(prov),
            "versions": {**prov["versions"], "python": prov["python"]}, "provenance": prov,
            "config": as_dict(cfg), "peak": peak,
            "settings": {"n_particles": n_particles, "max_rows": max_rows, "grid_batch": grid_batch, "steps": steps,
                         "warmup": warmup, "repeats": repeats, "directions": list(directions)},
            "method": ("seconds: median over repeats of one jitted lax.scan of `steps` iterations, per iteration, "
                       "after `warmup` real iterations; parts: programs doing part of an iteration, split by "
                       "differences (bootens_core.repro.performance.iteration); FLOPs and bytes: XLA cost "
                       "analysis of the one-trial-step iteration plus (E - 1) K / g group evaluations"),
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "wall_s": time.perf_counter() - start,
        }

    for i, ds in enumerate(datasets):
        for h in hidden_layers:
            kk = jax.random.fold_in(jax.random.fold_in(k_data, i), int(h))
            for direction in directions:
                p = uci_problem(kk, cfg, ds, int(h), n_particles=n_particles, max_rows=max_rows,
                                grid_batch=grid_batch, direction=direction)
                rows.append(_row(p, peak, steps, warmup, repeats))
                if on_row is not None:
                    on_row(document(False))
    return document(True)
