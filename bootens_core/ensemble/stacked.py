"""Many ensembles of one shape as one compiled program: problems stacked on a leading axis.

A problem is one :func:`~bootens_core.ensemble.train_grid` call: its own key, inputs and labels, and the
``sigma^2`` values its particle blocks see. Problems of equal shapes (the splits of one UCI dataset: Gal's
splits have equal training sizes, and the validation rows are a fixed share of them) stack: the kernel's
step (:func:`~bootens_core.ensemble.kernel.step`, a ``vmap`` over particles) is mapped over problems by one
more ``vmap``, so every split x every ``sigma^2`` x every particle advances in one program -- on an
accelerator one launch of each kernel per iteration for all of them, where a problem at a time pays each
launch and each host round-trip of the line search's loop once per problem.

Problem ``p``'s block ``g`` is the ensemble ``train_grid(keys[p], model, xs[p], ys[p],
noise_grid=noise_vars[p])[g]`` trains, up to float rounding (the same replicates: ``init`` under ``vmap``
draws the same numbers). How many problems go in one program: as many as a share of the accelerator's
memory holds, by XLA's own memory analysis of the compiled one-problem program (:func:`problems_per_program`);
all of them on a CPU. The programs run one after another; the last is padded with copies of the last problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..checks import DivergedParticlesError, check_data, model_outputs
from ..models import Model, float_dtype
from .drivers import EnsembleResult
from .kernel import State, init, step
from .optimizers import Optimizer

__all__ = ["MEMORY_SHARE", "problems_per_program", "train_stacked"]

#: The share of an accelerator's memory the problems of one program may take (XLA's memory analysis of the
#: one-problem program, times the problems): the rest is left to the other processes a window runs beside it.
MEMORY_SHARE = 0.25


def _init_problem(key: jax.Array, y: jax.Array, noise_vars: jax.Array, *, model: Model, k: int,
                  opt: Optimizer, perturb_labels: bool, perturb_prior: bool) -> State:
    # train_grid's blocks: the same key for every value, the blocks side by side on the particle axis
    blocks = [init(key, model, y, noise_vars[g], k, opt, perturb_labels=perturb_labels,
                   perturb_prior=perturb_prior) for g in range(noise_vars.shape[0])]
    return State(*jax.tree.map(lambda *a: jnp.concatenate(a),
                               *[(b.params, b.opt_state, b.perturbation) for b in blocks]), blocks[0].step)


def _program(model: Model, opt: Optimizer, steps: int, k: int, perturb_labels: bool, perturb_prior: bool):
    def one(key, x, y, noise_vars):
        state = _init_problem(key, y, noise_vars, model=model, k=k, opt=opt, perturb_labels=perturb_labels,
                              perturb_prior=perturb_prior)
        per_particle = jnp.repeat(noise_vars, k)

        def body(s, _):
            s, info = step(s, model, opt, x, per_particle, noise_per_particle=True)
            return s, info.loss

        final, loss = jax.lax.scan(body, state, None, length=steps)
        return final.params, state.params, state.perturbation, loss

    return jax.jit(jax.vmap(one))


def problems_per_program(compiled_one: Any, n_problems: int, device: jax.Device | None = None) -> int:
    """How many problems one program takes: all ``n_problems`` on a CPU (or a device that reports no memory
    limit); on an accelerator, as many as :data:`MEMORY_SHARE` of its memory holds by XLA's memory analysis
    of ``compiled_one``, the compiled program of one problem (its arguments, outputs and temporaries), at
    least 1."""
    device = device or jax.devices()[0]
    limit = (device.memory_stats() or {}).get("bytes_limit") if device.platform != "cpu" else None
    if not limit:
        return int(n_problems)
    mem = compiled_one.memory_analysis()
    per = sum(int(getattr(mem, f, 0) or 0) for f in ("argument_size_in_bytes", "output_size_in_bytes",
                                                       "temp_size_in_bytes"))
    if per <= 0:
        return int(n_problems)
    return max(1, min(int(n_problems), int(MEMORY_SHARE * limit // per)))


def train_stacked(
    keys: Sequence[jax.Array] | jax.Array,
    model: Model,
    xs: Sequence[Any],
    ys: Sequence[Any],
    *,
    noise_vars: Sequence[Sequence[float]],
    n_particles: int,
    opt: Optimizer,
    steps: int,
    dtype: Any = None,
    on_diverged: str = "raise",
    perturb_labels: bool = True,
    perturb_prior: bool = True,
    problems: int | None = None,
) -> list[list[EnsembleResult]]:
    """Train the problems ``(keys[p], xs[p], ys[p])`` at once, problem ``p`` with one particle block per value
    of ``noise_vars[p]``; returns, per problem, one :class:`~bootens_core.ensemble.EnsembleResult` per value
    (no snapshots or records), as :func:`~bootens_core.ensemble.train_grid` would for that problem.

    Every problem has the same input shape and the same number of ``sigma^2`` values (positive, finite);
    ``problems``: how many go in one program (default :func:`problems_per_program`). Other arguments as
    :func:`~bootens_core.ensemble.train_grid`. Raises ``ValueError`` for problems of different shapes or
    counts that do not match, naming them; ``on_diverged="raise"`` names the problems whose particles
    diverged.
    """
    if on_diverged not in ("raise", "report"):
        raise ValueError(f"on_diverged must be 'raise' or 'report', got {on_diverged!r}")
    n = len(xs)
    if n == 0 or len(ys) != n or len(noise_vars) != n or len(keys) != n:
        raise ValueError(f"need as many keys, inputs, labels and sigma^2 lists as problems (at least one), "
                         f"got {len(keys)}, {n}, {len(ys)} and {len(noise_vars)}")
    counts = [len(v) for v in noise_vars]
    if len(set(counts)) != 1 or counts[0] == 0:
        raise ValueError(f"noise_vars needs the same non-empty number of sigma^2 values for every problem, "
                         f"got {counts}")
    grid = np.asarray(noise_vars, dtype=np.float64)  # (problems, values): every row of one length
    if not np.all(np.isfinite(grid) & (grid > 0)):
        raise ValueError(f"every sigma^2 must be positive and finite, got {grid.tolist()}")
    steps, k = int(steps), int(n_particles)
    if steps < 0 or k < 1:
        raise ValueError(f"need steps >= 0 and n_particles >= 1, got {steps} and {k}")
    dtype = float_dtype(dtype)
    checked = [check_data(x, y, None, outputs=model_outputs(model, np.asarray(x)))
               for x, y in zip(xs, ys, strict=True)]
    shapes = {(tuple(x.shape), tuple(y.shape)) for x, y in checked}
    if len(shapes) != 1:
        raise ValueError(f"problems stack only with equal shapes, got inputs and labels of shapes "
                         f"{sorted(shapes)}")
    x_all = jnp.stack([x.astype(dtype) for x, _ in checked])
    y_all = jnp.stack([y.astype(dtype) for _, y in checked])
    key_all = jnp.stack(list(keys)) if not isinstance(keys, jax.Array) else keys
    nv_all = jnp.asarray(grid, dtype)
    run = _program(model, opt, steps, k, perturb_labels, perturb_prior)
    if problems is not None:
        per = int(problems)
    elif jax.devices()[0].platform == "cpu":  # all at once: no one-problem program to compile for its memory
        per = n
    else:
        per = problems_per_program(run.lower(key_all[:1], x_all[:1], y_all[:1], nv_all[:1]).compile(), n)
    if per < 1:
        raise ValueError(f"problems per program must be at least 1, got {problems!r}")
    outs = []
    for start in range(0, n, per):
        # the last program padded with copies of its last problem
        idx = np.minimum(np.arange(start, start + per), n - 1)
        part = run(key_all[idx], x_all[idx], y_all[idx], nv_all[idx])
        outs.append(jax.tree.map(lambda a, m=min(per, n - start): np.asarray(a[:m]), part))
    params, init_params, pert, loss = jax.tree.map(lambda *a: np.concatenate(a), *outs)
    results = []
    bad = []
    for p in range(n):
        blocks = []
        for g in range(grid.shape[1]):
            sl = slice(g * k, (g + 1) * k)
            take = lambda a, p=p, sl=sl: a[p, sl]  # noqa: E731
            par = jax.tree.map(take, params)
            finite = np.ones(k, bool)
            for leaf in jax.tree.leaves(par):
                finite &= np.all(np.isfinite(leaf.reshape(k, -1)), axis=1)
            blocks.append(EnsembleResult(
                params=jax.tree.map(jnp.asarray, par), init_params=jax.tree.map(take, init_params),
                snapshots=None, snapshot_steps=(), loss=loss[p][:, sl], records=None,
                perturbation=jax.tree.map(take, pert), diverged=~finite))
            if not finite.all():
                bad.append(p)
        results.append(blocks)
    if bad and on_diverged == "raise":
        problems_bad = sorted(set(bad))
        first = next(b.diverged for b in results[problems_bad[0]] if b.diverged.any())
        raise DivergedParticlesError(
            f"particles of problem(s) {problems_bad} diverged to NaN/Inf during {steps} steps of "
            f"{opt.description}. Lower the step size, or pass on_diverged='report'.", first, None)
    return results
