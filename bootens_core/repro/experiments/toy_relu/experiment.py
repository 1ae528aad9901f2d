"""Figure 4: the toy network ``f(x) = ReLU(w1 x) + ReLU(w2 x)``: ensemble vs MH vs the exact posterior.

With two weights the posterior is computed exactly on a grid, so beside the paper's reference (random-walk
Metropolis-Hastings) the KL curve is also measured against the truth, and the MH reference itself is graded.

Two estimators of ``KL(q_t || p)`` (ensemble ``q_t`` after ``t`` steps, posterior ``p``; the direction of the
paper's Theorems 1-2 and of its Figure 4):

* **the paper's**: ``KL(KDE(samples) || p)`` on a grid (bivariate KDE with Scott's bandwidth + numerical
  integration), on 200 particles; the KL that 200 exact posterior samples get from it (the KDE
  self-distance) is the floor it can reach. Its bias moves with the particles' spread (the bandwidth does).
* **the histogram estimator** (:func:`histogram_kl`): ``sum_b q_b log(q_b / p_b)`` over fixed square bins,
  ``q_b`` the fraction of particles in bin ``b``, ``p_b`` the exact posterior mass of the bin
  (:func:`bin_log_posterior`), jackknife-corrected for the plug-in entropy's bias (which would otherwise
  shrink as the particles gather: a bias that moves). It estimates the KL between the two binned
  distributions, a fixed functional of ``q_t``; its remaining bias is measured where the truth is known (the
  prior at step 0, exact posterior draws). Bins with no particle contribute ``0 log 0 = 0``, which is their exact share of the binned KL in
  this direction, so no floor is added; ``p_b`` is a log mass computed in log space and finite in every
  bin, so a particle far out in the posterior's tail counts with its true (large) cost.

The histogram study runs ``kl_repeats`` independent ensembles of ``kl_particles`` particles (their spread is
the Monte-Carlo noise of every curve and difference) at the paper's step and at a small step over the same
time horizon ``step * h``, and follows the particles whose two weights share a sign.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special
from tqdm import tqdm

from ....exact import density
from .... import ensemble, samplers, models, perturb
from ... import store
from ...config import require_x64
from .config import ToyReluConfig
from ....data import synthetic

__all__ = [
    "NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run", "QUADRANTS", "RECORD_KEYS", "RECORD_LABELS", "STEP_LABELS",
    "rhat_null_quantile", "Bins", "bins", "bin_log_posterior", "bin_log_gaussian", "binned_kl", "bin_counts",
    "histogram_kl", "curvatures", "overshoot_steps", "same_sign_slopes", "curve_statistics", ]

NAME = "toy-relu"
DESCRIPTION = "Toy ReLU network (2 weights): ensemble vs Metropolis-Hastings vs the exact grid posterior, KL curve"
ARTEFACTS = ("Figure 4",)
Config = ToyReluConfig


@dataclasses.dataclass(frozen=True)
class Summary(store.TypedSummary):
    """Figure 4 in numbers: the keys of the run's ``summary.json``.

    The paper's KL estimate (``kl_estimator``) along the optimisation against the MH reference (``*_vs_mh``)
    and against the exact grid posterior (``*_vs_exact``), with the floor it can reach (``kde_self_distance_*``:
    the same estimate for exact posterior samples); the MH reference's diagnostics (``rhat_*`` against the
    i.i.d. quantile ``rhat_iid_q99``, ``ess_*``, ``mh_*``); the posterior mass of each sign quadrant
    (``quadrant_mass_*``, in the order of ``quadrants``); the setting. ``histogram``: the histogram-estimator
    study, a nested dict (its keys are read by :mod:`.verdicts`).
    """

    kl_monotone_fraction: float
    kl_monotone_fraction_exact: float
    kl_max_increase: float
    kl_max_increase_exact: float
    kl_max_increase_step: int
    kl_settled_step: int
    kl_initial_vs_mh: float
    kl_initial_vs_exact: float
    kl_final_vs_mh: float
    kl_final_vs_exact: float
    kl_min_vs_exact: float
    kl_min_vs_exact_step: int
    kl_mh_vs_exact: float
    kde_self_distance_mean: float
    kde_self_distance_sd: float
    kde_self_distance_populations: int
    rhat_max: float
    rhat_mean: float
    rhat_iid_q99: float
    ess_min: float
    ess_tail_min: float
    mh_accept_rate: float
    mh_samples: int
    mh_sampler: str
    quadrants: list[str]
    quadrant_mass_exact: list[float]
    quadrant_mass_ensemble: list[float]
    quadrant_mass_mh: list[float]
    kl_steps_evaluated: int
    n_particles: int
    steps: int
    step_size: float
    optimizer: str
    diverged_particles: int
    data: str
    kl_estimator: str
    histogram: dict[str, Any]

QUADRANTS = ("w1>0, w2>0", "w1>0, w2<0", "w1<0, w2>0", "w1<0, w2<0")
# The summary numbers a chapter shows side by side for two runs (e.g. quick profile vs a committed paper run),
# with the readable label of each (the KL is the paper's KDE estimate, against MH or the exact grid posterior).
RECORD_LABELS = {
    "kl_steps_evaluated": "steps at which the KL is evaluated",
    "kl_monotone_fraction": "KL vs MH: fraction of evaluations where it does not rise",
    "kl_max_increase": "KL vs MH: largest rise between evaluations",
    "kl_max_increase_step": "KL vs MH: step of the largest rise",
    "kl_monotone_fraction_exact": "KL vs exact: fraction of evaluations where it does not rise",
    "kl_max_increase_exact": "KL vs exact: largest rise between evaluations",
    "kl_min_vs_exact_step": "KL vs exact: step of its minimum",
    "kl_settled_step": "KL vs exact: step after which it no longer changes",
    "kl_final_vs_mh": "KL vs MH after the last step",
    "kl_final_vs_exact": "KL vs exact after the last step",
    "kl_mh_vs_exact": "KL of the MH samples vs exact",
    "rhat_max": "MH: largest predictive R-hat",
    "ess_min": "MH: smallest bulk ESS",
}
RECORD_KEYS = tuple(RECORD_LABELS)


# The two step sizes of the histogram study: the paper's and a small one over the same time horizon.
STEP_LABELS = ("paper_step", "small_step")


# ------------------------------------------------------------------------------ the histogram KL estimator


class Bins(NamedTuple):
    """Square bins of side ``width`` tiling ``[-half_width, half_width]^2``; ``n`` per axis, 0 is an edge."""

    half_width: float
    width: float

    @property
    def n(self) -> int:
        return round(2 * self.half_width / self.width)

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(-self.half_width, self.half_width, self.n + 1)


def bins(half_width: float, width: float) -> Bins:
    """Validated :class:`Bins`: ``2 * half_width / width`` must be an even integer, so that the axes (where
    the ReLUs switch on and off) are bin edges and the log posterior is a smooth quadratic inside every bin."""
    if not (half_width > 0 and width > 0):
        raise ValueError(f"bin half width and width must be positive, got {half_width}, {width}")
    n = 2 * half_width / width
    if abs(n - round(n)) > 1e-9 or round(n) % 2:
        raise ValueError(f"2 * half_width / width must be an even integer, got {n:g}")
    return Bins(float(half_width), float(width))


def _gl_nodes(b: Bins, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes of every bin along one axis, ``(n * nodes,)``, and their log weights ``(nodes,)``."""
    u, wq = np.polynomial.legendre.leggauss(nodes)
    centres = 0.5 * (b.edges[:-1] + b.edges[1:])
    return (centres[:, None] + 0.5 * b.width * u[None]).ravel(), np.log(0.5 * b.width * wq)


def bin_log_posterior(model: models.Model, x, y, noise_var: float, b: Bins, nodes: int = 4) -> np.ndarray:
    """``log p_b``: the exact posterior mass of every bin, ``(n, n)`` (first weight along rows), normalised
    over the square.

    Each bin's integral of ``p(D, w)`` is a ``nodes x nodes`` Gauss-Legendre sum in log space (no underflow:
    a bin far in the tail keeps its true, tiny mass). Inside a bin the log joint of this model is a quadratic
    (the ReLUs switch only on the axes, which are bin edges), so the rule converges fast; the tests compare
    it with the closed form.
    """
    if models.n_params(model) != 2:
        raise ValueError("bin_log_posterior needs a model with 2 parameters")
    _, unravel = models.ravel(models.prior_sample(jax.random.key(0), model))
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    pts, lw = _gl_nodes(b, nodes)
    logp = jax.jit(jax.vmap(lambda t: perturb.log_joint(model, unravel(t), xj, yj, noise_var)))
    values = []
    for a in pts.reshape(b.n, nodes):  # one row of bins at a time: memory stays at n * nodes^2 points
        aa, bb = np.meshgrid(a, pts, indexing="ij")
        v = np.asarray(logp(jnp.asarray(np.stack([aa.ravel(), bb.ravel()], axis=1))))
        v = v.reshape(nodes, b.n, nodes) + lw[:, None, None] + lw[None, None, :]
        values.append(special.logsumexp(v, axis=(0, 2)))
    out = np.stack(values)
    return out - special.logsumexp(out)


def bin_log_gaussian(mean: tuple[float, float], sd: tuple[float, float], b: Bins) -> np.ndarray:
    """``log q_b`` of an axis-aligned Gaussian, exactly (normal CDF differences), normalised over the square."""
    out = []
    for m, s in zip(mean, sd, strict=True):
        z = (b.edges - m) / s
        # log(Phi(z_hi) - Phi(z_lo)) on the side of the mean where it does not cancel.
        lo, hi = z[:-1], z[1:]
        upper = lo > 0
        a = np.where(upper, -hi, lo)
        c = np.where(upper, -lo, hi)
        lc, la = special.log_ndtr(c), special.log_ndtr(a)
        out.append(lc + np.log1p(-np.exp(la - lc)))
    lq = out[0][:, None] + out[1][None, :]
    return lq - special.logsumexp(lq)


def binned_kl(log_q: np.ndarray, log_p: np.ndarray) -> float:
    """``KL(q_B || p_B) = sum_b q_b log(q_b / p_b)`` of two binned distributions given by their log masses."""
    q = np.exp(log_q)
    return float(np.sum(np.where(q > 0, q * (log_q - log_p), 0.0)))


def bin_counts(w: np.ndarray, b: Bins) -> tuple[np.ndarray, int]:
    """Particles per bin, ``(n, n)``, and how many particles lie outside the square (left out)."""
    w = np.asarray(w, np.float64)
    if w.ndim != 2 or w.shape[1] != 2:
        raise ValueError(f"particles must have shape (k, 2), got {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("particles contain NaN or Inf")
    i = np.floor((w + b.half_width) / b.width).astype(np.int64)
    inside = np.all((i >= 0) & (i < b.n), axis=1)
    i = i[inside]
    counts = np.bincount(i[:, 0] * b.n + i[:, 1], minlength=b.n * b.n).reshape(b.n, b.n)
    return counts, int(np.sum(~inside))


def histogram_kl(counts: np.ndarray, log_p: np.ndarray) -> dict[str, float]:
    """The histogram estimate of ``KL(q || p)`` from particle counts per bin and the exact log masses ``log_p``.

    The plug-in ``sum_b q_b log(q_b / p_b)`` with ``q_b = count_b / N`` overestimates the binned KL by about
    ``(occupied bins - 1) / (2 N)`` (the plug-in entropy's bias), which shrinks as the particles gather in
    fewer bins: a bias that moves with their spread. Returned:

    * ``kl``: the jackknife-corrected estimate ``N KL - (N - 1) mean_i KL_(-i)`` (``KL_(-i)``: particle ``i``
      left out; closed form per bin). The cross term ``sum q_b log p_b`` is linear in the counts, so the
      jackknife corrects only the entropy; its remaining bias is measured in the experiment where the truth is
      known (the prior, exact posterior draws);
    * ``plugin``, ``correction`` (= plugin - kl) and ``miller_madow`` (plugin - (occupied - 1) / (2 N));
    * ``cross``: the cross-entropy ``-sum_b q_b log p_b`` (unbiased); ``kl - cross`` is the (corrected)
      negative entropy of the binned particles.

    Empty bins contribute exactly 0 (``0 log 0``): in this direction of the KL that is their share of the
    binned KL, so they need no floor.
    """
    counts = np.asarray(counts)
    log_p = np.asarray(log_p, np.float64)
    if counts.shape != log_p.shape:
        raise ValueError(f"counts {counts.shape} and log masses {log_p.shape} differ in shape")
    if not np.all(np.isfinite(log_p)):
        raise ValueError("log masses must be finite in every bin")
    n = int(counts.sum())
    if n < 3:
        raise ValueError("the histogram KL needs at least 3 particles inside the bins")
    occ = counts > 0
    c = counts[occ].astype(np.float64)
    lp = log_p[occ]
    s_cc, x_cp = float(np.sum(c * np.log(c))), float(np.sum(c * lp))
    plugin = s_cc / n - np.log(n) - x_cp / n
    # One particle left out of a bin with count c: S and X lose that bin's share of it.
    cm1 = c - 1
    s_loo = s_cc - c * np.log(c) + np.where(cm1 > 0, cm1 * np.log(np.maximum(cm1, 1)), 0.0)
    kl_loo = s_loo / (n - 1) - np.log(n - 1) - (x_cp - lp) / (n - 1)
    jack = n * plugin - (n - 1) * float(np.sum(c * kl_loo)) / n
    mm = plugin - (occ.sum() - 1) / (2 * n)
    return {"kl": float(jack), "plugin": float(plugin), "correction": float(plugin - jack), "miller_madow": float(mm),
            "cross": float(-x_cp / n)}


def curvatures(x: np.ndarray, noise_var: float, prior_var: float) -> np.ndarray:
    """Largest eigenvalue of ``-Hessian log p~`` in each sign quadrant (order of :data:`QUADRANTS`).

    For this piecewise-linear model the Hessian is constant in a quadrant, the same with and without the
    perturbations: ``sum_i phi_i phi_i^T / sigma^2 + I / alpha^2`` with ``phi_i = x_i (1[w1 x_i > 0],
    1[w2 x_i > 0])``. Plain gradient ascent with step ``h`` overshoots where ``h * curvature > 1``.
    """
    x = np.asarray(x, np.float64)
    out = []
    for s1, s2 in ((1, 1), (1, -1), (-1, 1), (-1, -1)):
        phi = np.stack([x * (s1 * x > 0), x * (s2 * x > 0)], axis=1)
        a = phi.T @ phi / noise_var + np.eye(2) / prior_var
        out.append(float(np.linalg.eigvalsh(a)[-1]))
    return np.array(out)


def overshoot_steps(h_curvature: float, tolerance: float) -> int:
    """Steps until an overshoot of plain gradient ascent has decayed below ``tolerance`` of its start.

    On a quadratic with curvature ``lambda`` a step of size ``h`` multiplies the distance to the optimum by
    ``1 - h lambda``: for ``h lambda > 1`` the particle jumps past the optimum and the overshoot decays by
    ``|1 - h lambda|`` per step. 0 where ``h lambda <= 1`` (no overshoot); ``h lambda >= 2`` diverges.
    """
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must lie in (0, 1), got {tolerance}")
    if h_curvature >= 2:
        raise ValueError(f"h * curvature = {h_curvature:g} >= 2: plain gradient ascent diverges")
    if h_curvature <= 1:
        return 0
    return int(np.ceil(np.log(tolerance) / np.log(h_curvature - 1)))


def same_sign_slopes(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slopes of the data on ``x > 0`` and on ``x < 0``: where both weights are positive the
    network is ``(w1 + w2) x`` on ``x > 0`` (0 on ``x < 0``), where both are negative ``(w1 + w2) x`` on
    ``x < 0``; gradient ascent moves such a particle along the diagonal towards ``w1 + w2`` = that slope."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    pos, neg = x > 0, x < 0
    return float(x[pos] @ y[pos] / (x[pos] @ x[pos])), float(x[neg] @ y[neg] / (x[neg] @ x[neg]))


def curve_statistics(k: np.ndarray, window: int) -> dict[str, float]:
    """Statistics of ``(repeats, times)`` KL curves of independent ensembles, with standard errors over repeats.

    ``net_all`` = final - first, ``net_late`` = final - the value at index ``window`` (the end of the window
    excluded), ``rise_after_min`` = final - the value at the minimum of the mean curve, cross-fitted: repeat
    ``r``'s minimum is located on the mean of the *other* repeats, so that the selection of the minimum does
    not bias the difference downwards by the noise it picked. SE = sd over repeats / sqrt(repeats).
    """
    k = np.asarray(k, np.float64)
    r = k.shape[0]
    if r < 2:
        raise ValueError("curve statistics need at least 2 repeats")

    def mse(d):
        return float(np.mean(d)), float(np.std(d, ddof=1) / np.sqrt(r))

    others = (k.sum(0)[None] - k) / (r - 1)
    j_min = np.argmin(others, axis=1)
    out = {}
    for name, d in (("net_all", k[:, -1] - k[:, 0]), ("net_late", k[:, -1] - k[:, window]),
                    ("rise_after_min", k[:, -1] - k[np.arange(r), j_min])):
        out[name], out[f"{name}_se"] = mse(d)
    for name, j in (("start", 0), ("window", window), ("final", -1)):
        out[f"kl_{name}"], out[f"kl_{name}_se"] = mse(k[:, j])
    mean = k.mean(0)
    out["kl_min"] = float(mean.min())
    out["kl_min_index"] = int(np.argmin(mean))
    return out


def _same_sign_study(path: np.ndarray, times: np.ndarray, slopes: tuple[float, float]) -> dict[str, np.ndarray]:
    """What the particles whose weights share a sign do along one run ``path`` ``(T, k, 2)``."""
    same = path[..., 0] * path[..., 1] > 0  # (T, k)
    start, end = same[0], same[-1]
    w0 = path[0]
    # Both positive: the data on x > 0 pull w1 + w2 along the diagonal towards slopes[0]; the smaller weight
    # crosses 0 first if |w1 - w2| exceeds that slope. Both negative: the same on x < 0 with -slopes[1].
    target = np.where(w0[:, 0] > 0, slopes[0], -slopes[1])
    predicted = start & (np.abs(w0[:, 0] - w0[:, 1]) > target)
    left = start & ~end
    ever_left = start & np.any(~same, axis=0)
    first_out = np.argmax(~same, axis=0)
    return {
        "fraction": same.mean(1),
        "start": start.mean(),
        "leave": left.sum() / max(start.sum(), 1),
        "returned": (ever_left & end).sum(),
        "enter": (~start & end).sum() / max((~start).sum(), 1),
        "rule_agreement": np.mean(predicted[start] == left[start]),
        "leave_times": times[first_out[left]],
    }


def _histogram_study(key: jax.Array, cfg: ToyReluConfig, model: models.Model, data, progress: bool):
    """KL curves by the histogram estimator at the paper's and the small step, over ``kl_repeats`` ensembles."""
    ratio = cfg.step_size / cfg.small_step_size
    if abs(ratio - round(ratio)) > 1e-9 or round(ratio) < 1:
        raise ValueError(f"step_size / small_step_size must be a whole number, got {ratio:g}")
    ratio = round(ratio)
    curv = curvatures(data.x, cfg.noise_var, cfg.prior_var)
    w_steps = overshoot_steps(cfg.step_size * curv.max(), cfg.overshoot_tolerance)
    dense = max(min(cfg.kl_dense_steps, cfg.steps), w_steps)
    if w_steps > cfg.steps:
        raise ValueError(f"the overshoot window ({w_steps} steps) is longer than the run ({cfg.steps} steps)")
    eval_steps = np.array(sorted(set(range(dense + 1)) | set(range(dense, cfg.steps + 1, cfg.kl_every))
                                 | {cfg.steps}))
    times = np.round(eval_steps * cfg.step_size, 12)  # 6 * 0.05 is 0.30000000000000004
    window = int(np.flatnonzero(eval_steps == w_steps)[0])
    runs = {"paper_step": (cfg.step_size, eval_steps), "small_step": (cfg.small_step_size, eval_steps * ratio)}

    main = bins(cfg.bin_half_width, cfg.bin_width)
    log_p = bin_log_posterior(model, data.x, data.y, cfg.noise_var, main, cfg.bin_nodes)
    # Checks of the estimator on the same particles: bins of half and twice the width, half the particles.
    checks = {"half_width": bins(cfg.bin_half_width, cfg.bin_width / 2),
              "double_width": bins(cfg.bin_half_width, 2 * cfg.bin_width), "half_particles": main}
    log_p_checks = {k: log_p if b == main else bin_log_posterior(model, data.x, data.y, cfg.noise_var, b, cfg.bin_nodes)
                    for k, b in checks.items()}
    n_half = cfg.kl_particles // 2
    slopes = same_sign_slopes(data.x, data.y)
    r_n, n_t = cfg.kl_repeats, len(eval_steps)

    kl = {lab: np.empty((r_n, n_t)) for lab in runs}
    corr = {lab: np.empty((r_n, n_t)) for lab in runs}
    cross = {lab: np.empty((r_n, n_t)) for lab in runs}
    # The KL of each group by where it ends: weights of opposite signs (the posterior's modes) or the same sign.
    groups = {lab: {g: np.empty((r_n, n_t)) for g in ("ends_opposite", "ends_same")} for lab in runs}
    kl_checks = {lab: {c: np.empty((r_n, n_t)) for c in checks} for lab in runs}
    same = {lab: np.empty((r_n, n_t)) for lab in runs}
    ss = {lab: [] for lab in runs}
    outside = 0
    k_runs, k_post = jax.random.split(key)
    opts = {lab: ensemble.optimizer("sgd", h) for lab, (h, _) in runs.items()}
    for r in tqdm(range(r_n), desc="histogram KL repeats", disable=not progress):
        k_r = jax.random.fold_in(k_runs, r)  # the same replicates at both steps: paired comparison
        for lab, (_, steps_at) in runs.items():
            res = ensemble.train(k_r, model, data.x, data.y, noise_var=cfg.noise_var, n_particles=cfg.kl_particles,
                                 opt=opts[lab], steps=int(steps_at[-1]), snapshot_steps=steps_at,
                                 compiler_options=ensemble.CPU_REDUCE_WITHOUT_YNN)
            path = np.asarray(res.snapshots["w"])
            del res
            for j in range(n_t):
                counts, out = bin_counts(path[j], main)
                outside += out
                est = histogram_kl(counts, log_p)
                kl[lab][r, j], corr[lab][r, j], cross[lab][r, j] = est["kl"], est["correction"], est["cross"]
                for c, b in checks.items():
                    w = path[j, :n_half] if c == "half_particles" else path[j]
                    kl_checks[lab][c][r, j] = histogram_kl(bin_counts(w, b)[0], log_p_checks[c])["kl"]
            ends_same = path[-1, :, 0] * path[-1, :, 1] > 0
            for g, mask in (("ends_opposite", ~ends_same), ("ends_same", ends_same)):
                for j in range(n_t):
                    groups[lab][g][r, j] = histogram_kl(bin_counts(path[j, mask], main)[0], log_p)["kl"]
            st = _same_sign_study(path, times, slopes)
            same[lab][r] = st.pop("fraction")
            ss[lab].append(st)

    # Bias where the truth is known: step 0 is a prior sample (the particles start at their prior anchors),
    # and multinomial draws of exact posterior bin masses have a binned KL of exactly 0.
    prior_exact = binned_kl(bin_log_gaussian((0.0, 0.0), (np.sqrt(cfg.prior_var),) * 2, main), log_p)
    p = np.exp(log_p).ravel()
    post = []
    for kk in jax.random.split(k_post, r_n):
        cells = np.asarray(jax.random.choice(kk, p.size, (cfg.kl_particles,), p=jnp.asarray(p / p.sum())))
        post.append(histogram_kl(np.bincount(cells, minlength=p.size).reshape(log_p.shape), log_p)["kl"])
    post = np.array(post)
    start = kl["paper_step"][:, 0]

    summary: dict = {
        "repeats": r_n, "particles": cfg.kl_particles, "bin_width": cfg.bin_width,
        "bin_half_width": cfg.bin_half_width, "bin_nodes": cfg.bin_nodes, "overshoot_steps": w_steps,
        "overshoot_tolerance": cfg.overshoot_tolerance,
        "overshoot_time": float(times[window]), "horizon_time": float(times[-1]),
        "curvature_by_quadrant": curv.tolist(), "same_sign_slopes": list(slopes), "particles_outside": outside,
        "bias_prior_exact": prior_exact,
        "bias_prior": float(start.mean() - prior_exact), "bias_prior_se": float(start.std(ddof=1) / np.sqrt(r_n)),
        "bias_posterior": float(post.mean()), "bias_posterior_se": float(post.std(ddof=1) / np.sqrt(r_n)),
        "estimator": "histogram KL(q_t || p): sum_b q_b log(q_b / p_b), q_b = particle fraction, jackknife-corrected, on "
        f"{cfg.bin_width:g}-wide bins of [-{cfg.bin_half_width:g}, {cfg.bin_half_width:g}]^2, p_b the exact "
        f"posterior mass ({cfg.bin_nodes}x{cfg.bin_nodes} Gauss-Legendre per bin); empty bins contribute 0",
    }
    arrays = {"hist_times": times, "hist_window_index": np.array(window)}
    for lab, (h, steps_at) in runs.items():
        st = curve_statistics(kl[lab], window)
        st["kl_min_time"] = float(times[st.pop("kl_min_index")])
        for c in checks:
            cs = curve_statistics(kl_checks[lab][c], window)
            st[f"rise_after_min_{c}"], st[f"rise_after_min_{c}_se"] = cs["rise_after_min"], cs["rise_after_min_se"]
        for g, kg in groups[lab].items():
            d = kg[:, -1] - kg[:, int(np.argmin(kl[lab].mean(0)))]  # from the whole curve's minimum to the end
            st[f"{g}_change_after_min"] = float(d.mean())
            st[f"{g}_change_after_min_se"] = float(d.std(ddof=1) / np.sqrt(r_n))
            st[f"{g}_kl_final"] = float(kg[:, -1].mean())
        leave = np.array([x["leave"] for x in ss[lab]])
        times_left = np.concatenate([x["leave_times"] for x in ss[lab]])
        hl = h * curv.max()
        j_min = int(np.argmin(kl[lab].mean(0)))
        st.update({
            "step_size": h, "steps": int(steps_at[-1]), "h_curvature_max": float(hl),
            "h_curvature_by_quadrant": (h * curv).tolist(),
            # How much of an initial overshoot is left after the window (|1 - h lambda| per step), if any.
            "overshoot_left_after_window": float(abs(1 - hl) ** int(steps_at[window])) if hl > 1 else 0.0,
            "correction_start": float(corr[lab][:, 0].mean()), "correction_final": float(corr[lab][:, -1].mean()),
            "correction_at_min": float(corr[lab][:, j_min].mean()),
            # KL = cross-entropy - entropy: which of the two moves between the minimum and the end.
            "cross_at_min": float(cross[lab][:, j_min].mean()), "cross_final": float(cross[lab][:, -1].mean()),
            "cross_change_after_min": float(np.mean(cross[lab][:, -1] - cross[lab][:, j_min])),
            "cross_change_after_min_se": float(np.std(cross[lab][:, -1] - cross[lab][:, j_min], ddof=1) / np.sqrt(r_n)),
            "same_sign_start": float(np.mean([x["start"] for x in ss[lab]])),
            "same_sign_final": float(same[lab][:, -1].mean()),
            "same_sign_final_se": float(same[lab][:, -1].std(ddof=1) / np.sqrt(r_n)),
            "leave_fraction": float(leave.mean()), "leave_fraction_se": float(leave.std(ddof=1) / np.sqrt(r_n)),
            "leave_time_median": float(np.median(times_left)) if times_left.size else float("nan"),
            "leave_time_q90": float(np.quantile(times_left, 0.9)) if times_left.size else float("nan"),
            "leave_time_max": float(times_left.max()) if times_left.size else float("nan"),
            "leave_after_window_fraction": float(np.mean(times_left > times[window])) if times_left.size else 0.0,
            "returned": int(sum(x["returned"] for x in ss[lab])),
            "enter_fraction": float(np.mean([x["enter"] for x in ss[lab]])),
            "leave_rule_agreement": float(np.mean([x["rule_agreement"] for x in ss[lab]])),
        })
        summary[lab] = st
        arrays[f"hist_kl_{lab}"] = kl[lab]
        arrays[f"hist_correction_{lab}"] = corr[lab].mean(0)
        arrays[f"same_sign_{lab}"] = same[lab]
    return arrays, summary


def run(
    key: jax.Array, cfg: ToyReluConfig, *, use_cache: bool = True, force: bool = False, progress: bool = False
) -> store.Result:
    """Run the toy-ReLU experiment (see the module docstring).

    The result's summary holds the fields of :class:`Summary` (``Summary.of(result)`` reads it typed)."""
    require_x64("toy-relu")
    return store.cached(NAME, key, cfg, lambda: _compute(key, cfg, progress), use_cache=use_cache, force=force)


def _quadrant_mass(w: np.ndarray) -> np.ndarray:
    """Fractions of ``(k, 2)`` weights in each quadrant, in the order of :data:`QUADRANTS`."""
    s1, s2 = w[:, 0] > 0, w[:, 1] > 0
    return np.array([np.mean(s1 & s2), np.mean(s1 & ~s2), np.mean(~s1 & s2), np.mean(~s1 & ~s2)])


def _grid_quadrant_mass(log_p: np.ndarray, g: density.Grid2D) -> np.ndarray:
    """Posterior mass of each quadrant, by Riemann sums on the grid (cells on an axis split evenly)."""
    p = np.exp(log_p)
    wa = np.where(g.a > 0, 1.0, np.where(g.a < 0, 0.0, 0.5))
    wb = np.where(g.b > 0, 1.0, np.where(g.b < 0, 0.0, 0.5))
    total = p.sum()
    return np.array([
        (p * np.outer(wa, wb)).sum(), (p * np.outer(wa, 1 - wb)).sum(),
        (p * np.outer(1 - wa, wb)).sum(), (p * np.outer(1 - wa, 1 - wb)).sum(),
    ]) / total


def _sample_grid(key: jax.Array, log_p: np.ndarray, g: density.Grid2D, n: int) -> np.ndarray:
    """``n`` draws from a grid density: a cell by its probability, then uniform within the cell."""
    k_cell, k_jit = jax.random.split(key)
    p = np.exp(log_p).ravel()
    cells = np.asarray(jax.random.choice(k_cell, p.size, (n,), p=jnp.asarray(p / p.sum())))
    pts = g.points[cells]
    da, db = g.a[1] - g.a[0], g.b[1] - g.b[0]
    jitter = np.asarray(jax.random.uniform(k_jit, (n, 2), jnp.float64, -0.5, 0.5)) * np.array([da, db])
    return pts + jitter


def rhat_null_quantile(key: jax.Array, n_chains: int, n_draws: int, q: float = 0.99, reps: int = 400) -> float:
    """The ``q`` quantile of R-hat for independent N(0, 1) draws of the same shape: the largest value that
    perfectly mixed chains of this size still give with probability ``1 - q`` (R-hat's own sampling noise)."""
    draws = np.asarray(jax.random.normal(key, (n_chains, n_draws, reps), jnp.float64))
    return float(np.quantile(samplers.rhat(draws), q))


def _compute(key: jax.Array, cfg: ToyReluConfig, progress: bool):
    k_data, k_ens, k_mh, k_self, k_null = jax.random.split(key, 5)
    k_hist = jax.random.fold_in(key, 5)  # the histogram study's own stream (the five above are unchanged)
    data = synthetic.toy_relu(k_data, cfg.n_data, cfg.w_true, cfg.noise_var, cfg.x_half_width)
    model = models.toy_relu(cfg.prior_var)
    g = density.grid(cfg.grid_half_width, cfg.grid_points)
    log_exact = density.grid_log_posterior(model, data.x, data.y, cfg.noise_var, g)

    # --- Algorithm 1: plain gradient ascent from the anchors.
    kl_steps = tuple(range(0, cfg.steps + 1, cfg.kl_every)) + ((cfg.steps,) if cfg.steps % cfg.kl_every else ())
    opt = ensemble.optimizer("sgd", cfg.step_size)
    res = ensemble.train(
        k_ens, model, data.x, data.y, noise_var=cfg.noise_var, n_particles=cfg.n_particles, opt=opt,
        steps=cfg.steps, snapshot_steps=kl_steps, progress="Algorithm 1" if progress else False,
        compiler_options=ensemble.CPU_REDUCE_WITHOUT_YNN,  # many particles, 24 points: 4x faster on a CPU
    )
    path = np.asarray(res.snapshots["w"])  # (len(kl_steps), k, 2)

    # --- The paper's reference: random-walk MH, 10 restarts from the prior.
    mh = samplers.metropolis_model(
        k_mh, model, data.x, data.y, noise_var=cfg.noise_var, n_chains=cfg.mh.chains,
        proposal_var=cfg.mh.proposal_var, n_draws=cfg.mh.draws, burn_in=cfg.mh.burn_in, thin=cfg.mh.thin,
        progress=progress,
    )
    mh_w = np.asarray(mh.params["w"]).reshape(-1, 2)
    x_grid = np.linspace(-2.5 * cfg.x_half_width, 2.5 * cfg.x_half_width, cfg.x_grid_points)
    diag = samplers.predictive_diagnostics(model, mh, x_grid)

    # --- KL curves: KDE of the particles at each step against MH's KDE and against the exact posterior.
    log_mh = density.kde_log_density(mh_w, g)
    kl_vs_mh = np.empty(len(kl_steps))
    kl_vs_exact = np.empty(len(kl_steps))
    for i in tqdm(range(len(kl_steps)), desc="KL (KDE, grid)", disable=not progress):
        log_q = density.kde_log_density(path[i], g)
        kl_vs_mh[i] = density.kl(log_q, log_mh, g)
        kl_vs_exact[i] = density.kl(log_q, log_exact, g)
    kl_mh_vs_exact = density.kl(log_mh, log_exact, g)
    # The floor: the same estimator on exact posterior samples of the same size.
    n_self = 20
    self_kl = np.array([
        density.kl(density.kde_log_density(_sample_grid(kk, log_exact, g, cfg.n_particles), g), log_exact, g)
        for kk in jax.random.split(k_self, n_self)
    ])

    # --- Predictive functions (ensemble, MH) and the exact predictive mean/sd by grid quadrature.
    f_ens = np.asarray(models.predict(model, res.params, jnp.asarray(x_grid)))
    f_mh = np.asarray(models.predict(model, {"w": jnp.asarray(mh_w)}, jnp.asarray(x_grid)))
    pts = g.points
    f_grid = np.maximum(pts[:, :1] * x_grid[None], 0) + np.maximum(pts[:, 1:] * x_grid[None], 0)
    pw = np.exp(log_exact).ravel()
    pw = pw / pw.sum()
    exact_mean = pw @ f_grid
    exact_sd = np.sqrt(np.maximum(pw @ f_grid**2 - exact_mean**2, 0))

    # --- The histogram estimator: 10^4 particles, the paper's and a small step, independent repeats.
    hist_arrays, hist_summary = _histogram_study(k_hist, cfg, model, data, progress)

    q_exact = _grid_quadrant_mass(log_exact, g)
    q_ens = _quadrant_mass(path[-1])
    q_mh = _quadrant_mass(mh_w)
    # A rise is a change above float round-off (the curves are flat once the particles have converged).
    dk = np.diff(kl_vs_mh)
    dk_exact = np.diff(kl_vs_exact)
    dk = np.where(np.abs(dk) <= 1e-9 * np.abs(kl_vs_mh).max(), 0.0, dk)
    dk_exact = np.where(np.abs(dk_exact) <= 1e-9 * np.abs(kl_vs_exact).max(), 0.0, dk_exact)
    summary = Summary(**{
        "kl_monotone_fraction": float(np.mean(dk <= 0)),
        "kl_monotone_fraction_exact": float(np.mean(dk_exact <= 0)),
        "kl_max_increase": float(max(dk.max(), 0.0)),
        "kl_max_increase_exact": float(max(dk_exact.max(), 0.0)),
        "kl_max_increase_step": int(kl_steps[int(np.argmax(dk)) + 1]),
        "kl_settled_step": int(kl_steps[int(np.flatnonzero(dk_exact != 0)[-1]) + 1]) if np.any(dk_exact != 0) else 0,
        "kl_initial_vs_mh": float(kl_vs_mh[0]),
        "kl_initial_vs_exact": float(kl_vs_exact[0]),
        "kl_final_vs_mh": float(kl_vs_mh[-1]),
        "kl_final_vs_exact": float(kl_vs_exact[-1]),
        "kl_min_vs_exact": float(kl_vs_exact.min()),
        "kl_min_vs_exact_step": int(kl_steps[int(np.argmin(kl_vs_exact))]),
        "kl_mh_vs_exact": float(kl_mh_vs_exact),
        "kde_self_distance_mean": float(self_kl.mean()),
        "kde_self_distance_sd": float(self_kl.std(ddof=1)),
        "kde_self_distance_populations": n_self,
        "rhat_max": diag["rhat_max"],
        "rhat_mean": diag["rhat_mean"],
        "rhat_iid_q99": rhat_null_quantile(k_null, cfg.mh.chains, cfg.mh.draws),
        "ess_min": diag["ess_bulk_min"],
        "ess_tail_min": diag["ess_tail_min"],
        "mh_accept_rate": float(np.mean(mh.accept_rate)),
        "mh_samples": int(mh_w.shape[0]),
        "mh_sampler": mh.sampler,
        "quadrants": list(QUADRANTS),
        "quadrant_mass_exact": q_exact.tolist(),
        "quadrant_mass_ensemble": q_ens.tolist(),
        "quadrant_mass_mh": q_mh.tolist(),
        "kl_steps_evaluated": len(kl_steps),
        "n_particles": cfg.n_particles,
        "steps": cfg.steps,
        "step_size": cfg.step_size,
        "optimizer": opt.description,
        "diverged_particles": int(np.sum(res.diverged)),
        "data": data.description,
        "kl_estimator": "KL(KDE(samples) || p) by Simpson's rule on a grid; scipy gaussian_kde (Scott's rule); "
        f"both densities renormalised on [-{cfg.grid_half_width:g}, {cfg.grid_half_width:g}]^2",
        "histogram": hist_summary,
    }).as_summary()
    arrays = {
        "x": data.x,
        "y": data.y,
        "x_grid": x_grid,
        "grid_axis": g.a,
        "log_exact": log_exact,
        "log_mh": log_mh,
        "log_ensemble": density.kde_log_density(path[-1], g),
        "kl_steps": np.asarray(kl_steps),
        "kl_vs_mh": kl_vs_mh,
        "kl_vs_exact": kl_vs_exact,
        "self_kl": self_kl,
        "particles_init": path[0],
        "particles": path[-1],
        "mh_w": mh_w,
        "f_ensemble": f_ens,
        "f_mh": f_mh,
        "exact_mean": exact_mean,
        "exact_sd": exact_sd,
        **hist_arrays,
    }
    return arrays, summary
