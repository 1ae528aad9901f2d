"""Particle throughput: how fast Algorithm 1 trains ensembles, beside loops and the device's roofline.

``bootens bench [--quick] --out DIR`` trains ensembles of the UCI networks (ReLU, ``hidden_layers`` x 50
units) on synthetic data with the input dimension and training size of Boston, Kin8nm and Protein, full
batch, by Adam on the perturbed log joint of Algorithm 1 -- the library's own compiled driver
(:mod:`bootens_core.ensemble`: ``vmap`` over particles inside one ``lax.scan`` over steps). For every particle
count ``k`` it measures, in one process and one run:

- **particle-steps per second** (``k * steps / seconds``) after a warm-up call (compilation excluded),
  median and spread (min, max, interquartile range) over ``repeats`` timed calls;
- **achieved FLOP/s**: particle-steps/s times the matmul FLOPs of one particle's training step
  (:func:`step_flops`; the elementwise work -- bias adds, ReLU, the loss, Adam -- is not counted);
- **speed-up against a JAX loop**: the same single-particle program (``k = 1``, compiled once) called for
  one particle after another. Its rate does not depend on ``k`` (it is the same program run ``k`` times), so
  it is timed on ``loop_particles`` particles and divided into every row;
- **speed-up against a PyTorch loop** (CPU build, when ``torch`` is installed): one ``nn.Sequential`` per
  particle trained by ``torch.optim.Adam`` on the same loss, one particle after another (``None`` without
  torch);
- **fraction of the roofline** of the same device for the same step: ``min(peak, B_level x AI)``, with
  ``peak`` the best measured FLOP/s of a large float32 matmul, ``AI`` XLA's FLOPs over XLA's bytes accessed of
  the compiled step (:func:`step_cost`) and ``B_level`` the best measured bytes/s of a float32 streaming
  kernel on arrays filling half of the memory level -- L1, L2, L3 cache (sizes from the operating system) or
  main memory -- that holds the buffers of one group's step (:func:`measure_cache_bandwidth`,
  :func:`roof_level`). The ensemble is timed as :func:`bootens_core.ensemble.train` runs it: particles in the
  groups it picks on this device (:func:`library_group`), recorded per row as ``particle_batch``.

The result is a JSON document (:func:`measure`); :func:`run` caches it in the result store for the book.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ... import ensemble, models
from .. import store
from ..config import as_dict, require_x64
from .config import BenchConfig

__all__ = [
    "NAME",
    "Config",
    "SHAPES",
    "widths",
    "step_flops",
    "step_bytes",
    "arithmetic_intensity",
    "roofline",
    "spread",
    "measure_peak_flops",
    "measure_bandwidth",
    "measure_matmul_peak",
    "measure_cache_bandwidth",
    "roof_level",
    "step_cost",
    "library_group",
    "setup",
    "vmapped_train",
    "jax_loop_train",
    "torch_loop_train",
    "measure",
    "device_info",
    "uci_cell_flops",
    "measure_uci_cell",
    "measure_particle_batches",
    "measure_linesearch",
    "run",
    "load_records",
    "ROW_KEYS",
]

NAME = "bench"
Config = BenchConfig

# (input dimension, training rows of one 90% split) of the UCI datasets the bench mimics: the loader's data
# (bootens_core.data.uci; shared/data/uci/README.md). The bench draws synthetic data of these shapes, so it
# never needs the data files.
SHAPES: dict[str, tuple[int, int]] = {"boston": (13, 455), "kin8nm": (8, 7373), "protein": (9, 41157)}

# The keys of every row of bench.json that other checks rely on (rows carry more).
ROW_KEYS = ("model", "dataset", "k", "particle_steps_per_s", "flops_per_s", "speedup_vs_jax_loop",
            "speedup_vs_torch_loop", "roofline_fraction")

_F32 = 4  # bytes per float32


def widths(in_dim: int, hidden_layers: int, width: int = 50) -> tuple[int, ...]:
    """Layer widths ``(in_dim, width, ..., width, 1)`` of a UCI network."""
    if in_dim < 1 or hidden_layers < 0 or width < 1:
        raise ValueError(f"need in_dim >= 1, hidden_layers >= 0, width >= 1; got {in_dim}, {hidden_layers}, {width}")
    return (int(in_dim), *(int(width),) * int(hidden_layers), 1)


def _layers(ws: Sequence[int]) -> list[tuple[int, int]]:
    if len(ws) < 2 or any(int(w) < 1 for w in ws):
        raise ValueError(f"layer widths must be at least two positive integers, got {list(ws)}")
    return list(zip(ws[:-1], ws[1:], strict=True))


def step_flops(ws: Sequence[int], n: int) -> dict[str, int]:
    """Matmul FLOPs of one particle's full-batch training step on ``n`` rows (a multiply-add = 2 FLOPs).

    Forward: ``X_l @ W_l`` per layer, ``2 n a b``. Backward: the weight gradient ``X_l^T @ dZ_l`` per layer
    (``2 n a b``) and the input gradient ``dZ_l @ W_l^T`` for every layer but the first (the inputs are data:
    no gradient is taken). Elementwise work (bias, activation, loss, optimizer) is not counted.
    """
    layers = _layers(ws)
    fwd = sum(2 * n * a * b for a, b in layers)
    bwd_w = fwd
    bwd_x = sum(2 * n * a * b for a, b in layers[1:])
    return {"forward": fwd, "backward": bwd_w + bwd_x, "total": fwd + bwd_w + bwd_x}


def step_bytes(ws: Sequence[int], n: int, itemsize: int = _F32) -> int:
    """Bytes the matmuls of one training step must move: for each ``(n x a) @ (a x b)`` product (forward,
    weight gradient, input gradient but the first layer's), its two operands read once and its result
    written once."""
    layers = _layers(ws)
    elems = 0
    for i, (a, b) in enumerate(layers):
        one = n * a + a * b + n * b  # the three matrices of any of the products of this layer
        elems += one * (2 if i == 0 else 3)
    return elems * itemsize


def arithmetic_intensity(ws: Sequence[int], n: int, itemsize: int = _F32) -> float:
    """Matmul FLOPs per byte of one training step (:func:`step_flops` / :func:`step_bytes`)."""
    return step_flops(ws, n)["total"] / step_bytes(ws, n, itemsize)


def roofline(peak_flops: float, bandwidth: float, intensity: float) -> float:
    """Attainable FLOP/s of a kernel of arithmetic ``intensity``: ``min(peak_flops, bandwidth * intensity)``."""
    if not (peak_flops > 0 and bandwidth > 0 and intensity > 0):
        raise ValueError(f"roofline needs positive peak, bandwidth and intensity, got {peak_flops}, {bandwidth}, "
                         f"{intensity}")
    return min(float(peak_flops), float(bandwidth) * float(intensity))


def spread(samples: Sequence[float]) -> dict[str, float]:
    """Median, min, max and interquartile range of repeated measurements."""
    xs = np.asarray(samples, float)
    if xs.size == 0:
        raise ValueError("no samples")
    q25, q75 = np.percentile(xs, [25, 75])
    return {"median": float(np.median(xs)), "min": float(xs.min()), "max": float(xs.max()),
            "q25": float(q25), "q75": float(q75)}


def _once(fn: Callable[[], Any]) -> float:
    """Seconds of one call of ``fn``, waiting for its result."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def _time(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
    """Seconds of a first (warm-up, compiling) call, then of ``repeats`` calls; every call waits for its result."""
    first = _once(fn)
    return first, [_once(fn) for _ in range(repeats)]


def measure_peak_flops(key: jax.Array, size: int, repeats: int) -> dict[str, Any]:
    """FLOP/s of a jitted float32 ``(size x size) @ (size x size)`` matmul: best and spread over ``repeats``."""
    ka, kb = jax.random.split(key)
    a = jax.random.normal(ka, (size, size), jnp.float32)
    b = jax.random.normal(kb, (size, size), jnp.float32)
    mm = jax.jit(jnp.matmul)
    _, secs = _time(lambda: mm(a, b), repeats)
    rates = [2.0 * size**3 / s for s in secs]
    return {"flops_per_s": max(rates), "spread": spread(rates), "size": size}


def measure_matmul_peak(key: jax.Array, sizes: Sequence[int], repeats: int) -> dict[str, Any]:
    """The best FLOP/s of float32 matmuls of several sizes: each ``(s x s) @ (s x s)``, repeated inside one
    call (a ``lax.fori_loop`` of ``u <- tanh(a @ u)``) until a call does about 2 GFLOP, so that small sizes,
    which XLA runs on one thread, are timed without a dispatch each. On a shared CPU a large matmul split over
    every core waits for the busiest one, while a step's small products do not: the peak is the best of all
    sizes (``flops_per_s``, with the ``spread`` and ``size`` of that size; ``sizes``: every size's entry)."""
    entries = []
    for s in sizes:
        s = int(s)
        reps = max(1, int(2e9 // (2.0 * s**3)))
        ka, ku = jax.random.split(jax.random.fold_in(key, s))
        a = jax.random.normal(ka, (s, s), jnp.float32) / jnp.sqrt(jnp.float32(s))
        u = jax.random.normal(ku, (s, s), jnp.float32)
        run = jax.jit(lambda a, u, reps=reps: jax.lax.fori_loop(0, reps, lambda i, v: jnp.tanh(a @ v), u))
        _, secs = _time(lambda run=run, a=a, u=u: run(a, u), repeats)
        rates = [2.0 * s**3 * reps / t for t in secs]
        entries.append({"size": s, "flops_per_s": max(rates), "spread": spread(rates)})
    best = max(entries, key=lambda e: e["flops_per_s"])
    return {**best, "sizes": entries}


def measure_bandwidth(key: jax.Array, mib: int, repeats: int) -> dict[str, Any]:
    """Bytes/s of a jitted float32 ``a + 0.5 * b`` over arrays of ``mib`` MiB (2 reads + 1 write per element).

    The arrays repeat a random block of at most 1 MiB: drawing every element (threefry) took longer than the
    measurement itself (two 256-MiB arrays: 5 s, 22 s where XLA compiles at optimisation level 0), and the
    sum reads and writes every byte whatever the values."""
    n = int(mib) * 2**20 // _F32
    ka, kb = jax.random.split(key)
    block = min(n, 2**20 // _F32)

    def filled(k: jax.Array) -> jax.Array:
        return jnp.tile(jax.random.normal(k, (block,), jnp.float32), -(-n // block))[:n]

    a, b = filled(ka), filled(kb)
    axpy = jax.jit(lambda u, v: u + jnp.float32(0.5) * v)
    _, secs = _time(lambda: axpy(a, b), repeats)
    rates = [3.0 * n * _F32 / s for s in secs]
    return {"bytes_per_s": max(rates), "spread": spread(rates), "mib": int(mib)}


def setup(key: jax.Array, in_dim: int, n: int, hidden_layers: int, k: int, *, width: int = 50,
          learning_rate: float = 1e-3, noise_var: float = 0.1) -> dict[str, Any]:
    """Synthetic float32 data of shape ``(n, in_dim)`` and ``k`` particles of Algorithm 1 ready to train.

    Returns a dict with ``model``, ``opt`` (Adam), ``state`` and ``pert`` (from :func:`ensemble.init`), ``x``,
    ``noise_var`` and ``widths``. Models and optimizers built anew are equal by their program keys, so every
    ``k`` reuses the library's cached driver (one compilation per shape).
    """
    if k < 1 or n < 1:
        raise ValueError(f"need k >= 1 and n >= 1, got k={k}, n={n}")
    k_x, k_y, k_init = jax.random.split(key, 3)
    x = jax.random.normal(k_x, (n, in_dim), jnp.float32)
    y = jax.random.normal(k_y, (n,), jnp.float32)
    model = models.mlp(in_dim, (width,) * hidden_layers, "relu")
    opt = ensemble.optimizer("adam", learning_rate)
    nv = jnp.asarray(noise_var, jnp.float32)
    state = ensemble.init(k_init, model, y, nv, k, opt)
    return {"model": model, "opt": opt, "state": state, "x": x, "noise_var": nv,
            "widths": widths(in_dim, hidden_layers, width)}


def _steps_fn(p: dict[str, Any], steps: int, particle_batch: int | None = None
              ) -> Callable[[ensemble.State], ensemble.State]:
    """``state -> state`` after ``steps`` steps of :func:`ensemble.step` (particles ``particle_batch`` at a
    time) in one jitted ``lax.scan`` (compiled once per problem shape)."""
    model, opt, x, nv = p["model"], p["opt"], p["x"], p["noise_var"]

    @jax.jit
    def go(state):
        return jax.lax.scan(lambda s, _: (ensemble.step(s, model, opt, x, nv, particle_batch=particle_batch)[0],
                                          None), state, None, length=steps)[0]

    return go


def library_group(p: dict[str, Any]) -> int | None:
    """The group size :func:`bootens_core.ensemble.train` steps :func:`setup`'s particles in by default on
    this device (:func:`bootens_core.ensemble.auto_particle_batch`; ``None``: all at once)."""
    return ensemble.auto_particle_batch(p["model"], p["opt"], p["state"], p["x"], p["noise_var"])


def step_cost(p: dict[str, Any], group: int | None) -> dict[str, float]:
    """XLA's cost analysis of one step of :func:`setup`'s problem as the library runs it: the compiled
    program of one group (``group`` particles; ``None``: all of them) at once. ``flops`` and ``bytes`` (XLA's
    "bytes accessed") per particle-step, and ``working_set``: the bytes of the program's buffers (arguments,
    outputs, temporaries; :meth:`jax.stages.Compiled.memory_analysis`) -- what one group's step touches."""
    k = int(jax.tree.leaves(p["state"].params)[0].shape[0])
    g = k if group is None else min(int(group), k)
    state = jax.tree.map(lambda a: a[:g] if np.ndim(a) else a, p["state"])
    model, opt, x, nv = p["model"], p["opt"], p["x"], p["noise_var"]
    compiled = jax.jit(lambda s: ensemble.step(s, model, opt, x, nv)[0]).lower(state).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    mem = compiled.memory_analysis()
    ws = sum(int(getattr(mem, f, 0) or 0) for f in ("argument_size_in_bytes", "output_size_in_bytes",
                                                   "temp_size_in_bytes")) if mem is not None else 0
    return {"flops": float(cost.get("flops", 0.0)) / g, "bytes": float(cost.get("bytes accessed", 0.0)) / g,
            "working_set": float(ws), "group": g}


def measure_cache_bandwidth(key: jax.Array, repeats: int, caches: dict[int, int] | None = None,
                            memory_mib: int = 256) -> list[dict[str, Any]]:
    """Bytes/s of a jitted float32 ``a <- a * s + b`` (2 reads + 1 write per element) with ``a`` and ``b``
    filling half of each cache level (``caches``: ``{level: bytes}``, default
    :func:`bootens_core.ensemble.cpu_caches`), repeated inside one call (a ``lax.fori_loop``) until a call
    moves about 256 MiB, and of :func:`measure_bandwidth` on ``memory_mib`` MiB arrays ("memory"). One entry
    per level, smallest first: ``level``, ``capacity`` (bytes; ``None`` for memory), ``footprint`` (bytes of
    ``a`` and ``b``), ``bytes_per_s`` (best of ``repeats``) and its ``spread``. The roofline of a step whose
    working set fits a level uses that level's entry (:func:`roof_level`)."""
    caches = ensemble.cpu_caches() if caches is None else caches
    out = []
    for level in sorted(caches):
        cap = int(caches[level])
        n = max(cap // 4 // _F32, 256)
        reps = max(1, (256 * 2**20) // (3 * n * _F32))
        ka, kb = jax.random.split(jax.random.fold_in(key, level))
        a = jax.random.normal(ka, (n,), jnp.float32)
        b = jax.random.normal(kb, (n,), jnp.float32)
        run = jax.jit(lambda a, b, reps=reps: jax.lax.fori_loop(0, reps, lambda i, u: u * jnp.float32(0.999) + b, a))
        _, secs = _time(lambda run=run, a=a, b=b: run(a, b), repeats)
        rates = [3.0 * n * _F32 * reps / t for t in secs]
        out.append({"level": f"L{level}", "capacity": cap, "footprint": 2 * n * _F32, "bytes_per_s": max(rates),
                    "spread": spread(rates)})
    mem = measure_bandwidth(key, memory_mib, repeats)
    out.append({"level": "memory", "capacity": None, "footprint": 2 * memory_mib * 2**20,
                "bytes_per_s": mem["bytes_per_s"], "spread": mem["spread"]})
    return out


def roof_level(working_set: float, levels: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The entry of :func:`measure_cache_bandwidth` for the smallest level whose capacity holds
    ``working_set`` bytes (the memory entry when none does)."""
    for lev in levels:
        if lev["capacity"] is not None and working_set <= lev["capacity"]:
            return lev
    return levels[-1]


def vmapped_train(p: dict[str, Any], steps: int) -> ensemble.State:
    """All particles of :func:`setup`'s problem trained together for ``steps`` steps."""
    return _steps_fn(p, steps)(p["state"])


def _particle(tree: Any, i: int) -> Any:
    return jax.tree.map(lambda a: a[i : i + 1] if np.ndim(a) else a, tree)


def _loop(p: dict[str, Any], steps: int, particles: int | None) -> Callable[[], list[ensemble.State]]:
    """A closure that trains the first ``particles`` particles one after another; the particles are sliced
    out beforehand, so a timing of the closure holds the trainings only."""
    k = jax.tree.leaves(p["state"].params)[0].shape[0]
    m = k if particles is None else min(int(particles), k)
    go = _steps_fn(p, steps)
    singles = jax.block_until_ready([_particle(p["state"], i) for i in range(m)])
    return lambda: [go(s) for s in singles]


def jax_loop_train(p: dict[str, Any], steps: int, particles: int | None = None) -> list[ensemble.State]:
    """The first ``particles`` (default all) particles trained one after another by the single-particle
    program (``k = 1``, compiled once); returns their final states (each with a particle axis of 1)."""
    return _loop(p, steps, particles)()


def _torch_problem(p: dict[str, Any], particles: int):
    import torch

    layers = p["widths"]
    x = torch.from_numpy(np.asarray(p["x"], np.float32))
    nets, anchors, ys = [], [], []
    params = jax.tree.map(np.asarray, p["state"].params)
    anchor = jax.tree.map(np.asarray, p["state"].perturbation.anchor)
    for i in range(particles):
        mods: list[Any] = []
        for j, (a, b) in enumerate(zip(layers[:-1], layers[1:], strict=True)):
            lin = torch.nn.Linear(a, b)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(params[j]["w"][i].T.copy()))
                lin.bias.copy_(torch.from_numpy(params[j]["b"][i].copy()))
            mods.append(lin)
            if j < len(layers) - 2:
                mods.append(torch.nn.ReLU())
        nets.append(torch.nn.Sequential(*mods))
        anchors.append([torch.from_numpy(np.ascontiguousarray(v[i].T if v.ndim == 3 else v[i]))
                        for lay in anchor for v in (lay["w"], lay["b"])])
        ys.append(torch.from_numpy(np.asarray(p["state"].perturbation.y[i], np.float32)))
    return x, nets, anchors, ys


def torch_loop_train(p: dict[str, Any], steps: int, particles: int | None = None,
                     *, timed: list[float] | None = None) -> list[list[np.ndarray]]:
    """The same particles trained by PyTorch (CPU), one ``nn.Sequential`` and ``torch.optim.Adam`` each, one
    particle after another, on the same loss ``-log p~`` (up to constants). Returns every particle's final
    ``[w_1, b_1, w_2, ...]`` (weights as ``(in, out)``, as in :mod:`bootens_core.models`). ``timed`` receives
    the seconds of the training loop (set-up excluded). Needs ``torch``."""
    import torch

    k = jax.tree.leaves(p["state"].params)[0].shape[0]
    m = k if particles is None else min(int(particles), k)
    lr = float(p["opt"].description.split("lr=")[1])
    nv = float(p["noise_var"])
    # Prior variance per parameter tensor, in the order of nn.Sequential.parameters() (weight, bias, ...).
    pvar = [float(v) for lay in p["model"].prior_var for v in (lay["w"], lay["b"])]
    x, nets, anchors, ys = _torch_problem(p, m)
    start = time.perf_counter()
    for net, anc, y in zip(nets, anchors, ys, strict=True):
        opt = torch.optim.Adam(net.parameters(), lr=lr, eps=1e-8)
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            f = net(x)[:, 0]
            loss = 0.5 * torch.sum((y - f) ** 2) / nv
            for w, a, v in zip(net.parameters(), anc, pvar, strict=True):
                loss = loss + 0.5 * torch.sum((w - a) ** 2) / v
            loss.backward()
            opt.step()
    if timed is not None:
        timed.append(time.perf_counter() - start)
    out = []
    for net in nets:
        vals = [t.detach().numpy().copy() for t in net.parameters()]
        out.append([v.T if v.ndim == 2 else v for v in vals])
    return out


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or None


def _device_memory() -> int | None:
    dev = jax.devices()[0]
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # noqa: BLE001  (CPU backends may not implement it)
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _working_set(ws: Sequence[int], n: int, k: int) -> int:
    """Rough bytes of a k-particle step: activations and their gradients kept for the backward pass (x3),
    parameters with Adam's two moments and the gradient (x4), the perturbed labels."""
    act = sum(ws[1:]) * n * 3
    par = sum(a * b + b for a, b in _layers(ws)) * 4
    return k * (act + par + n) * _F32


def _check(cfg: BenchConfig) -> None:
    unknown = [d for d in cfg.datasets if d not in SHAPES]
    if unknown:
        raise ValueError(f"unknown bench dataset(s) {unknown}: choose from {', '.join(SHAPES)}")
    if not cfg.ks or any(int(k) < 1 for k in cfg.ks):
        raise ValueError(f"particle counts must be positive integers, got {list(cfg.ks)}")
    if not cfg.hidden_layers or any(int(h) < 1 for h in cfg.hidden_layers):
        raise ValueError(f"hidden_layers must be positive integers, got {list(cfg.hidden_layers)}")
    if cfg.steps < 1 or cfg.repeats < 1 or cfg.loop_particles < 1:
        raise ValueError(f"steps, repeats and loop_particles must be >= 1, got {cfg.steps}, {cfg.repeats}, "
                         f"{cfg.loop_particles}")
    if cfg.max_rows < 0:
        raise ValueError(f"max_rows must be >= 0 (0 = the dataset's size), got {cfg.max_rows}")


def measure(key: jax.Array, cfg: BenchConfig, *, progress: bool = False,
            on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the benchmark of ``cfg`` and return the ``bench.json`` document.

    Keys: ``device`` and ``versions`` (with ``torch``: its version or ``None``), ``provenance``, ``config``,
    ``peak`` (measured matmul FLOP/s and bandwidth), ``rows`` (one per model x dataset x k, with
    :data:`ROW_KEYS` and the spread of every timing), ``skipped`` (rows whose working set would exceed
    ``max_memory_fraction`` of the device memory), ``load_average`` before and after, ``wall_s``, and
    ``complete`` (whether every row of ``cfg`` was measured). ``on_row`` receives the document so far (with
    ``complete`` false) after every measured or skipped row, so that a run cut off keeps what it measured.
    """
    _check(cfg)
    start = time.perf_counter()
    load_before = os.getloadavg()
    k_peak, k_bw, k_data = jax.random.split(key, 3)
    platform = jax.devices()[0].platform
    size = cfg.peak_size or (2048 if platform == "cpu" else 8192)
    mib = cfg.bandwidth_mib or (256 if platform == "cpu" else 2048)
    peak = measure_matmul_peak(k_peak, (128, 256, 512, size), cfg.peak_repeats)
    levels = measure_cache_bandwidth(k_bw, cfg.peak_repeats, None if platform == "cpu" else {}, mib)
    bw = {"bytes_per_s": levels[-1]["bytes_per_s"], "spread": levels[-1]["spread"], "mib": mib}
    use_torch = bool(cfg.torch) and _torch_version() is not None
    if use_torch:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    mem = _device_memory()
    budget = None if mem is None else cfg.max_memory_fraction * mem
    mesh = ensemble.particle_mesh() if cfg.shard else None

    jobs = [(h, d) for h in cfg.hidden_layers for d in cfg.datasets]
    total = len(jobs) * len(cfg.ks)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []

    def document(complete: bool) -> dict[str, Any]:
        prov = store.provenance(time.perf_counter() - start)
        versions = {**prov["versions"], "torch": _torch_version(), "python": prov["python"]}
        return {
            "device": _device_info(prov, mem),
            "versions": versions,
            "provenance": prov,
            "config": as_dict(cfg),
            "optimizer": "Adam (optax.adam), full batch, float32; matmul FLOPs only "
                         "(see bootens_core.repro.performance.bench)",
            "peak": {"matmul_flops_per_s": peak["flops_per_s"], "matmul": peak,
                     "bandwidth_bytes_per_s": bw["bytes_per_s"], "bandwidth": bw, "levels": levels},
            "roofline_note": "roof = min(matmul peak, bandwidth of the level holding the working set of one "
                             "group's step x XLA's FLOPs / XLA's bytes accessed); fraction = achieved XLA "
                             "FLOP/s over the roof",
            "rows": list(rows),
            "skipped": list(skipped),
            "complete": complete,
            "torch_available": use_torch,
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "wall_s": time.perf_counter() - start,
        }

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="bench", unit="row")
    try:
        for h, ds in jobs:
            in_dim, n_full = SHAPES[ds]
            n = min(n_full, cfg.max_rows) if cfg.max_rows else n_full
            ws = widths(in_dim, h, cfg.width)
            flops = step_flops(ws, n)["total"]
            ai = arithmetic_intensity(ws, n)
            roof = roofline(peak["flops_per_s"], bw["bytes_per_s"], ai)
            model_name = f"mlp-{h}x{cfg.width}"
            key_job = jax.random.fold_in(jax.random.fold_in(k_data, h), list(SHAPES).index(ds))
            # Baselines: the single-particle program, one particle after another (rate independent of k).
            m = cfg.loop_particles
            base = setup(key_job, in_dim, n, h, m, width=cfg.width, learning_rate=cfg.learning_rate,
                         noise_var=cfg.noise_var)
            if bar is not None:
                bar.set_postfix_str(f"{model_name} {ds} loops")
            loop_fn = _loop(base, cfg.steps, m)
            loop_first, _ = _time(loop_fn, 0)  # warm-up (compiles the single-particle program)
            torch_rates = None
            if use_torch:
                secs: list[float] = []
                for _ in range(cfg.repeats + 1):
                    torch_loop_train(base, cfg.steps, timed=secs)
                torch_rates = [m * cfg.steps / s for s in secs[1:]]
            for k in cfg.ks:
                k = int(k)
                if bar is not None:
                    bar.set_postfix_str(f"{model_name} {ds} k={k}")
                need = _working_set(ws, n, k)
                if budget is not None and need > budget:
                    skipped.append({"model": model_name, "dataset": ds, "k": k, "n": n,
                                    "reason": f"working set ~{need / 2**30:.1f} GiB > {budget / 2**30:.1f} GiB "
                                              f"({cfg.max_memory_fraction:.0%} of the device memory)"})
                    if bar is not None:
                        bar.update(1)
                    if on_row is not None:
                        on_row(document(False))
                    continue
                p = setup(key_job, in_dim, n, h, k, width=cfg.width, learning_rate=cfg.learning_rate,
                          noise_var=cfg.noise_var)
                group = library_group(p) if mesh is None else None
                cost = step_cost(p, group)
                if mesh is not None:
                    p = _shard_problem(p, mesh)
                go = _steps_fn(p, cfg.steps, group)
                first, _ = _time(lambda g=go, q=p: g(q["state"]), 0)
                # Repeats alternate the ensemble and the JAX loop, so that both see the same machine (a shared
                # machine's load drifts): the speed-up is the median of the paired ratios.
                secs_k, loop_secs = [], []
                for _ in range(cfg.repeats):
                    secs_k.append(_once(lambda g=go, q=p: g(q["state"])))
                    loop_secs.append(_once(loop_fn))
                rates = [k * cfg.steps / s for s in secs_k]
                loop_rates = [m * cfg.steps / s for s in loop_secs]
                paired = [r / lr for r, lr in zip(rates, loop_rates, strict=True)]
                med = statistics.median(rates)
                lev = roof_level(cost["working_set"], levels)
                xroof = roofline(peak["flops_per_s"], lev["bytes_per_s"], cost["flops"] / cost["bytes"])
                loop_med = statistics.median(loop_rates)
                torch_med = statistics.median(torch_rates) if torch_rates else None
                rows.append({
                    "model": model_name, "dataset": ds, "k": k, "n": n, "in_dim": in_dim, "hidden_layers": h,
                    "width": cfg.width, "n_params": models.n_params(p["model"]), "steps": cfg.steps,
                    "repeats": cfg.repeats,
                    "particle_steps_per_s": med, "particle_steps_per_s_spread": spread(rates),
                    "flops_per_particle_step": flops, "flops_per_s": med * flops,
                    "flops_per_s_spread": spread([r * flops for r in rates]),
                    "seconds_per_call": spread(secs_k), "first_call_s": first,
                    "jax_loop_particle_steps_per_s": loop_med,
                    "jax_loop_spread": spread(loop_rates), "jax_loop_particles": m,
                    "jax_loop_first_call_s": loop_first,
                    "speedup_vs_jax_loop": statistics.median(paired),
                    "speedup_vs_jax_loop_spread": spread(paired),
                    # The most any speed-up over the JAX loop could be on this device: the measured matmul peak
                    # over the loop's own (matmul) FLOP/s.
                    "speedup_ceiling_vs_jax_loop": peak["flops_per_s"] / (loop_med * flops),
                    "torch_loop_particle_steps_per_s": torch_med,
                    "torch_loop_spread": spread(torch_rates) if torch_rates else None,
                    "speedup_vs_torch_loop": med / torch_med if torch_med else None,
                    "matmul_arithmetic_intensity": ai, "matmul_roofline_flops_per_s": roof,
                    "particle_batch": group, "xla_flops_per_particle_step": cost["flops"],
                    "xla_bytes_per_particle_step": cost["bytes"], "working_set_bytes": cost["working_set"],
                    "arithmetic_intensity": cost["flops"] / cost["bytes"],
                    "roofline_level": lev["level"], "roofline_bandwidth_bytes_per_s": lev["bytes_per_s"],
                    "roofline_flops_per_s": xroof,
                    "roofline_bound": "compute" if xroof >= peak["flops_per_s"] else "memory",
                    "roofline_fraction": med * cost["flops"] / xroof,
                    "sharded_devices": None if mesh is None else int(mesh.devices.size),
                })
                if bar is not None:
                    bar.update(1)
                if on_row is not None:
                    on_row(document(False))
    finally:
        if bar is not None:
            bar.close()
    return document(True)


def device_info(prov: dict[str, Any]) -> dict[str, Any]:
    """The ``device`` entry of a benchmark document for a :func:`~bootens_core.repro.store.provenance`: its
    device, name, cores, CPU model and memory."""
    return _device_info(prov, _device_memory())


def _device_info(prov: dict[str, Any], memory: int | None) -> dict[str, Any]:
    """The ``device`` entry of a benchmark document: the provenance's device, its name, cores, CPU model, memory."""
    return {**prov["device"], "name": str(jax.devices()[0]), "cpu_count": os.cpu_count(), "cpu_model": _cpu_model(),
            "memory_bytes": memory}


def uci_cell_flops(in_dim: int, n_fit: int, n_train: int, hidden_layers: int, width: int, n_particles: int,
                   iterations: int, grid_size: int) -> int:
    """Matmul FLOPs of one ensemble cell of the UCI benchmark at one gradient evaluation per iteration: the
    ``grid_size`` validation fits on ``n_fit`` rows and the final fit on ``n_train`` rows, ``iterations`` each,
    ``n_particles`` particles (:func:`step_flops`). A line search evaluates more than once on some
    iterations: for it this is a lower bound."""
    ws = widths(in_dim, hidden_layers, width)
    one = grid_size * step_flops(ws, n_fit)["total"] + step_flops(ws, n_train)["total"]
    return int(n_particles) * int(iterations) * int(one)


def measure_uci_cell(key: jax.Array, cfg: Any, datasets: Sequence[str], hidden_layers: Sequence[int],
                     grid_batches: Sequence[int] = (1, 0), split: int = 0, peak_repeats: int = 5,
                     progress: bool = False) -> dict[str, Any]:
    """Time real ensemble cells of the UCI benchmark (``bootens bench --case uci-cell``): ``bench.json``'s
    ``uci-cell`` document.

    For every dataset x hidden layers x grid batch (``UCIConfig.noise_grid_batch``: 1 = the sigma^2 grid one
    value at a time, 0 = automatic, n = n values per batch) the cell (split ``split``: sigma^2 selection on
    the validation rows, final fit, test scores) runs twice in this process: ``cold_s`` (compilation
    included) and ``warm_s``; ``compile_s`` = their difference. ``flops`` is :func:`uci_cell_flops`, so
    ``flops_per_s`` and ``roofline_fraction`` (against the measured matmul peak and bandwidth of the device
    and the arithmetic intensity of the validation fits) are lower bounds for a line-search L-BFGS.
    ``grid_batch_used`` is the length of the batches the grid was cut into and ``grid_padding`` the number of
    repeated values that made them one length (:func:`bootens_core.repro.experiments.uci.grid_batches`; their
    work is not counted in ``flops``). ``cfg`` is a :class:`~bootens_core.repro.experiments.uci.config.UCIConfig` (its
    ``n_particles``, L-BFGS and grid are used).
    """
    import dataclasses

    from .. import harness
    from ...data import uci as uci_data
    from ..experiments import uci

    start = time.perf_counter()
    bad = [d for d in datasets if d not in uci_data.DATASETS]
    if bad or not datasets:
        raise ValueError(f"uci-cell datasets must be among {', '.join(uci_data.DATASETS)}, got {list(datasets)}")
    if not hidden_layers or any(int(h) not in (1, 4) for h in hidden_layers):
        raise ValueError(f"uci-cell hidden layers must be 1 or 4 (the paper's ensembles), got {list(hidden_layers)}")
    if not grid_batches or any(isinstance(b, bool) or int(b) < 0 for b in grid_batches):
        raise ValueError(f"grid batches must be non-negative integers (0 = automatic), got {list(grid_batches)}")
    k_peak, k_bw, k_cell = jax.random.split(key, 3)
    platform = jax.devices()[0].platform
    peak = measure_peak_flops(k_peak, 2048 if platform == "cpu" else 8192, peak_repeats)
    bw = measure_bandwidth(k_bw, 256 if platform == "cpu" else 2048, peak_repeats)
    opt = uci.ensemble_optimizer(cfg)
    iterations = cfg.lbfgs.steps * cfg.lbfgs.iters_per_step
    jobs = [(d, int(h), int(b)) for d in datasets for h in hidden_layers for b in grid_batches]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc="uci-cell", unit="row")
    rows = []
    try:
        for ds, h, b in jobs:
            data = uci_data.load(ds, split)
            c = dataclasses.replace(cfg, noise_grid_batch=b)
            n_train, in_dim = data.x_train.shape
            n_fit = n_train - int(round(cfg.val_fraction * n_train))
            # the batches the cell trains: one length, the last padded (uci.grid_batches)
            batches = uci.grid_batches(cfg.noise_grid, uci.grid_batch(c, n_fit, in_dim, h, len(cfg.noise_grid)))
            size, padding = len(batches[0][0]), sum(len(v) - n for v, n in batches)
            m = uci.method(f"ensemble-{h}", c, ds, in_dim, data.y_std)
            times, rec = [], None
            for _ in range(2):
                t0 = time.perf_counter()
                rec = harness.run_cell(k_cell, m, data, noise_grid=cfg.noise_grid, val_seed=cfg.seed,
                                       val_fraction=cfg.val_fraction)
                times.append(time.perf_counter() - t0)
            flops = uci_cell_flops(in_dim, n_fit, n_train, h, cfg.network.width, cfg.n_particles, iterations,
                                   len(cfg.noise_grid))
            ws = widths(in_dim, h, cfg.network.width)
            roof = roofline(peak["flops_per_s"], bw["bytes_per_s"], arithmetic_intensity(ws, n_fit))
            rows.append({
                "dataset": ds, "hidden_layers": h, "split": split, "grid_batch": b, "grid_batch_used": size,
                "grid_padding": padding,
                "n_particles": cfg.n_particles, "iterations": iterations, "grid_size": len(cfg.noise_grid),
                "cold_s": times[0], "warm_s": times[1], "compile_s": max(0.0, times[0] - times[1]),
                "flops": flops, "flops_per_s": flops / times[1], "roofline_flops_per_s": roof,
                "roofline_fraction": flops / times[1] / roof, "test_rmse": rec["test_rmse"],
                "test_mnll": rec["test_mnll"], "noise_var": rec["noise_var"],
                "diverged_particles": rec["diverged_particles"],
            })
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    prov = store.provenance(time.perf_counter() - start)
    return {
        "case": "uci-cell",
        "device": _device_info(prov, _device_memory()),
        "versions": {**prov["versions"], "python": prov["python"]},
        "provenance": prov,
        "config": as_dict(cfg),
        "optimizer": opt.description,
        "flops_note": "matmul FLOPs at one gradient evaluation per iteration (a lower bound with a line search)",
        "peak": {"matmul_flops_per_s": peak["flops_per_s"], "bandwidth_bytes_per_s": bw["bytes_per_s"]},
        "rows": rows,
        "wall_s": time.perf_counter() - start,
    }


def measure_particle_batches(
    key: jax.Array, datasets: Sequence[str], hidden_layers: Sequence[int], k: int, batches: Sequence[int],
    steps: int = 20, repeats: int = 5, max_rows: int = 0, features: int = 0,
) -> dict[str, Any]:
    """Particles stepped in groups against all at once (``bootens bench --case particle-batch``): the
    ``particle-batch.json`` document.

    For every dataset shape (:data:`SHAPES`, synthetic float64 data, ``max_rows`` > 0 caps the rows) x hidden
    layers x optimizer (Adam, and optax's L-BFGS with the zoom line search of the UCI profiles) the same
    ``k`` particles take ``steps`` steps of :func:`bootens_core.ensemble.step` in one jitted ``lax.scan``, with
    ``particle_batch`` None (one ``vmap`` over all ``k``) and each of ``batches``; ``seconds`` is the spread
    of ``repeats`` timed calls after a compiling one, ``speedup`` the all-at-once median over this one, in
    the same process, and ``max_abs_diff`` the largest difference of the final particles from the
    all-at-once ones (the same computation up to float rounding). ``features`` > 0 adds the linear chapter's
    model: linear in that many trigonometric features of 64 one-dimensional points (``dataset`` "trig",
    ``hidden_layers`` 0). Every row names its ``network``.
    """
    if features < 0:
        raise ValueError(f"features must be >= 0 (0: no linear model), got {features}")
    if k < 1 or steps < 1 or repeats < 1 or any(int(b) < 1 for b in batches):
        raise ValueError(f"need k, steps, repeats and every batch >= 1, got k={k}, steps={steps}, "
                         f"repeats={repeats}, batches={list(batches)}")
    unknown = [d for d in datasets if d not in SHAPES]
    if unknown:
        raise ValueError(f"unknown dataset shape(s) {unknown}; known: {', '.join(SHAPES)}")
    require_x64("particle-batch bench")
    start = time.perf_counter()
    opts = {"adam": ensemble.optimizer("adam", 1e-3),
            "lbfgs-zoom": ensemble.optimizer("lbfgs", 0.5, memory_size=10, linesearch="zoom")}
    problems = []  # (dataset, hidden layers, network, model, x, y, init key)
    for ds in datasets:
        in_dim, n = SHAPES[ds]
        n = min(n, max_rows) if max_rows else n
        k_x, k_y, k_init = jax.random.split(jax.random.fold_in(key, len(problems)), 3)
        x = jax.random.normal(k_x, (n, in_dim), jnp.float64)
        y = jax.random.normal(k_y, (n,), jnp.float64)
        for layers in hidden_layers:
            network = f"{int(layers)} hidden layer{'s' if int(layers) != 1 else ''}"
            problems.append((ds, int(layers), network, models.mlp(in_dim, (50,) * int(layers), "relu"), x, y,
                             k_init))
    if features:
        k_w, k_x, k_y, k_init = jax.random.split(jax.random.fold_in(key, len(problems)), 4)
        omega = 1.6 * jax.random.normal(k_w, (int(features),), jnp.float64)
        x = jax.random.uniform(k_x, (64,), jnp.float64, -2.0, 2.0)
        y = jax.random.normal(k_y, (64,), jnp.float64)
        problems.append(("trig", 0, f"linear, {int(features)} trigonometric features",
                         models.trig_features(omega), x, y, k_init))
    rows = []
    for ds, layers, network, model, x, y, k_init in problems:
        n = int(x.shape[0])
        for name, opt in opts.items():
            state = ensemble.init(k_init, model, y, 0.1, int(k), opt)
            results: dict[int | None, tuple[dict[str, float], Any]] = {}
            for b in (None, *map(int, batches)):
                def go(state, b=b):
                    return jax.lax.scan(lambda s, _: (ensemble.step(s, model, opt, x, 0.1, particle_batch=b)[0],
                                                      None), state, None, length=steps)[0]
                fn, last = jax.jit(go), [None]

                def call(fn=fn, last=last):  # keeps the final particles of the last timed call
                    last[0] = fn(state)
                    return last[0]

                _, times = _time(call, repeats)
                results[b] = (spread(times), last[0].params)
            base = results[None][0]["median"]
            for b, (sec, params) in results.items():
                diff = max(float(jnp.max(jnp.abs(u - v))) for u, v in
                           zip(jax.tree.leaves(params), jax.tree.leaves(results[None][1]), strict=True))
                rows.append({"dataset": ds, "hidden_layers": layers, "network": network, "optimizer": name,
                             "k": int(k), "n": int(n), "steps": int(steps), "particle_batch": b, "seconds": sec,
                             "speedup": base / sec["median"], "max_abs_diff": diff})
    prov = store.provenance()
    return {"case": "particle-batch", "rows": rows, "device": _device_info(prov, _device_memory()),
            "provenance": prov, "wall_s": time.perf_counter() - start}


def measure_linesearch(
    key: jax.Array, datasets: Sequence[str], hidden_layers: Sequence[int], ks: Sequence[int], steps: int = 100,
    repeats: int = 3, max_rows: int = 0, dtype: str = "float32",
) -> dict[str, Any]:
    """The ensembles' zoom line search against optax's own under ``vmap`` (``bootens bench --case
    linesearch``): the ``linesearch.json`` document.

    For every dataset shape (:data:`SHAPES`, synthetic data in ``dtype``, the float32 of the UCI profiles by
    default; ``max_rows`` > 0 caps the rows) x hidden layers x ``k`` in ``ks``, the same particles take
    ``steps`` L-BFGS iterations (memory 10, initial step 0.5: the UCI profiles' optimizer) of
    :func:`bootens_core.ensemble.step` in one jitted ``lax.scan``, with optax's ``scale_by_zoom_linesearch``
    (vmapped per particle: a ``select`` of both branches) and with
    :func:`bootens_core.ensemble.batched_zoom_linesearch`. ``seconds``: the spread of ``repeats`` timed calls
    after a first one (``first_call_s``: compilation and one run); ``ms_per_iteration`` from the median;
    ``speedup``: optax's median over the batched one's, in the same process; ``search_steps``: the mean
    line-search steps per particle and iteration of each (equal when the particles take the same searches);
    ``max_abs_diff``: the largest difference of the final particles from optax's (float rounding, grown over
    the iterations).
    """
    if steps < 1 or repeats < 1 or not ks or any(int(k) < 1 for k in ks):
        raise ValueError(f"need steps, repeats and every k >= 1, got steps={steps}, repeats={repeats}, ks={list(ks)}")
    unknown = [d for d in datasets if d not in SHAPES]
    if unknown:
        raise ValueError(f"unknown dataset shape(s) {unknown}; known: {', '.join(SHAPES)}")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    if dtype == "float64":
        require_x64("linesearch bench in float64")
    start = time.perf_counter()
    dt = jnp.dtype(dtype)
    opts = {"optax": ensemble.Optimizer(optax.lbfgs(0.5, memory_size=10), True,
                                        "optax L-BFGS (memory 10), optax's zoom line search under vmap"),
            "batched": ensemble.optimizer("lbfgs", 0.5, memory_size=10, linesearch="zoom")}
    rows = []
    for ds in datasets:
        in_dim, n = SHAPES[ds]
        n = min(n, max_rows) if max_rows else n
        k_x, k_y, k_init = jax.random.split(jax.random.fold_in(key, datasets.index(ds)), 3)
        x = jax.random.normal(k_x, (n, in_dim), dt)
        y = jnp.sin(jax.random.normal(k_y, (n,), dt))
        for layers in hidden_layers:
            model = models.mlp(in_dim, (50,) * int(layers), "relu")
            for k in map(int, ks):
                res = {}
                for name, opt in opts.items():
                    state = ensemble.init(k_init, model, y, 0.01, k, opt)

                    def go(state, opt=opt):
                        def one(s, _):
                            s, _info = ensemble.step(s, model, opt, x, 0.01)
                            return s, optax.tree.get(s.opt_state, "info").num_linesearch_steps
                        return jax.lax.scan(one, state, None, length=steps)

                    fn, last = jax.jit(go), [None]

                    def call(fn=fn, last=last, state=state):
                        last[0] = fn(state)
                        return last[0]

                    first_s, times = _time(call, repeats)
                    res[name] = (spread(times), first_s, last[0])
                ref = res["optax"][2][0].params
                for name, (sec, first_s, (final, counts)) in res.items():
                    diff = max(float(jnp.max(jnp.abs(u - v))) for u, v in
                               zip(jax.tree.leaves(final.params), jax.tree.leaves(ref), strict=True))
                    rows.append({"dataset": ds, "hidden_layers": int(layers), "k": k, "n": int(n),
                                 "dtype": dtype, "steps": int(steps), "linesearch": name,
                                 "seconds": sec, "first_call_s": first_s,
                                 "ms_per_iteration": 1e3 * sec["median"] / steps,
                                 "speedup": res["optax"][0]["median"] / sec["median"],
                                 "search_steps": float(jnp.mean(counts)), "max_abs_diff": diff})
    prov = store.provenance()
    return {"case": "linesearch", "rows": rows, "device": _device_info(prov, _device_memory()),
            "provenance": prov, "wall_s": time.perf_counter() - start}

def _shard_problem(p: dict[str, Any], mesh: Any) -> dict[str, Any]:
    n_dev = mesh.devices.size
    k = jax.tree.leaves(p["state"].params)[0].shape[0]
    if k % n_dev:
        raise ValueError(f"--shard needs every k divisible by the {n_dev} devices, got k={k}")
    state = p["state"]
    return {**p,
            "state": ensemble.State(*ensemble.shard_particles((state.params, state.opt_state, state.perturbation),
                                                              mesh),
                                    ensemble.replicate(state.step, mesh)),
            "x": ensemble.replicate(p["x"], mesh), "noise_var": ensemble.replicate(p["noise_var"], mesh)}


def run(key: jax.Array, cfg: BenchConfig, *, use_cache: bool = True, force: bool = False,
        progress: bool = False) -> store.Result:
    """:func:`measure`, cached in the result store (``summary`` is the ``bench.json`` document): the book
    reads a measurement made once instead of re-measuring on every execution."""
    require_x64("bench")
    return store.cached(NAME, key, cfg, lambda: ({}, measure(key, cfg, progress=progress)),
                        use_cache=use_cache, force=force)


def load_records(directory: str | os.PathLike[str], name: str = "bench.json") -> dict[str, dict[str, Any]]:
    """The committed benchmark records ``<directory>/<label>/<name>`` (e.g. a GPU run's ``bench.json``, a
    ``particle-batch.json``), by label; an empty dict when there are none. A record without
    ``device``/``rows`` is an error naming the file."""
    import json
    from pathlib import Path

    out = {}
    for path in sorted(Path(directory).glob(f"*/{name}")):
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or "device" not in doc or "rows" not in doc:
            raise ValueError(f"{path} is not a {name} document (no device or rows)")
        out[path.parent.name] = doc
    return out
