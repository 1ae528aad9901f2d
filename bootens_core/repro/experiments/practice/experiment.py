"""The measurements behind the guidance: particles, noise variance, prior, steps, stuck particles and
calibration.

Every split fits :class:`~bootens_core.estimators.BootstrapEnsembleRegressor` as a user would (defaults,
``noise_var="auto"``) and scores it on the held-out rows in the labels' units; the plain ensemble, the
paper's unscaled prior and deep ensembles (:mod:`bootens_core.baselines.deep_ensemble`) are fitted on the same
rows for paired comparisons, and one more run of the same ensemble keeps its particles at ``stop_steps`` to
show what stopping earlier would have given.
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import numpy as np

from .... import ensemble, metrics, models
from ....estimators import BootstrapEnsembleRegressor
from ... import store
from ...config import require_x64
from .config import PracticeConfig

__all__ = ["NAME", "DESCRIPTION", "ARTEFACTS", "Config", "Summary", "run", "split_rows", "stuck_particles",
           "first_within", "resampled_paired", "METHODS"]

NAME = "practice"
DESCRIPTION = "Bootstrap ensembles on one's own data: particles, noise variance, prior, steps, calibration"
ARTEFACTS = ("guidance beyond the paper",)
Config = PracticeConfig
#: The fits compared on every split: the bootstrap ensemble (the estimator's defaults), the plain ensemble
#: (``perturb=False``), the bootstrap ensemble with the paper's unscaled prior ``N(0, 1)`` and deep ensembles
#: (``PracticeConfig.deep``: 5 networks that learn a variance each, the UCI harness's settings).
METHODS = ("bootstrap", "plain", "prior N(0, 1)", "deep ensemble")
_METRICS = ("rmse", "mnll", "coverage90", "crps", "fit_s")


@dataclasses.dataclass(frozen=True)
class Summary(store.TypedSummary):
    """The guidance numbers, the keys of the run's ``summary.json``.

    ``k_enough``: the fewest particles whose test MNLL is shown to exceed the largest ensemble's by less than
    ``mnll_margin`` (:func:`first_within`); ``mnll_by_k``: mean test MNLL per ``k``.
    ``selected_noise_var``: the selected ``sigma^2`` (standardised units) per split. ``coverage``: mean
    coverage per nominal level, ``coverage_t``: its t statistic against the level over splits (standard error
    corrected for splits that share rows, :func:`resampled_paired`); ``pit_p``: Pearson's test of the first
    split's PIT histogram (the figure pools every split's). ``stop_step``: the first of ``stop_steps`` whose
    test MNLL is shown to exceed the last one's by less than ``mnll_margin``. ``stuck``: particles whose final
    objective lies more than 5 robust standard deviations above the median of their ensemble's, over all
    splits. ``compare``: for the plain ensemble, the unscaled prior and deep ensembles, the paired comparison
    with the bootstrap ensemble per metric (:func:`resampled_paired`, ``diff`` = other minus bootstrap).
    ``means``: each method's mean per metric.
    """

    n_splits: int
    n_test: int
    ks: list[int]
    mnll_by_k: list[float]
    k_enough: int
    mnll_margin: float
    selected_noise_var: list[float]
    levels: list[float]
    coverage: list[float]
    coverage_t: list[float]
    pit_p: float
    stop_steps: list[int]
    mnll_by_step: list[float]
    stop_step: int
    stuck: int
    particles_total: int
    compare: dict
    means: dict


def run(key: jax.Array, cfg: PracticeConfig, *, use_cache: bool = True, force: bool = False,
        progress: bool = False) -> store.Result:
    """Fit and score every split (cached); ``Summary.of(result)`` reads the numbers typed."""
    require_x64(NAME)
    _check(cfg)
    return store.cached(NAME, key, cfg, lambda: _compute(key, cfg, progress), use_cache=use_cache,
                        force=force)


def _check(cfg: PracticeConfig) -> None:
    if cfg.n_splits < 3:
        raise ValueError(f"n_splits must be at least 3 (paired t-tests with 2 or more degrees of freedom), "
                         f"got {cfg.n_splits}")
    if not 0 < cfg.test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {cfg.test_fraction}")
    if list(cfg.ks) != sorted(set(cfg.ks)) or cfg.ks[0] < 1 or cfg.ks[-1] != cfg.n_particles:
        raise ValueError(f"ks must increase from 1 or more to n_particles = {cfg.n_particles}, got {cfg.ks}")
    if not 1 <= cfg.compare_particles <= cfg.n_particles:
        raise ValueError(f"compare_particles must lie in [1, n_particles], got {cfg.compare_particles}")
    if list(cfg.stop_steps) != sorted(set(cfg.stop_steps)) or cfg.stop_steps[-1] != cfg.steps:
        raise ValueError(f"stop_steps must increase to steps = {cfg.steps}, got {cfg.stop_steps}")


def split_rows(n: int, split: int, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """``(train_rows, test_rows)`` of one random split: the first ``round(test_fraction n)`` rows of
    ``numpy.random.default_rng([seed, split]).permutation(n)`` are the test rows; both sorted."""
    perm = np.random.default_rng([int(seed), int(split)]).permutation(int(n))
    n_test = int(round(test_fraction * n))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def stuck_particles(final_loss: np.ndarray, threshold: float = 5.0) -> np.ndarray:
    """Particles whose final objective ``-log p~`` lies more than ``threshold`` robust standard deviations
    (1.4826 times the median absolute deviation) above the median of their ensemble's: a particle stuck in a
    poor optimum of its own objective. Every replicate's objective has its own minimum, so the spread of the
    final values is the yardstick, not zero."""
    v = np.asarray(final_loss, float)
    med = np.median(v)
    scale = 1.4826 * np.median(np.abs(v - med))
    if scale == 0:
        return v > med
    return (v - med) / scale > threshold


def _scores(y: np.ndarray, f: np.ndarray, noise_var: float | np.ndarray,
            levels: tuple[float, ...]) -> dict[str, object]:
    return {
        "rmse": metrics.rmse(y, f.mean(0)),
        "mnll": metrics.mixture_mnll(y, f, noise_var),
        "coverage90": metrics.mixture_coverage(y, f, noise_var, 0.9),
        "crps": metrics.mixture_crps(y, f, noise_var),
        "levels": metrics.coverage_levels(y, f, noise_var, levels),
    }


def _seed(key: jax.Array) -> int:
    return int(jax.random.randint(key, (), 0, np.iinfo(np.int32).max))


def _compute(key: jax.Array, cfg: PracticeConfig, progress: bool):
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    ks, steps = list(cfg.ks), list(cfg.stop_steps)
    kc = cfg.compare_particles
    by_k = np.zeros((cfg.n_splits, len(ks), 3))  # rmse, mnll, coverage90
    by_step = np.zeros((cfg.n_splits, len(steps), 3))  # rmse, mnll, coverage90
    method = np.zeros((cfg.n_splits, len(METHODS), len(_METRICS)))
    coverage = np.zeros((cfg.n_splits, len(cfg.levels)))
    val_mnll = np.zeros((cfg.n_splits, len(cfg.noise_grid)))
    selected, final_loss, loss_median, loss_q, n_test = [], [], [], [], 0
    pooled_y, pooled_f, pooled_var = [], [], []  # test labels and predictives of every split, for the PIT
    for s in range(cfg.n_splits):
        k_fit, k_plain, k_prior, k_stop = jax.random.split(jax.random.fold_in(key, s), 4)
        tr, te = split_rows(x.shape[0], s, cfg.seed, cfg.test_fraction)
        n_test = te.size
        common = {"steps": cfg.steps, "noise_grid": cfg.noise_grid,
                  "progress": f"split {s}" if progress else False}
        start = time.perf_counter()
        est = BootstrapEnsembleRegressor(n_particles=cfg.n_particles, random_state=_seed(k_fit), **common)
        est.fit(x[tr], y[tr])
        fit_s = time.perf_counter() - start
        if est.n_particles_ != cfg.n_particles:
            raise RuntimeError(f"split {s}: {cfg.n_particles - est.n_particles_} particles diverged")
        f = est.predict_particles(x[te])
        for i, k in enumerate(ks):
            sc = _scores(y[te], f[:k], est.noise_var_, cfg.levels)
            by_k[s, i] = sc["rmse"], sc["mnll"], sc["coverage90"]
        full = _scores(y[te], f, est.noise_var_, cfg.levels)
        coverage[s] = [full["levels"][float(v)] for v in cfg.levels]
        pooled_y.append(y[te])
        pooled_f.append(f)
        pooled_var.append(np.full(te.size, est.noise_var_))
        val_mnll[s] = est.validation_mnll_
        selected.append(est.noise_var_standardised_)
        final_loss.append(est.loss_curve_[-1])
        loss_median.append(np.median(est.loss_curve_, axis=1))
        loss_q.append(np.quantile(est.loss_curve_, [0.1, 0.9], axis=1))
        sub = _scores(y[te], f[:kc], est.noise_var_, cfg.levels)
        method[s, 0] = [sub[m] for m in _METRICS[:-1]] + [fit_s]
        others = (({"perturb": False}, k_plain), ({"scale_by_fan_in": False}, k_prior))
        for j, (kw, kk) in enumerate(others, 1):
            start = time.perf_counter()
            other = BootstrapEnsembleRegressor(n_particles=kc, random_state=_seed(kk), **common, **kw)
            other.fit(x[tr], y[tr])
            seconds = time.perf_counter() - start
            sc = _scores(y[te], other.predict_particles(x[te]), other.noise_var_, cfg.levels)
            method[s, j] = [sc[m] for m in _METRICS[:-1]] + [seconds]
        start = time.perf_counter()
        f_deep, var_deep = _deep_ensemble(jax.random.fold_in(jax.random.fold_in(key, s), len(METHODS)),
                                          x[tr], y[tr], x[te], cfg)
        seconds = time.perf_counter() - start
        sc = _scores(y[te], f_deep, var_deep, cfg.levels)
        method[s, len(METHODS) - 1] = [sc[m] for m in _METRICS[:-1]] + [seconds]
        by_step[s] = _stopped_early(k_stop, est, x[tr], y[tr], x[te], y[te], cfg)
    pit = metrics.pit_histogram(np.concatenate(pooled_y), np.concatenate(pooled_f, axis=1),
                                np.concatenate(pooled_var), cfg.pit_bins)
    # The test of uniformity on one split's rows: pooled over splits, a row can count more than once.
    pit_p = metrics.pit_histogram(pooled_y[0], pooled_f[0], pooled_var[0], cfg.pit_bins).p_value
    return _summarise(cfg, by_k, by_step, method, coverage, val_mnll, selected, final_loss, loss_median,
                      loss_q, pit, float(pit_p), n_test)


def _deep_ensemble(key: jax.Array, x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray,
                   cfg: PracticeConfig) -> tuple[np.ndarray, np.ndarray]:
    """Deep ensembles on the training rows (inputs and labels standardised with their statistics, as the
    estimator does): the networks' means and variances at the test rows, in the labels' units."""
    from ....baselines import deep_ensemble

    xm, xs = x_tr.mean(0), x_tr.std(0)
    xs = np.where(xs > 0, xs, 1.0)
    ym, ys = float(y_tr.mean()), float(y_tr.std())
    d = cfg.deep
    ens = deep_ensemble.fit(key, (x_tr - xm) / xs, (y_tr - ym) / ys, hidden=(d.width,), n_networks=d.n_networks,
                            epochs=d.epochs, batch_size=d.batch_size, lr=d.lr, adversarial_eps=d.adversarial_eps)
    mu, var = deep_ensemble.predict(ens, (x_te - xm) / xs)
    return ym + ys * np.asarray(mu, float), ys**2 * np.asarray(var, float)


def _stopped_early(key: jax.Array, est: BootstrapEnsembleRegressor, x_tr: np.ndarray, y_tr: np.ndarray,
                   x_te: np.ndarray, y_te: np.ndarray, cfg: PracticeConfig) -> np.ndarray:
    """Test RMSE, MNLL and coverage of the central 90% interval of the particles after each of
    ``stop_steps``: the estimator's network, prior, optimizer, standardisation and selected ``sigma^2``,
    trained once with snapshots (another key)."""
    model = models.mlp(x_tr.shape[1], est.hidden_layer_sizes, est.activation, weight_var=est.weight_var,
                       bias_var=est.bias_var, scale_by_fan_in=est.scale_by_fan_in)
    extra = {"linesearch": "zoom"} if est.optimizer == "lbfgs" else {}  # as the estimator builds it
    opt = ensemble.optimizer(est.optimizer, est.learning_rate, **extra)
    xs, xt = (x_tr - est.x_mean_) / est.x_scale_, (x_te - est.x_mean_) / est.x_scale_
    ys = (y_tr - est.y_mean_) / est.y_scale_
    res = ensemble.train(key, model, xs, ys, noise_var=est.noise_var_standardised_,
                         n_particles=cfg.n_particles, opt=opt, steps=cfg.steps, snapshot_steps=cfg.stop_steps,
                         on_diverged="report")
    out = np.zeros((len(cfg.stop_steps), 3))
    for i in range(len(cfg.stop_steps)):
        snap = jax.tree.map(lambda a, i=i: a[i], res.snapshots)
        f = est.y_mean_ + est.y_scale_ * np.asarray(ensemble.predict(model, snap, xt), float)
        ok = np.all(np.isfinite(f), axis=1)
        out[i] = (metrics.rmse(y_te, f[ok].mean(0)), metrics.mixture_mnll(y_te, f[ok], est.noise_var_),
                  metrics.mixture_coverage(y_te, f[ok], est.noise_var_, 0.9))
    return out


def resampled_paired(a: np.ndarray, b: np.ndarray, test_to_train: float, level: float = 0.05) -> dict:
    """Paired comparison of ``a`` and ``b`` over random splits of one dataset, with Nadeau and Bengio's
    corrected resampled t-test (Machine Learning 52, 2003): the splits share rows, so their differences
    ``d = a - b`` are correlated and ``SD(d) / sqrt(J)`` understates the error of their mean; the corrected
    standard error is ``SD(d) sqrt(1/J + n_test/n_train)``, with Student's t on ``J - 1`` degrees of freedom.
    Returns the mean difference, that standard error, ``t``, the two-sided ``p`` and a verdict: ``lower`` /
    ``higher`` (a's mean below / above b's at ``level``) or ``no significant difference``."""
    from scipy import stats

    d = np.asarray(a, float) - np.asarray(b, float)
    j = d.size
    se = float(d.std(ddof=1) * math.sqrt(1 / j + test_to_train))
    mean = float(d.mean())
    if se > 0:
        t = mean / se
        p = float(2 * stats.t.sf(abs(t), j - 1))
    else:
        t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    verdict = "no significant difference" if p >= level else ("lower" if mean < 0 else "higher")
    return {"n": j, "diff": mean, "se": se, "t": t, "p": p, "verdict": verdict}


def first_within(values: np.ndarray, candidates: list[int], margin: float, test_to_train: float = 0.0,
                 level: float = 0.05) -> int:
    """The first candidate (column of ``values``, one row per split) shown no worse than the last column by
    more than ``margin``: a paired non-inferiority test, the upper ``1 - level`` confidence bound of the mean
    difference below ``margin``, its standard error corrected for splits that share rows
    (:func:`resampled_paired`; ``test_to_train`` 0 gives the plain paired bound). The last candidate if none
    is."""
    from scipy import stats

    n = values.shape[0]
    for i, c in enumerate(candidates[:-1]):
        d = values[:, i] - values[:, -1]
        upper = d.mean() + stats.t.ppf(1 - level, n - 1) * d.std(ddof=1) * math.sqrt(1 / n + test_to_train)
        if upper < margin:
            return int(c)
    return int(candidates[-1])


def _summarise(cfg, by_k, by_step, method, coverage, val_mnll, selected, final_loss, loss_median, loss_q, pit,
               pit_p, n_test):
    levels = np.asarray(cfg.levels)
    dev = coverage - levels[None]
    ratio = cfg.test_fraction / (1 - cfg.test_fraction)  # n_test / n_train of every split
    cov_t = dev.mean(0) / (dev.std(0, ddof=1) * np.sqrt(1 / cfg.n_splits + ratio))
    stuck = sum(int(stuck_particles(v).sum()) for v in final_loss)
    compare = {}
    for j, name in enumerate(METHODS[1:], 1):
        compare[name] = {m: resampled_paired(method[:, j, i], method[:, 0, i], ratio)
                         for i, m in enumerate(_METRICS)}
    means = {name: {m: float(method[:, j, i].mean()) for i, m in enumerate(_METRICS)}
             for j, name in enumerate(METHODS)}
    summary = Summary(
        n_splits=cfg.n_splits, n_test=int(n_test), ks=list(cfg.ks), mnll_by_k=by_k[:, :, 1].mean(0).tolist(),
        mnll_margin=cfg.mnll_margin,
        k_enough=first_within(by_k[:, :, 1], list(cfg.ks), cfg.mnll_margin, ratio),
        selected_noise_var=[float(v) for v in selected],
        levels=list(cfg.levels), coverage=coverage.mean(0).tolist(), coverage_t=cov_t.tolist(),
        pit_p=pit_p, stop_steps=list(cfg.stop_steps),
        mnll_by_step=by_step[:, :, 1].mean(0).tolist(),
        stop_step=first_within(by_step[:, :, 1], list(cfg.stop_steps), cfg.mnll_margin, ratio), stuck=stuck,
        particles_total=int(cfg.n_splits * cfg.n_particles), compare=compare, means=means,
    ).as_summary()
    arrays = {
        "by_k": by_k, "by_step": by_step, "method": method, "coverage": coverage, "val_mnll": val_mnll,
        "noise_grid": np.asarray(cfg.noise_grid), "selected": np.asarray(selected),
        "final_loss": np.stack(final_loss),
        "loss_median": np.stack(loss_median), "loss_q": np.stack(loss_q), "pit": pit.pit,
        "pit_counts": pit.counts, "pit_edges": pit.edges,
    }
    return arrays, summary
