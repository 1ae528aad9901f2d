"""The scikit-learn estimators: scikit-learn's own estimator checks, Pipeline and GridSearchCV, the predictive
against closed forms (exact Bayesian linear regression, Gaussian-mixture quantiles and moments), and one clear
error per bad setting."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from scipy import stats
from sklearn.datasets import make_blobs
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from bootens_core.checks import DivergedParticlesError
from bootens_core.estimators import BootstrapEnsembleClassifier, BootstrapEnsembleRegressor, padded_rows
from bootens_core.exact import linear

# Small, fast settings: scikit-learn's checks fit dozens of times on data of many shapes.
# Adam rather than the default L-BFGS, whose line search compiles for seconds per data shape.
_SMALL = {"hidden_layer_sizes": (8,), "n_particles": 4, "steps": 200, "optimizer": "adam", "learning_rate": 0.05}


@parametrize_with_checks([
    BootstrapEnsembleRegressor(**_SMALL, noise_grid=(0.1, 1.0)),  # sigma^2 selected on held-out rows
    BootstrapEnsembleRegressor(**_SMALL, noise_var=0.1, perturb=False),  # the plain ensemble
    BootstrapEnsembleClassifier(**_SMALL),
])
def test_sklearn_estimator_checks(estimator, check):
    # In JAX's default 32-bit mode, as a user runs them (the rest of the suite computes in float64).
    with jax.enable_x64(False):
        check(estimator)


def _regression(n: int = 60, d: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * np.arange(1, d + 1) + 5.0  # columns on different scales, off-centre
    y = 100.0 + 20.0 * np.sin(x[:, 0]) + 3.0 * x[:, 1] + 2.0 * rng.normal(size=n)
    return x, y


def test_pipeline_and_grid_search():
    x, y = _regression()
    ens = BootstrapEnsembleRegressor(**_SMALL, noise_var=0.1)
    pipe = Pipeline([("scale", StandardScaler()), ("ens", ens)])
    search = GridSearchCV(pipe, {"ens__noise_var": [0.05, 0.5], "ens__n_particles": [2, 4]}, cv=2).fit(x, y)
    assert search.best_params_["ens__noise_var"] in (0.05, 0.5)
    assert np.isfinite(search.best_score_)
    assert search.predict(x[:5]).shape == (5,)
    xc, labels = make_blobs(80, centers=3, random_state=0)
    clf = GridSearchCV(BootstrapEnsembleClassifier(**_SMALL), {"alpha_eps": [0.01, 0.1]}, cv=2)
    clf.fit(xc, labels)
    assert clf.predict_proba(xc[:4]).shape == (4, 3)


def test_linear_model_predictive_is_the_exact_posterior():
    """With no hidden layer the network is a Bayesian linear model, whose perturbed MAPs are exact posterior
    draws (Section 4.1): the particles' mean and variance of ``f`` at test points match the closed-form
    posterior of the standardised data within Monte-Carlo error."""
    x, y = _regression(n=40, d=2, seed=1)
    noise, prior, k = 0.2, 0.5, 2000
    est = BootstrapEnsembleRegressor(hidden_layer_sizes=(), activation="identity", n_particles=k,
                                     weight_var=prior, bias_var=prior, noise_var=noise, optimizer="lbfgs",
                                     learning_rate=1.0, steps=50, random_state=0).fit(x, y)
    # The standardisation, as documented: population sd per column and of the labels.
    xm, xs, ym, ys = x.mean(0), x.std(0), y.mean(), y.std()
    design = lambda a: np.hstack([(a - xm) / xs, np.ones((a.shape[0], 1))])  # noqa: E731
    post = linear.posterior(design(x), (y - ym) / ys, noise, prior)
    x_test = np.array([[5.0, 5.0], [7.0, 1.0], [2.0, 9.0]])
    phi = design(x_test)
    mean, var = phi @ post.mean, np.einsum("ij,jk,ik->i", phi, post.cov, phi)
    f = (est.predict_particles(x_test) - ym) / ys  # (k, 3) in standardised units
    z_mean = (f.mean(0) - mean) / np.sqrt(var / k)
    z_var = (f.var(0, ddof=1) / var - 1) / math.sqrt(2 / (k - 1))  # chi-square's relative sd
    assert np.all(np.abs(z_mean) < 4.5), z_mean  # 6 statistics; P(any |z| > 4.5) < 5e-5
    assert np.all(np.abs(z_var) < 4.5), z_var
    assert est.noise_var_ == pytest.approx(noise * ys**2, rel=1e-12)
    # predict's std is the mixture's: noise plus the particles' spread, in the labels' units
    m, s = est.predict(x_test, return_std=True)
    np.testing.assert_allclose(m, ym + ys * f.mean(0), rtol=1e-12)
    np.testing.assert_allclose(s, ys * np.sqrt(noise + f.var(0)), rtol=1e-12)


@pytest.fixture(scope="module")
def fitted() -> tuple[BootstrapEnsembleRegressor, np.ndarray, np.ndarray]:
    x, y = _regression()
    return BootstrapEnsembleRegressor(**_SMALL, noise_grid=(0.03, 0.3), random_state=3).fit(x, y), x, y


def test_quantiles_are_the_mixture_quantiles(fitted):
    """The mixture CDF ``1/k sum_i Phi((q - f_i) / sigma)`` (scipy) at each returned quantile is its level."""
    est, x, _ = fitted
    levels = np.array([0.01, 0.05, 0.25, 0.5, 0.9, 0.999])
    qs = est.predict_quantiles(x[:10], levels)
    f = est.predict_particles(x[:10])
    cdf = stats.norm.cdf(qs[None], f[:, :, None], math.sqrt(est.noise_var_)).mean(0)
    np.testing.assert_allclose(cdf, np.broadcast_to(levels, cdf.shape), atol=1e-8)
    lo, hi = est.predict_interval(x[:10], 0.9)
    np.testing.assert_allclose(np.stack([lo, hi], 1), est.predict_quantiles(x[:10], (0.05, 0.95)))
    one = BootstrapEnsembleRegressor(**{**_SMALL, "n_particles": 1}, noise_var=0.1, random_state=0)
    one.fit(x, fitted[2])
    m, s = one.predict(x[:5], return_std=True)  # one particle: a Gaussian predictive
    np.testing.assert_allclose(one.predict_quantiles(x[:5], (0.1, 0.7)),
                               stats.norm.ppf([0.1, 0.7], m[:, None], s[:, None]), atol=1e-7)


def test_sample_y_has_the_predictive_moments(fitted):
    """Draws of ``sample_y``: mean and variance are the predictive's within Monte-Carlo error; without noise
    every draw is one particle's function."""
    est, x, _ = fitted
    n = 20000
    draws = est.sample_y(x[:4], n_samples=n, random_state=0)
    m, s = est.predict(x[:4], return_std=True)
    assert draws.shape == (4, n)
    assert np.all(np.abs(draws.mean(1) - m) < 4.5 * s / math.sqrt(n))
    kurt = stats.kurtosis(draws, axis=1, fisher=False)  # the variance estimate's sd: s^2 sqrt((kurt - 1) / n)
    assert np.all(np.abs(draws.var(1) - s**2) < 4.5 * s**2 * np.sqrt((kurt - 1) / n))
    f = est.predict_particles(x[:4])
    plain = est.sample_y(x[:4], n_samples=50, random_state=1, noise=False)
    assert all(np.any(np.all(np.isclose(f, col[None]), axis=1)) for col in plain.T)


def test_noise_selection_and_fitted_attributes(fitted):
    est, x, y = fitted
    assert est.validation_mnll_.shape == (2,)
    assert est.noise_var_standardised_ == (0.03, 0.3)[int(np.argmin(est.validation_mnll_))]
    assert est.noise_var_ == pytest.approx(est.noise_var_standardised_ * y.std() ** 2)
    assert est.n_particles_ == 4 and est.diverged_.shape == (4,) and not est.diverged_.any()
    assert est.loss_curve_.shape == (200, 4)
    assert est.particles_[0]["w"].shape == (4, 3, 8)


def test_same_seed_same_ensemble_other_seed_another():
    x, y = _regression()
    a = BootstrapEnsembleRegressor(**_SMALL, noise_var=0.1, random_state=5).fit(x, y).predict(x)
    b = BootstrapEnsembleRegressor(**_SMALL, noise_var=0.1, random_state=5).fit(x, y).predict(x)
    c = BootstrapEnsembleRegressor(**_SMALL, noise_var=0.1, random_state=6).fit(x, y).predict(x)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_classifier_probabilities():
    x, labels = make_blobs(90, centers=3, random_state=1)
    names = np.array(["cat", "dog", "eel"])[labels]
    clf = BootstrapEnsembleClassifier(**_SMALL, random_state=0).fit(x, names)
    assert list(clf.classes_) == ["cat", "dog", "eel"]
    p = clf.predict_proba(x)
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(p, clf.predict_proba_particles(x).mean(0), rtol=1e-12)
    lo, hi = clf.predict_proba_interval(x, 0.9)
    assert np.all((lo <= p + 1e-12) & (p <= hi + 1e-12))
    assert np.mean(clf.predict(x) == names) > 0.9
    assert clf.offset_.shape == (3,)


@pytest.mark.parametrize("setting, value, match", [
    ("hidden_layer_sizes", (8, 0), "hidden layer size"), ("hidden_layer_sizes", "wide", "hidden_layer_sizes"),
    ("activation", "swish", "activation"), ("n_particles", 0, "n_particles"),
    ("n_particles", 2.5, "n_particles"),
    ("weight_var", -1.0, "weight_var"), ("bias_var", float("nan"), "bias_var"),
    ("scale_by_fan_in", "yes", "scale_by_fan_in"), ("noise_var", 0.0, "noise_var"),
    ("noise_var", "best", "noise_var"),
    ("noise_grid", (), "noise_grid"), ("noise_grid", (0.1, -1.0), "noise_grid"),
    ("validation_fraction", 1.0, "validation_fraction"), ("optimizer", "rmsprop", "optimizer"),
    ("learning_rate", 0, "learning_rate"), ("steps", 0, "steps"), ("perturb", None, "perturb"),
])
def test_bad_setting_is_named(setting, value, match):
    x, y = _regression(n=20)
    with pytest.raises(ValueError, match=match):
        BootstrapEnsembleRegressor(**_SMALL).set_params(**{setting: value}).fit(x, y)


def test_bad_data_and_unfitted_use():
    x, y = _regression(n=20)
    est = BootstrapEnsembleRegressor(**_SMALL, noise_var=0.1)
    with pytest.raises(NotFittedError):
        est.predict(x)
    with pytest.raises(ValueError, match="NaN"):
        est.fit(np.where(np.arange(20)[:, None] == 3, np.nan, x), y)
    with pytest.raises(ValueError, match="at least 10 samples"):
        BootstrapEnsembleRegressor(**_SMALL).fit(x[:3], y[:3])
    est.fit(x, y)
    with pytest.raises(ValueError, match="3 features"):
        est.predict(x[:, :2])
    with pytest.raises(ValueError, match="quantiles"):
        est.predict_quantiles(x, (0.5, 1.0))
    with pytest.raises(ValueError, match="level"):
        est.predict_interval(x, 95)
    with pytest.raises(ValueError, match="Unknown label type"):
        BootstrapEnsembleClassifier(**_SMALL).fit(x, y)
    with pytest.raises(ValueError, match="alpha_eps"):
        BootstrapEnsembleClassifier(**_SMALL, alpha_eps=0).fit(x, y > 100)


def test_all_particles_diverged_is_one_clear_error():
    x, y = _regression(n=20)
    with pytest.raises(DivergedParticlesError, match="learning_rate"):
        BootstrapEnsembleRegressor(**{**_SMALL, "learning_rate": 1e8, "optimizer": "sgd"}, noise_var=1e-4,
                                   random_state=0).fit(x, y)


def test_some_diverged_particles_are_dropped_with_a_warning(monkeypatch):
    """A particle that diverges is left out of the predictions, named in ``diverged_``, and warned about."""
    from bootens_core import ensemble

    train = ensemble.train

    def train_with_one_nan(*args, **kwargs):
        res = train(*args, **kwargs)
        params = [{n: np.asarray(a).copy() for n, a in layer.items()} for layer in res.params]
        params[0]["w"][1] = np.nan
        return res._replace(params=params, diverged=np.arange(len(res.diverged)) == 1)

    monkeypatch.setattr(ensemble, "train", train_with_one_nan)
    x, y = _regression(n=20)
    with pytest.warns(ConvergenceWarning, match="1 of 4 particles diverged"):
        est = BootstrapEnsembleRegressor(**_SMALL, noise_var=0.1, random_state=0).fit(x, y)
    assert est.n_particles_ == 3 and est.diverged_.tolist() == [False, True, False, False]
    assert np.all(np.isfinite(est.predict(x, return_std=True)))


_README_RUN = """
import json, sys
import numpy as np
from sklearn.datasets import load_diabetes
block = sys.stdin.read()
x, y = load_diabetes(return_X_y=True)
scope = {"X": x[:350], "y": y[:350], "X_new": x[350:]}
exec(block, scope)
fitted = scope["est"]
print(json.dumps({"same": bool(np.array_equal(fitted.predict(x[350:]), scope["mean"])),
                  "ordered": bool(np.all(scope["lower"] < scope["upper"])),
                  "dtype": str(fitted.particles_[0]["w"].dtype), "kind": type(fitted).__name__}))
"""


def test_readme_five_lines(tmp_path, book_env):
    """The README's five lines, as written, in a fresh process as a user runs them (JAX's defaults: float32,
    XLA's own optimisation), on a dataset that ships with scikit-learn: the reloaded ensemble predicts what
    the fitted one did."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split("## Five lines")[1].split("```python\n")[1].split("```")[0]
    assert len(block.strip().splitlines()) == 5
    env = {k: v for k, v in book_env.items() if k != "JAX_ENABLE_X64"}
    proc = subprocess.run([sys.executable, "-c", _README_RUN], input=block, capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"same": True, "ordered": True, "dtype": "float32", "kind": "BootstrapEnsembleRegressor"}
    assert (tmp_path / "ensemble.npz").is_file()


def test_a_rows_prediction_does_not_depend_on_the_other_rows_in_float32():
    """scikit-learn's sample-order and subset invariances, to the bit, in JAX's default 32-bit mode: rows
    permuted, a prefix alone, and inputs across the block size of the prediction (``PREDICT_ROWS``). Without
    the fixed blocks, 94 of 8254 float32 predictions changed in the same kind of trials (random shapes, AMD
    EPYC): XLA:CPU sums a product in an order that depends on the matrix's shape."""
    from bootens_core.estimators import PREDICT_ROWS

    rng = np.random.default_rng(1)
    with jax.enable_x64(False):
        for width, d, n_test in ((7, 3, 20), (33, 9, PREDICT_ROWS + 37), (50, 13, 3 * PREDICT_ROWS - 1)):
            x = rng.normal(size=(40, d))
            y = x @ rng.normal(size=d) + 0.1 * rng.normal(size=40)
            est = BootstrapEnsembleRegressor(hidden_layer_sizes=(width,), n_particles=5, steps=20,
                                             optimizer="adam", noise_var=0.1).fit(x, y)
            assert est.particles_[0]["w"].dtype == np.float32
            xt = rng.normal(size=(n_test, d)) * 3.0
            mean, std = est.predict(xt, return_std=True)
            perm = rng.permutation(n_test)
            mean_p, std_p = est.predict(xt[perm], return_std=True)
            np.testing.assert_array_equal(mean_p, mean[perm])
            np.testing.assert_array_equal(std_p, std[perm])
            for m in (1, n_test // 2 + 1):
                np.testing.assert_array_equal(est.predict(xt[:m]), mean[:m])


def _own_model(in_dim: int, out_dim: int = 1):
    import jax.numpy as jnp

    from bootens_core import models

    def apply(p, x):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return h @ p["w2"] if out_dim == 1 else h @ p["w2"].reshape(-1, out_dim)

    return models.Model(apply, shapes={"w1": (in_dim, 12), "b1": (12,), "w2": (12 * out_dim,)},
                        prior_var={"w1": 1.0 / in_dim, "b1": 1.0, "w2": 1.0 / 12}, name="tanh-12")


def test_a_network_of_ones_own_keeps_selection_intervals_and_saving(tmp_path):
    from sklearn.base import clone

    from bootens_core import persist
    from bootens_core.estimators import load

    x, y = _regression()
    mine = _own_model(x.shape[1])
    est = BootstrapEnsembleRegressor(model=mine, n_particles=6, steps=60, optimizer="adam", learning_rate=0.05,
                                     noise_grid=(0.01, 0.1, 1.0), random_state=0).fit(x, y)
    assert set(est.particles_) == {"w1", "b1", "w2"} and est.particles_["w1"].shape == (6, 3, 12)
    assert est.validation_mnll_.shape == (3,) and est.noise_var_standardised_ in (0.01, 0.1, 1.0)
    lower, upper = est.predict_interval(x[:7], level=0.9)
    mean = est.predict(x[:7])
    assert np.all(lower < mean) and np.all(mean < upper)
    assert 80.0 < mean.mean() < 120.0  # in the labels' units: standardisation kept
    np.testing.assert_array_equal(clone(est).fit(x, y).predict(x), est.predict(x))
    path = est.save(tmp_path / "own.npz")
    again = load(path, model=mine)
    np.testing.assert_array_equal(again.predict(x, return_std=True), est.predict(x, return_std=True))
    with pytest.raises(persist.IncompatibleFileError, match="network of one's own .tanh-12.: pass that network"):
        load(path)
    with pytest.raises(persist.IncompatibleFileError, match="does not fit the saved particles"):
        load(path, model=_own_model(x.shape[1] + 1))
    plain = BootstrapEnsembleRegressor(**_SMALL, noise_var=0.1).fit(x, y).save(tmp_path / "plain.npz")
    with pytest.raises(persist.IncompatibleFileError, match="load it without model="):
        load(plain, model=mine)


def test_a_network_of_ones_own_equal_to_the_default_gives_the_same_ensemble():
    from bootens_core import models

    x, y = _regression()
    settings = {**_SMALL, "noise_var": 0.1, "random_state": 3}
    default = BootstrapEnsembleRegressor(**settings).fit(x, y)
    same = models.mlp(x.shape[1], (8,), "relu", weight_var=1.0, bias_var=1.0, scale_by_fan_in=True)
    own = BootstrapEnsembleRegressor(**settings, model=same).fit(x, y)
    np.testing.assert_array_equal(own.predict_particles(x), default.predict_particles(x))


def test_a_network_of_ones_own_for_classes_and_its_errors():
    from bootens_core import adapters

    xc, labels = make_blobs(60, centers=3, random_state=0)
    mine = _own_model(2, out_dim=3)
    as_apply = adapters.from_apply(mine.apply, {k: np.zeros(s) for k, s in mine.shapes.items()}, mine.prior_var)
    clf = BootstrapEnsembleClassifier(**{**_SMALL, "hidden_layer_sizes": (99,)}, model=as_apply).fit(xc, labels)
    assert clf.predict_proba(xc).shape == (60, 3) and (clf.predict(xc) == labels).mean() > 0.8
    with pytest.raises(ValueError, match=r"outputs of shape \(2, 3\); BootstrapEnsembleRegressor needs \(2,\)"):
        BootstrapEnsembleRegressor(**_SMALL, model=mine).fit(xc, labels.astype(float))
    with pytest.raises(ValueError, match="model cannot take inputs of 3 column"):
        BootstrapEnsembleClassifier(**_SMALL, model=mine).fit(np.c_[xc, xc[:, 0]], labels)
    with pytest.raises(ValueError, match="model must be a bootens_core.models.Model"):
        BootstrapEnsembleClassifier(**_SMALL, model=lambda p, x: x).fit(xc, labels)


_CACHED_FIT = """
import os, sys
from bootens_core.estimators import BootstrapEnsembleRegressor, use_compilation_cache
import numpy as np
where = use_compilation_cache(None if sys.argv[1] == "default" else sys.argv[1])
rng = np.random.default_rng(0)
x = rng.normal(size=(30, 2))
BootstrapEnsembleRegressor(hidden_layer_sizes=(4,), n_particles=3, steps=5, optimizer="adam",
                           noise_grid=(0.1, 1.0), random_state=0).fit(x, x[:, 0])
print(where)
"""


def test_the_compilation_cache_serves_a_second_process(tmp_path, book_env):
    """A second process fitting the same estimator on the same shapes compiles nothing anew: every program
    comes from the folder the first one filled (no file added)."""
    import subprocess
    import sys

    env = {k: v for k, v in book_env.items() if k != "JAX_ENABLE_X64"}
    folder = tmp_path / "jax-cache"

    def fit(arg, extra_env=None):
        proc = subprocess.run([sys.executable, "-c", _CACHED_FIT, arg], capture_output=True, text=True,
                              env={**env, **(extra_env or {})}, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    assert fit(str(folder)) == str(folder)
    first = sorted(p.name for p in folder.iterdir())
    assert len(first) > 3  # the training programs, the prediction, the random draws
    fit(str(folder))
    assert sorted(p.name for p in folder.iterdir()) == first
    xdg = tmp_path / "xdg"
    assert fit("default", {"XDG_CACHE_HOME": str(xdg)}) == str(xdg / "bootens" / "jax")


def test_padded_rows():
    assert [padded_rows(n) for n in (1, 8, 9, 20, 64, 65, 282, 283, 353, 1000)] == [
        8, 8, 16, 24, 64, 72, 288, 288, 384, 1024]
    assert all(n <= padded_rows(n) <= 1.125 * n for n in range(64, 5000))
    with pytest.raises(ValueError, match="at least one row"):
        padded_rows(0)


def test_the_validation_fits_and_the_final_fit_share_one_program():
    """With ``noise_var="auto"`` the fits on the training part (validation rows unobserved) and the final fit
    on every row train on the same padded rows: one compiled training loop for all of them, and a fit on a few
    rows fewer (a grid search's next fold) adds none."""
    from bootens_core.ensemble import drivers

    def loops() -> int:  # the training loops compiled so far, one per program key and data shape
        return sum(fn._cache_size() for fn in drivers._RUNNERS._store.values())

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(70, 3)), rng.normal(size=70)
    est = BootstrapEnsembleRegressor(hidden_layer_sizes=(7,), n_particles=3, steps=5, noise_grid=(0.1, 0.3, 1.0),
                                     random_state=0)
    before = loops()
    est.fit(x, y)
    assert loops() == before + 1
    est.fit(x[:66], y[:66])
    assert loops() == before + 1 and padded_rows(66) == padded_rows(70)


def test_the_classifier_pads_its_rows_too():
    """The classifier trains on the padded rows as well: a fit of a few rows fewer adds no training loop, and
    the padding changes nothing but rounding (its particles against a fit of ``classification.train`` on the
    rows alone)."""
    from bootens_core.ensemble import drivers

    def loops() -> int:
        return sum(fn._cache_size() for fn in drivers._RUNNERS._store.values())

    x, y = make_blobs(n_samples=70, centers=2, n_features=3, random_state=1)
    est = BootstrapEnsembleClassifier(hidden_layer_sizes=(7,), n_particles=3, steps=5, random_state=0)
    before = loops()
    est.fit(x, y)
    assert loops() == before + 1
    est.fit(x[:66], y[:66])
    assert loops() == before + 1
