"""The appendix's classification figure, measured against NUTS, and real datasets with calibration.

Synthetic part: a 1-D two-class problem, one hidden layer of ReLU units with two outputs. Three
distributions of classifiers on an x grid: Algorithm 1 on the Dirichlet latent regression
(:mod:`bootens_core.classification`), the plain ensemble (same latent regression, no perturbation, prior draws
as starts), and NUTS on the categorical-likelihood network with the same prior (the reference). Agreement is
the mean over the grid of |difference| of the mean probability of class 1 and of the 95% band's edges; the
reference against itself (half of its chains vs the other half) gives the statistics' noise floor.

Real part: datasets shipped with scikit-learn, stratified splits; the bootstrap ensemble, the plain
ensemble, MC dropout (softmax cross-entropy, dropout rate chosen on validation rows) and the deep ensemble
(:mod:`bootens_core.baselines.deep_ensemble`: softmax cross-entropy with adversarial training, independent
networks); accuracy, MNLL of the predictive (mean of the members' probabilities) and ECE with reliability
diagrams.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .... import classification, ensemble, samplers, metrics, models
from ....baselines import deep_ensemble, dropout
from ... import noise, store
from ...config import require_x64
from .config import ClassificationConfig
from ....data import synthetic, tabular

__all__ = ["NAME", "DESCRIPTION", "ARTEFACTS", "Config", "METHODS", "METHOD_LABELS", "Summary", "run",
           "agreement", "reference_noise", "sample_noise", "rule_statistics"]

NAME = "classification"
DESCRIPTION = "Dirichlet latent regression + Algorithm 1 vs NUTS (1-D), and real data with ECE"
ARTEFACTS = ("Appendix classification figure",)
Config = ClassificationConfig
METHODS = ("bootstrap", "plain", "mcd", "deep")
METHOD_LABELS = {"bootstrap": "Bootstrap ensemble", "plain": "Plain ensemble", "mcd": "MC dropout",
                 "deep": "Deep ensemble"}


@dataclasses.dataclass(frozen=True)
class Summary(store.TypedSummary):
    """The classification chapter in numbers: the keys of the run's ``summary.json``.

    Synthetic part: the agreement statistics of :func:`agreement` of the bootstrap ensemble (``*_vs_mcmc``) and
    of the plain ensemble (``plain_*``) with the NUTS reference, the reference against itself
    (``reference_split_*``: first half of the chains against the second), its noise unit
    (``reference_noise_*``, :func:`reference_noise`), the noise of a sample of the bootstrap ensemble's size
    drawn from it (``sample_noise_*``, :func:`sample_noise`; None when the reference holds fewer than twice as
    many draws; the rule's unit when present, :func:`.verdicts.noise_units`), its diagnostics
    (``rhat_*``, ``ess_bulk_min``, ``nuts_*``), the ``alpha_eps`` study
    (statistics per value, and the value with the smallest band difference, None without a study) and the
    setting. Real part: ``real``, per dataset the splits' metrics of each method (a nested dict read by
    :mod:`.verdicts`), and its setting (``real_*``, ``ece_bins``, ``deep_ensemble``: the deep ensemble's).
    """

    OPTIONAL = (("alpha_eps_best_band_mad",),
                ("sample_noise_prob_mad", "sample_noise_log_width", "sample_noise_n", "sample_noise_repeats"))

    prob_mad_vs_mcmc: float
    band_mad_vs_mcmc: float
    band_coverage_vs_mcmc: float
    width_ratio_vs_mcmc: float
    plain_prob_mad_vs_mcmc: float
    plain_band_mad_vs_mcmc: float
    plain_band_coverage_vs_mcmc: float
    plain_width_ratio_vs_mcmc: float
    reference_split_prob_mad: float
    reference_split_band_mad: float
    reference_split_width_ratio: float
    reference_noise_prob_mad: float
    reference_noise_log_width: float
    reference_noise_partitions: int
    rhat_max: float
    rhat_mean: float
    ess_bulk_min: float
    nuts_divergences: int
    nuts_accept_rate: float
    nuts_mean_num_steps: float
    nuts_sampler: str
    nuts_draws_total: int
    diverged_particles: int
    n_particles: int
    n_params: int
    offset: list[float]
    optimizer: str
    data: str
    prior: str
    alpha_eps: float
    alpha_eps_study: dict[str, dict[str, float]]
    real: dict[str, Any]
    real_optimizer: str
    ece_bins: int
    real_particles: int
    deep_ensemble: str
    alpha_eps_best_band_mad: float | None = None
    sample_noise_prob_mad: float | None = None
    sample_noise_log_width: float | None = None
    sample_noise_n: int | None = None
    sample_noise_repeats: int | None = None


def run(
    key: jax.Array, cfg: ClassificationConfig, *, use_cache: bool = True, force: bool = False, progress: bool = False
) -> store.Result:
    """Run both parts (module docstring).

    The result's summary holds the fields of :class:`Summary` (``Summary.of(result)`` reads it typed)."""
    require_x64("classification")
    return store.cached(NAME, key, cfg, lambda: _compute(key, cfg, progress), use_cache=use_cache, force=force)


def agreement(p_q: np.ndarray, p_ref: np.ndarray, level: float = 0.95) -> dict[str, float]:
    """Agreement of two sets of predicted probabilities ``(k, n_x)`` of one class on the same grid.

    ``prob_mad``: mean over x of |mean_q - mean_ref| (the mean gap); ``band_mad``: mean over x of the mean of
    |lower_q - lower_ref| and |upper_q - upper_ref| (central ``level`` bands); ``band_coverage``: the share of
    the reference band covered by the other one, averaged over x (1 where the reference band has no width);
    ``width_ratio``: the median over x of the band width of ``p_q`` over the reference's (points where the
    reference band has no width left out; NaN if it has none anywhere): above 1 a wider band, below 1 a
    narrower one.
    """
    p_q, p_ref = np.asarray(p_q, float), np.asarray(p_ref, float)
    if p_q.ndim != 2 or p_ref.ndim != 2 or p_q.shape[1] != p_ref.shape[1]:
        raise ValueError(f"need (k, n_x) arrays on the same grid, got {p_q.shape} and {p_ref.shape}")
    q = [50 * (1 - level), 50 * (1 + level)]
    lo_q, hi_q = np.percentile(p_q, q, axis=0)
    lo_r, hi_r = np.percentile(p_ref, q, axis=0)
    overlap = np.clip(np.minimum(hi_q, hi_r) - np.maximum(lo_q, lo_r), 0, None)
    width = hi_r - lo_r
    has_width = width > 1e-12
    cov = np.where(has_width, overlap / np.where(has_width, width, 1.0), 1.0)
    ratio = (hi_q - lo_q)[has_width] / width[has_width]
    return {
        "prob_mad": float(np.mean(np.abs(p_q.mean(0) - p_ref.mean(0)))),
        "band_mad": float(np.mean(0.5 * (np.abs(lo_q - lo_r) + np.abs(hi_q - hi_r)))),
        "band_coverage": float(np.mean(cov)),
        "width_ratio": float(np.median(ratio)) if ratio.size else float("nan"),
    }


def reference_noise(p_chains: np.ndarray, max_partitions: int = 64, level: float = 0.95) -> dict[str, float]:
    """The reference's own noise in the two statistics the agreement rule judges: the reference against
    itself.

    ``p_chains`` ``(chains >= 2, draws, n_x)``. Every split of the chains into two halves (up to
    ``max_partitions``, each unordered split once; with an odd count the last chain of the complement is left
    out) gives one half-vs-half :func:`agreement`; ``prob_mad`` is the mean of their mean gaps, ``log_width``
    the root mean square of their ``log(width_ratio)``. The same construction as the deep-ReLU chapter's
    (``deep_relu.reference_noise``). Each half holds half the draws: these leave out the ensemble's own
    sampling noise, and they over-state the noise of a comparison with the whole reference only while the
    reference holds at most about three times as many draws as the ensemble has members (then the rule errs
    towards "agrees"); :func:`sample_noise` is the unit for a longer reference.
    """
    u = noise.halves(p_chains, lambda a, b: rule_statistics(a, b, level), max_partitions, "probabilities")
    return {"prob_mad": u.mean, "log_width": u.rms, "partitions": u.repeats}


def sample_noise(p_chains: np.ndarray, n: int, repeats: int = 256, seed: int = 0,
                 each: bool = False) -> dict[str, Any]:
    """The noise of the two statistics the agreement rule judges for a sample of ``n`` classifiers: ``n`` of
    the reference's draws against the rest of them (:func:`bootens_core.repro.noise.subsets`, at least ``2 n``
    draws in all).

    ``p_chains`` ``(chains, draws, n_x)``. ``prob_mad`` is the mean over the subsets of :func:`agreement`'s mean
    gap, ``log_width`` the root mean square of its ``log(width_ratio)``: what a sample of ``n`` posterior draws
    shows against a reference of the remaining size, the sampling noise of both sides of the comparison. With
    ``each``, also the per-subset values (``prob_mad_each``, ``log_each``).
    """
    u = noise.unit(noise.pooled(p_chains, "probabilities"), n, rule_statistics, repeats, seed)
    out: dict[str, Any] = {"prob_mad": u.mean, "log_width": u.rms, "n": u.n, "repeats": u.repeats}
    if each:
        out.update(prob_mad_each=u.first, log_each=u.second)
    return out


def rule_statistics(p_q: np.ndarray, p_ref: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The two statistics of the agreement rule of ``p_q`` against ``p_ref`` (:func:`agreement`, bands at
    ``level``): the mean gap ``prob_mad`` and ``log(width_ratio)``."""
    st = agreement(p_q, p_ref, level)
    return st["prob_mad"], float(np.log(st["width_ratio"]))


def _model(cfg: ClassificationConfig, in_dim: int, n_classes: int) -> models.Model:
    return models.mlp(in_dim, (cfg.width,), "relu", out_dim=n_classes, weight_var=cfg.weight_var,
                      bias_var=cfg.bias_var, scale_by_fan_in=True)


def _optimizer(cfg: ClassificationConfig) -> ensemble.Optimizer:
    return ensemble.optimizer("lbfgs", cfg.step_size, linesearch="zoom")


def _synthetic(key: jax.Array, cfg: ClassificationConfig, progress: bool):
    k_data, k_boot, k_plain, k_init, k_nuts = jax.random.split(key, 5)
    data = synthetic.binary_1d(k_data, cfg.n_data, cfg.data_half_width)
    model = _model(cfg, 1, 2)
    x_grid = np.linspace(-cfg.x_grid_half_width, cfg.x_grid_half_width, cfg.x_grid_points)
    opt = _optimizer(cfg)

    fits = {}
    for name, k, perturb in (("bootstrap", k_boot, True), ("plain", k_plain, False)):
        fits[name] = classification.train(
            k, model, data.x, data.labels, n_particles=cfg.n_particles, opt=opt, steps=cfg.steps,
            alpha_eps=cfg.alpha_eps, perturb=perturb, on_diverged="report",
            progress=f"{name} ensemble" if progress else False,
        )
    probs = {}
    for name, fit in fits.items():
        ok = ~fit.ensemble.diverged
        params = jax.tree.map(lambda a, ok=ok: a[ok], fit.ensemble.params)
        probs[name] = classification.predict_proba(model, params, x_grid, fit.targets.offset)[:, :, 1]

    log_density, _ = classification.log_density_fn(model, data.x, data.labels)
    init = samplers.prior_starts(k_init, model, cfg.nuts.chains, jnp.float64)
    samples, info, _, accept, sampler = samplers.nuts(
        k_nuts, log_density, init, n_warmup=cfg.nuts.warmup, n_draws=cfg.nuts.draws,
        target_accept=cfg.nuts.target_accept, max_tree_depth=cfg.nuts.max_tree_depth, progress=progress,
        chain_method=cfg.nuts.chain_method,
    )
    draws = samplers.unravel_draws(model, samples)
    flat = jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), draws)
    p_nuts = classification.predict_proba(model, flat, x_grid, np.zeros(2))[:, :, 1]
    p_chains = p_nuts.reshape(cfg.nuts.chains, cfg.nuts.draws, -1)
    rhat = samplers.rhat(p_chains)
    ess = samplers.ess(p_chains, "bulk")

    agree = {name: agreement(p, p_nuts) for name, p in probs.items()}
    # Beyond the paper: how the agreement depends on alpha_eps (the bootstrap ensemble alone).
    study = {}
    for j, a in enumerate(cfg.alpha_eps_study):
        if float(a) == float(cfg.alpha_eps):
            p_a = probs["bootstrap"]
        else:
            fit = classification.train(
                jax.random.fold_in(k_boot, j + 1), model, data.x, data.labels, n_particles=cfg.n_particles, opt=opt,
                steps=cfg.steps, alpha_eps=float(a), on_diverged="report",
                progress=f"alpha_eps {a:g}" if progress else False,
            )
            ok = ~fit.ensemble.diverged
            params = jax.tree.map(lambda v, ok=ok: v[ok], fit.ensemble.params)
            p_a = classification.predict_proba(model, params, x_grid, fit.targets.offset)[:, :, 1]
        study[float(a)] = (agreement(p_a, p_nuts), p_a)
    half = cfg.nuts.chains // 2
    floor = agreement(p_chains[:half].reshape(-1, x_grid.size), p_chains[half:].reshape(-1, x_grid.size))
    noise_half = reference_noise(p_chains)
    n_kept = int((~fits["bootstrap"].ensemble.diverged).sum())
    sample = sample_noise(p_chains, n_kept) if 2 <= n_kept and 2 * n_kept <= p_nuts.shape[0] else None

    def finite(v: np.ndarray, fn) -> float:
        v = v[np.isfinite(v)]
        return float(fn(v)) if v.size else float("nan")

    boot = fits["bootstrap"]
    summary = {
        "prob_mad_vs_mcmc": agree["bootstrap"]["prob_mad"],
        "band_mad_vs_mcmc": agree["bootstrap"]["band_mad"],
        "band_coverage_vs_mcmc": agree["bootstrap"]["band_coverage"],
        "width_ratio_vs_mcmc": agree["bootstrap"]["width_ratio"],
        "plain_prob_mad_vs_mcmc": agree["plain"]["prob_mad"],
        "plain_band_mad_vs_mcmc": agree["plain"]["band_mad"],
        "plain_band_coverage_vs_mcmc": agree["plain"]["band_coverage"],
        "plain_width_ratio_vs_mcmc": agree["plain"]["width_ratio"],
        "reference_split_prob_mad": floor["prob_mad"],
        "reference_split_band_mad": floor["band_mad"],
        "reference_split_width_ratio": floor["width_ratio"],
        "reference_noise_prob_mad": noise_half["prob_mad"],
        "reference_noise_log_width": noise_half["log_width"],
        "reference_noise_partitions": noise_half["partitions"],
        **({} if sample is None else {f"sample_noise_{k}": v for k, v in sample.items()}),
        "rhat_max": finite(rhat, np.max),
        "rhat_mean": finite(rhat, np.mean),
        "ess_bulk_min": finite(ess, np.min),
        "nuts_divergences": int(np.sum(info["n_divergent"])),
        "nuts_accept_rate": float(np.mean(accept)),
        "nuts_mean_num_steps": float(np.mean(info["mean_num_steps"])),
        "nuts_sampler": sampler,
        "nuts_draws_total": int(p_nuts.shape[0]),
        "diverged_particles": int(sum(int(f.ensemble.diverged.sum()) for f in fits.values())),
        "n_particles": cfg.n_particles,
        "n_params": models.n_params(model),
        "offset": boot.targets.offset.tolist(),
        "optimizer": opt.description,
        "data": data.description,
        "prior": f"weights N(0, {cfg.weight_var:g}/fan_in), biases N(0, {cfg.bias_var:g})",
        "alpha_eps": cfg.alpha_eps,
        "alpha_eps_study": {f"{a:g}": v[0] for a, v in study.items()},
    }
    arrays: dict[str, np.ndarray] = {}
    if study:
        best = min(study, key=lambda a: study[a][0]["band_mad"])
        summary["alpha_eps_best_band_mad"] = best
        arrays["p_bootstrap_alpha_best"] = study[best][1]
        arrays["alpha_study"] = np.array(sorted(study))
        for stat in ("prob_mad", "band_mad", "band_coverage", "width_ratio"):
            arrays[f"alpha_study_{stat}"] = np.array([study[a][0][stat] for a in sorted(study)])
    arrays |= {
        "x": data.x,
        "labels": data.labels,
        "x_grid": x_grid,
        "p_true": data.prob(x_grid),
        "p_bootstrap": probs["bootstrap"],
        "p_plain": probs["plain"],
        "p_nuts": p_nuts,
        "rhat_grid": rhat,
        "latent_y": boot.targets.y + boot.targets.offset[None],
        "latent_var": boot.targets.noise_var,
        "loss_bootstrap": np.nanmean(boot.ensemble.loss, axis=1),
        "loss_plain": np.nanmean(fits["plain"].ensemble.loss, axis=1),
    }
    return arrays, summary


def _mcd_fit(key: jax.Array, cfg: ClassificationConfig, x_tr, y_tr, rates, n_classes: int):
    """MC-dropout networks fitted on ``(x_tr, y_tr)``, one per dropout rate, trained together
    (:func:`dropout.train_grid`: common initial weights, batch order and mask draws)."""
    k_init, k_train = jax.random.split(key)
    params = dropout.init(k_init, x_tr.shape[1], 1, cfg.width, jnp.float32, out_dim=n_classes)
    fit = dropout.train_grid(k_train, params, x_tr, np.eye(n_classes)[y_tr], dropout=rates, tau=[1.0] * len(rates),
                             epochs=cfg.mcd.epochs, likelihood="categorical")
    return fit.params


def _mcd_probs(key: jax.Array, params, x_eval, p: float, n_samples: int) -> np.ndarray:
    """The mean over ``n_samples`` dropout passes of the softmax, on ``x_eval``, in float64."""
    logits = dropout.predict(key, params, x_eval, p, n_samples)
    return _normalised(np.asarray(jax.nn.softmax(logits.astype(jnp.float64), axis=-1).mean(0)))


def _mcd(key: jax.Array, cfg: ClassificationConfig, s: tabular.ClassificationSplit) -> tuple[np.ndarray, float]:
    """Choose the dropout rate on the last 20% of the training rows (validation MNLL), refit on all of them."""
    k_sel, k_pred, k_fit, k_test = jax.random.split(key, 4)
    fit_rows, val_rows = dropout.validation_rows(s.y_train.size)
    rates = tuple(float(p) for p in cfg.mcd.dropout_grid)
    grid = _mcd_fit(k_sel, cfg, s.x_train[fit_rows], s.y_train[fit_rows], rates, s.n_classes)
    scores = [
        metrics.class_mnll(
            _mcd_probs(k_pred, jax.tree.map(lambda a, i=i: a[i], grid), s.x_train[val_rows], p, cfg.mcd.samples),
            s.y_train[val_rows],
        )
        for i, p in enumerate(rates)
    ]
    best = rates[int(np.argmin(scores))]
    final = jax.tree.map(lambda a: a[0], _mcd_fit(k_fit, cfg, s.x_train, s.y_train, (best,), s.n_classes))
    return _mcd_probs(k_test, final, s.x_test, best, cfg.mcd.samples), best


def _deep(key: jax.Array, cfg: ClassificationConfig, s: tabular.ClassificationSplit) -> tuple[np.ndarray, int]:
    """A deep ensemble fitted on the training rows: the mean of its networks' softmax on the test rows (float64),
    and how many networks diverged (left out of the mean)."""
    d = cfg.deep
    ens = deep_ensemble.fit(
        key, s.x_train, s.y_train, hidden=(d.width,), n_networks=d.n_networks, epochs=d.epochs,
        batch_size=d.batch_size, lr=d.lr, adversarial_eps=d.adversarial_eps, likelihood="categorical",
        n_classes=s.n_classes, dtype=jnp.dtype(cfg.real_dtype),
    )
    probs = deep_ensemble.predict_proba(ens, s.x_test)
    return np.asarray(probs, np.float64).mean(0), int(ens.diverged.sum())


def _deep_description(cfg: ClassificationConfig) -> str:
    d = cfg.deep
    return (f"{d.n_networks} networks of {d.width} ReLU units, Adam (learning rate {d.lr:g}), {d.epochs} epochs "
            f"of batches of {d.batch_size}, adversarial step {d.adversarial_eps:g} x each input's range, "
            f"{cfg.real_dtype}")


def _normalised(p: np.ndarray) -> np.ndarray:
    """Rows renormalised in float64 (float32 softmax means sum to 1 only up to round-off)."""
    p = np.asarray(p, np.float64)
    return p / p.sum(1, keepdims=True)


def _real(key: jax.Array, cfg: ClassificationConfig, progress: bool):
    from tqdm.auto import tqdm

    opt = _optimizer(cfg)
    arrays: dict[str, np.ndarray] = {}
    real: dict[str, dict] = {}
    cells = [(ds, i) for ds in cfg.datasets for i in range(cfg.n_splits)]
    bar = tqdm(cells, desc="real datasets", unit="split", disable=not progress)
    results: dict[str, dict[str, list]] = {}
    model_of: dict[tuple[int, int], models.Model] = {}  # one model per shape: compiled once, reused by splits
    for ds, i in bar:
        bar.set_postfix_str(f"{ds} split {i}")
        s = tabular.split(ds, i, seed=cfg.seed, test_fraction=cfg.test_fraction)
        k_ds = jax.random.fold_in(jax.random.fold_in(key, cfg.datasets.index(ds)), i)
        k_boot, k_plain, k_mcd = jax.random.split(k_ds, 3)
        k_deep = jax.random.fold_in(k_ds, 3)  # a fourth key; the three above stay what they were
        shape = (s.x_train.shape[1], s.n_classes)
        model = model_of.setdefault(shape, _model(cfg, *shape))
        probs, diverged = {}, 0
        for name, k, perturb in (("bootstrap", k_boot, True), ("plain", k_plain, False)):
            fit = classification.train(
                k, model, s.x_train, s.y_train, n_particles=cfg.real_particles, opt=opt, steps=cfg.real_steps,
                n_classes=s.n_classes, alpha_eps=cfg.alpha_eps, perturb=perturb, on_diverged="report",
                dtype=jnp.dtype(cfg.real_dtype),
            )
            ok = ~fit.ensemble.diverged
            diverged += int((~ok).sum())
            params = jax.tree.map(lambda a, ok=ok: a[ok], fit.ensemble.params)
            x_test = s.x_test.astype(cfg.real_dtype)
            probs[name] = classification.predict_proba(model, params, x_test, fit.targets.offset).mean(0)
        probs["mcd"], p_best = _mcd(k_mcd, cfg, s)
        probs["deep"], deep_diverged = _deep(k_deep, cfg, s)
        r = results.setdefault(ds, {"labels": [], "dropout": [], "diverged": [], "deep_diverged": [],
                                    **{m: [] for m in METHODS}})
        r["labels"].append(s.y_test)
        r["dropout"].append(p_best)
        r["diverged"].append(diverged)
        r["deep_diverged"].append(deep_diverged)
        for m in METHODS:
            p = _normalised(probs[m])
            r[m].append((p, metrics.accuracy(p, s.y_test), metrics.class_mnll(p, s.y_test),
                         metrics.ece(p, s.y_test, cfg.ece_bins)))
    for ds, r in results.items():
        entry: dict = {"n_splits": len(r["labels"]), "n_classes": int(max(int(y.max()) for y in r["labels"]) + 1),
                       "mcd_dropout_chosen": r["dropout"], "diverged_particles": int(sum(r["diverged"])),
                       "deep_diverged_networks": int(sum(r["deep_diverged"]))}
        arrays[f"{ds}_labels"] = np.concatenate(r["labels"])
        for m in METHODS:
            per = np.array([[acc, nll, e] for _, acc, nll, e in r[m]])
            arrays[f"{ds}_{m}_probs"] = np.concatenate([p for p, *_ in r[m]])
            arrays[f"{ds}_{m}_metrics"] = per
            entry[m] = {
                name: float(per[:, j].mean()) for j, name in enumerate(("accuracy", "mnll", "ece"))
            } | {
                f"{name}_std": float(per[:, j].std()) for j, name in enumerate(("accuracy", "mnll", "ece"))
            }
        real[ds] = entry
    return arrays, {"real": real, "real_optimizer": opt.description, "ece_bins": cfg.ece_bins,
                    "real_particles": cfg.real_particles, "deep_ensemble": _deep_description(cfg)}


def _compute(key: jax.Array, cfg: ClassificationConfig, progress: bool):
    k_syn, k_real = jax.random.split(key)
    arrays, summary = _synthetic(k_syn, cfg, progress)
    arrays_r, summary_r = _real(k_real, cfg, progress)
    return {**arrays, **arrays_r}, Summary(**summary, **summary_r).as_summary()
