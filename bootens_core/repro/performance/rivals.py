"""The estimator against the regressors a practitioner would reach for instead: ``bootens bench --case estimator``.

Every method is fitted with its defaults on random 80/20 splits of each problem and scored on the test rows:

- **RMSE** of the predictive mean, and **NLL**, the mean negative log predictive density of the test labels
  (a mixture ``1/k sum_i N(f_i(x), s^2)`` for the ensembles, a Gaussian for the GP);
- **coverage90**: the share of test labels inside the central 90% predictive interval;
- **far_coverage90** (generated problems only): the share of points *far from the training inputs* (in a gap of
  the inputs, or outside their range) where the true function lies inside the central 90% interval of the
  method's function -- the particles' (or members') 5% and 95% quantiles, the GP's latent mean +- 1.645 sd;
- **fit_s**: wall seconds of ``fit`` (compilation included: the first fit of a shape compiles).

Methods (:data:`METHODS`): ``bootstrap`` -- :class:`~bootens_core.estimators.BootstrapEnsembleRegressor` with its
defaults; ``plain`` -- the same with ``perturb=False``; ``gp`` -- scikit-learn's ``GaussianProcessRegressor``
with a constant times an ARD RBF kernel plus a white-noise kernel, labels normalised, two optimiser restarts
(what its documentation builds for noisy data); ``bagged-mlp`` -- ten scikit-learn ``MLPRegressor`` (one hidden
layer of 50, its defaults) on bootstrap resamples of the standardised data, with a noise variance from their
out-of-bag squared errors, predicting the same mixture as the ensembles.

The verdict for each problem (:func:`verdicts`), stated before any record was read: the bootstrap ensemble's
NLL **matches or beats** the GP's when its mean paired difference over the splits is at most one standard
error of that difference (the practitioners' issue's rule); its 90% coverage is **calibrated** when within
+-0.03 of 0.9. :func:`measure` returns a JSON document; ``bootens bench --case estimator`` writes it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

from ... import metrics

__all__ = ["METHODS", "PROBLEMS", "Problem", "Scores", "make_problem", "score_mixture", "score_gaussian",
           "measure", "verdicts", "table", "verdict_table"]

METHODS = ("bootstrap", "plain", "gp", "bagged-mlp")
PROBLEMS = ("diabetes", "friedman1", "friedman3", "sinusoid-gap")
_Z90 = stats.norm.ppf(0.95)


class Problem(NamedTuple):
    """One regression problem: inputs ``x`` and labels ``y`` to split, and, for a generated problem, inputs
    far from the data ``x_far`` with their true function values ``f_far`` (``None`` for real data)."""

    name: str
    x: np.ndarray
    y: np.ndarray
    x_far: np.ndarray | None
    f_far: np.ndarray | None


def _friedman1(x: np.ndarray) -> np.ndarray:
    return (10 * np.sin(np.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4])


def _friedman3(x: np.ndarray) -> np.ndarray:
    return np.arctan((x[:, 1] * x[:, 2] - 1 / (x[:, 1] * x[:, 3])) / x[:, 0])


def _sinusoid(x: np.ndarray) -> np.ndarray:
    return np.sin(2 * x[:, 0]) + 0.3 * x[:, 0]


def make_problem(name: str, seed: int = 0, n: int = 400) -> Problem:
    """The problem ``name`` of :data:`PROBLEMS` (generated ones from ``seed``, ``n`` rows).

    ``diabetes``: scikit-learn's 442 patients, 10 inputs. ``friedman1``: scikit-learn's Friedman #1 (10 inputs
    uniform on [0, 1], 5 of them used, noise sd 1); far points have their first five inputs in [1, 1.5].
    ``friedman3``: Friedman #3 (4 inputs on scikit-learn's ranges, noise sd 0.1); far points have the first
    input 1.5 to 2 times its range's top. ``sinusoid-gap``: 1-D, ``sin(2x) + 0.3x`` observed on [-3, -1] and
    [1, 3] with noise sd ``0.05 + 0.1|x|``; far points in the gap (-0.8, 0.8) and beyond, [3.3, 4].
    """
    rng = np.random.default_rng(seed)
    if name == "diabetes":
        from sklearn.datasets import load_diabetes

        x, y = load_diabetes(return_X_y=True)
        return Problem(name, np.asarray(x, float), np.asarray(y, float), None, None)
    if name == "friedman1":
        x = rng.uniform(size=(n, 10))
        y = _friedman1(x) + rng.normal(size=n)
        far = rng.uniform(size=(200, 10))
        far[:, :5] = rng.uniform(1.0, 1.5, size=(200, 5))
        return Problem(name, x, y, far, _friedman1(far))
    if name == "friedman3":
        lo, hi = np.array([0.0, 40 * np.pi, 0.0, 1.0]), np.array([100.0, 560 * np.pi, 1.0, 11.0])
        x = lo + (hi - lo) * rng.uniform(size=(n, 4))
        y = _friedman3(x) + 0.1 * rng.normal(size=n)
        far = lo + (hi - lo) * rng.uniform(size=(200, 4))
        far[:, 0] = rng.uniform(1.5 * hi[0], 2.0 * hi[0], size=200)
        return Problem(name, x, y, far, _friedman3(far))
    if name == "sinusoid-gap":
        side = rng.choice([-1.0, 1.0], size=n)
        x = (side * rng.uniform(1.0, 3.0, size=n))[:, None]
        y = _sinusoid(x) + (0.05 + 0.1 * np.abs(x[:, 0])) * rng.normal(size=n)
        far = np.r_[np.linspace(-0.8, 0.8, 100), np.linspace(3.3, 4.0, 50), np.linspace(-4.0, -3.3, 50)][:, None]
        return Problem(name, x, y, far, _sinusoid(far))
    raise ValueError(f"unknown problem {name!r}: choose from {', '.join(PROBLEMS)}")


class Scores(NamedTuple):
    """One method on one split (see the module's note); ``far_coverage90`` is NaN for real data."""

    rmse: float
    nll: float
    coverage90: float
    far_coverage90: float


def score_mixture(y: np.ndarray, f: np.ndarray, noise_var: float, f_far: np.ndarray | None = None,
                  truth_far: np.ndarray | None = None) -> Scores:
    """Scores of the predictive ``1/k sum_i N(f_i(x), noise_var)``: ``f`` ``(k, n)`` at the test rows,
    ``f_far`` ``(k, m)`` at the far points whose true function values are ``truth_far``."""
    y = np.asarray(y, float)
    f = np.asarray(f, float)
    far = math.nan
    if f_far is not None and truth_far is not None:
        q05, q95 = np.quantile(f_far, [0.05, 0.95], axis=0)
        far = float(np.mean((truth_far >= q05) & (truth_far <= q95)))
    return Scores(metrics.rmse(y, f.mean(0)), metrics.mixture_mnll(y, f, noise_var),
                  metrics.mixture_coverage(y, f, noise_var, 0.9), far)


def score_gaussian(y: np.ndarray, mean: np.ndarray, sd: np.ndarray, mean_far: np.ndarray | None = None,
                   latent_sd_far: np.ndarray | None = None, truth_far: np.ndarray | None = None) -> Scores:
    """Scores of a Gaussian predictive ``N(mean, sd^2)`` (``sd`` with the noise); far from the data the
    function's 90% interval is ``mean_far +- 1.645 latent_sd_far``."""
    y, mean, sd = (np.asarray(a, float) for a in (y, mean, sd))
    nll = -float(np.mean(stats.norm.logpdf(y, mean, sd)))
    cover = float(np.mean(np.abs(y - mean) <= _Z90 * sd))
    far = math.nan
    if mean_far is not None and latent_sd_far is not None and truth_far is not None:
        far = float(np.mean(np.abs(truth_far - mean_far) <= _Z90 * latent_sd_far))
    return Scores(metrics.rmse(y, mean), nll, cover, far)


def _fit_ensemble(perturb: bool, seed: int, settings: dict[str, Any]) -> Callable[..., Scores]:
    from ...estimators import BootstrapEnsembleRegressor

    def run(xtr, ytr, xte, yte, far, truth):
        est = BootstrapEnsembleRegressor(**settings, perturb=perturb, random_state=seed).fit(xtr, ytr)
        f_far = None if far is None else est.predict_particles(far)
        return score_mixture(yte, est.predict_particles(xte), est.noise_var_, f_far, truth)

    return run


def _fit_gp(seed: int) -> Callable[..., Scores]:
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    def run(xtr, ytr, xte, yte, far, truth):
        mu, scale = xtr.mean(0), np.where(xtr.std(0) > 0, xtr.std(0), 1.0)
        kernel = ConstantKernel() * RBF(np.ones(xtr.shape[1])) + WhiteKernel()
        gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=2, random_state=seed)
        gp.fit((xtr - mu) / scale, ytr)
        mean, sd = gp.predict((xte - mu) / scale, return_std=True)  # sd includes the white noise
        noise = gp.kernel_.k2.noise_level * ytr.std() ** 2  # normalize_y scales by the labels' sd (ddof 0)
        mean_far = sd_far = None
        if far is not None:
            mean_far, sd_tot = gp.predict((far - mu) / scale, return_std=True)
            sd_far = np.sqrt(np.maximum(sd_tot ** 2 - noise, 0.0))
        return score_gaussian(yte, mean, sd, mean_far, sd_far, truth)

    return run


def _fit_bagged_mlp(seed: int, members: int = 10) -> Callable[..., Scores]:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    def run(xtr, ytr, xte, yte, far, truth):
        import warnings

        mu, scale = xtr.mean(0), np.where(xtr.std(0) > 0, xtr.std(0), 1.0)
        ym, ys = ytr.mean(), ytr.std() or 1.0
        z, t = (xtr - mu) / scale, (ytr - ym) / ys
        rng = np.random.default_rng(seed)
        nets, oob = [], []
        for m in range(members):
            rows = rng.integers(0, len(t), len(t))
            out = np.setdiff1d(np.arange(len(t)), rows)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                net = MLPRegressor(hidden_layer_sizes=(50,), max_iter=2000, random_state=seed * members + m)
                net = net.fit(z[rows], t[rows])
            nets.append(net)
            if out.size:
                oob.append((net.predict(z[out]) - t[out]) ** 2)
        noise = float(np.mean(np.concatenate(oob))) * ys**2
        f = np.stack([ym + ys * n.predict((xte - mu) / scale) for n in nets])
        f_far = None if far is None else np.stack([ym + ys * n.predict((far - mu) / scale) for n in nets])
        return score_mixture(yte, f, noise, f_far, truth)

    return run


def _runner(method: str, seed: int, settings: dict[str, Any]) -> Callable[..., Scores]:
    if method == "bootstrap":
        return _fit_ensemble(True, seed, settings)
    if method == "plain":
        return _fit_ensemble(False, seed, settings)
    if method == "gp":
        return _fit_gp(seed)
    if method == "bagged-mlp":
        return _fit_bagged_mlp(seed)
    raise ValueError(f"unknown method {method!r}: choose from {', '.join(METHODS)}")


def measure(problems: Sequence[str] = PROBLEMS, methods: Sequence[str] = METHODS, n_splits: int = 5,
            estimator_settings: dict[str, Any] | None = None, progress: bool = False) -> dict[str, Any]:
    """Every method of ``methods`` on ``n_splits`` random 80/20 splits (seeds 0, 1, ...) of every problem:
    one row per problem, method and split with :class:`Scores` and ``fit_s``, and :func:`verdicts` of the
    rows. ``estimator_settings`` (default none: the estimators' defaults) go to both ensembles."""
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"unknown method {m!r}: choose from {', '.join(METHODS)}")
    if n_splits < 2:
        raise ValueError(f"n_splits must be at least 2 (a standard error needs two), got {n_splits}")
    settings = dict(estimator_settings or {})
    start = time.perf_counter()
    rows = []
    todo = [(p, s, m) for p in problems for s in range(n_splits) for m in methods]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="estimator bench", unit="fit")
    problem = {p: make_problem(p) for p in problems}
    for p, s, m in todo:
        prob = problem[p]
        perm = np.random.default_rng(1000 + s).permutation(len(prob.y))
        n_test = len(perm) // 5
        te, tr = perm[:n_test], perm[n_test:]
        t0 = time.perf_counter()
        sc = _runner(m, s, settings)(prob.x[tr], prob.y[tr], prob.x[te], prob.y[te], prob.x_far, prob.f_far)
        rows.append({"problem": p, "method": m, "split": s, **sc._asdict(), "fit_s": time.perf_counter() - t0})
        if bar is not None:
            bar.set_postfix_str(f"{p} {m} split {s}")
            bar.update()
    if bar is not None:
        bar.close()
    from .. import store
    from .bench import device_info

    prov = store.provenance()
    return {"case": "estimator", "rows": rows, "verdicts": verdicts(rows), "n_splits": n_splits,
            "estimator_settings": settings, "device": device_info(prov), "provenance": prov,
            "wall_s": time.perf_counter() - start}


def verdicts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per problem: the bootstrap ensemble's mean NLL and the GP's, their mean paired difference (ours minus
    the GP's) with its standard error over the splits, ``nll_matches_gp`` (difference <= one SE), the mean 90%
    coverage and ``calibrated`` (within +-0.03 of 0.9), and the far coverage of every method present."""
    out = []
    for p in dict.fromkeys(r["problem"] for r in rows):
        by = {m: {r["split"]: r for r in rows if r["problem"] == p and r["method"] == m} for m in METHODS}
        ours = by["bootstrap"]
        entry: dict[str, Any] = {"problem": p, "n_splits": len(ours)}
        if ours:
            cov = statistics.fmean(r["coverage90"] for r in ours.values())
            entry.update(nll=statistics.fmean(r["nll"] for r in ours.values()), coverage90=cov,
                         calibrated=abs(cov - 0.9) <= 0.03)
        shared = sorted(set(ours) & set(by["gp"]))
        if len(shared) >= 2:
            d = [ours[s]["nll"] - by["gp"][s]["nll"] for s in shared]
            se = statistics.stdev(d) / math.sqrt(len(d))
            entry.update(gp_nll=statistics.fmean(by["gp"][s]["nll"] for s in shared),
                         nll_minus_gp=statistics.fmean(d), nll_minus_gp_se=se,
                         nll_matches_gp=statistics.fmean(d) <= se)
        entry["far_coverage90"] = {m: statistics.fmean(r["far_coverage90"] for r in by[m].values())
                                   for m in METHODS if by[m]}
        out.append(entry)
    return out


def table(doc: dict[str, Any]) -> Any:
    """A ``pandas.DataFrame`` of a :func:`measure` document: per problem and method, the mean and standard
    error over the splits of RMSE, NLL, 90% coverage and far coverage (``—`` for real data), and the median
    fit seconds; the methods in :data:`METHODS` order."""
    import pandas as pd

    out = []
    rows = doc["rows"]
    for p in dict.fromkeys(r["problem"] for r in rows):
        for m in METHODS:
            rr = [r for r in rows if r["problem"] == p and r["method"] == m]
            if not rr:
                continue
            entry: dict[str, Any] = {"problem": p, "method": m}
            for key, label in (("rmse", "RMSE"), ("nll", "NLL"), ("coverage90", "90% coverage"),
                               ("far_coverage90", "far coverage")):
                v = [r[key] for r in rr]
                if any(math.isnan(x) for x in v):
                    entry[label] = "—"
                    continue
                se = statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else math.nan
                entry[label] = f"{statistics.fmean(v):.3g} ± {se:.2g}"
            entry["fit s (median)"] = f"{statistics.median(r['fit_s'] for r in rr):.1f}"
            out.append(entry)
    return pd.DataFrame(out).set_index(["problem", "method"])


def verdict_table(doc: dict[str, Any]) -> Any:
    """A ``pandas.DataFrame`` of a :func:`measure` document's :func:`verdicts`: per problem, the bootstrap
    ensemble's NLL beside the GP's, their mean paired difference with its standard error, whether the goal
    "within one standard error of the GP's NLL, or better" is met, the 90% coverage and whether it lies
    within +-0.03 of 0.9, and the far coverage of the bootstrap and the plain ensemble and the GP (``—`` for
    real data)."""
    import pandas as pd

    def far(v: dict[str, float], m: str) -> str:
        x = v.get(m, math.nan)
        return "—" if math.isnan(x) else f"{x:.2f}"

    out = []
    for v in verdicts(doc["rows"]):
        entry: dict[str, Any] = {"problem": v["problem"], "splits": v["n_splits"]}
        if "nll_minus_gp" in v:
            entry.update({"NLL": f"{v['nll']:.3f}", "GP's NLL": f"{v['gp_nll']:.3f}",
                          "difference (SE)": f"{v['nll_minus_gp']:+.3f} ({v['nll_minus_gp_se']:.3f})",
                          "within 1 SE of the GP or better": "yes" if v["nll_matches_gp"] else "no"})
        if "coverage90" in v:
            entry.update({"90% coverage": f"{v['coverage90']:.3f}",
                          "within ±0.03 of 0.9": "yes" if v["calibrated"] else "no"})
        entry.update({"far coverage: bootstrap / plain / GP":
                      " / ".join(far(v["far_coverage90"], m) for m in ("bootstrap", "plain", "gp"))})
        out.append(entry)
    return pd.DataFrame(out).set_index("problem")
