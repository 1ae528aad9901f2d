"""bootens_core.baselines.dropout (MC dropout on Gal's UCI protocol) against independent numpy computations, binomial
Monte-Carlo error bounds and the data mirror's grid files.

Statistical checks use ``|z| < 4`` for a z-score whose standard error is the exact binomial one (a false alarm
about once in 16,000 runs; the keys are fixed, so a run is deterministic anyway).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

from bootens_core import metrics
from bootens_core.baselines import dropout
from bootens_core.repro import harness

Z_MAX = 4.0
F64 = jnp.float64

# The data mirror, found as tests/data/test_uci.py finds it.
_BESIDE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"
MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(_BESIDE)
needs_mirror = pytest.mark.skipif(
    not Path(MIRROR).is_dir() and not os.environ.get("CI"), reason=f"no UCI mirror at {MIRROR}"
)


def np_forward(params, x, keep, p):
    """Independent numpy forward pass: inverted dropout before every dense layer, ReLU hidden layers."""
    h = np.asarray(x, float)
    for i, (layer, k) in enumerate(zip(params, keep, strict=True)):
        h = np.where(np.asarray(k), h / (1 - p), 0.0) @ np.asarray(layer["w"]) + np.asarray(layer["b"])
        if i < len(params) - 1:
            h = np.maximum(h, 0.0)
    return h[:, 0]


def np_gal_ll(y, y_hat, tau):
    """Gal's test log-likelihood per point, written out from the protocol (original units)."""
    T = y_hat.shape[0]
    return logsumexp(-0.5 * tau * (y[None] - y_hat) ** 2, axis=0) - np.log(T) - 0.5 * np.log(2 * np.pi) \
        + 0.5 * np.log(tau)


def random_params(rng, sizes):
    return [{"w": jnp.asarray(rng.normal(size=(a, b))), "b": jnp.asarray(rng.normal(size=b))}
            for a, b in zip(sizes[:-1], sizes[1:], strict=True)]


# ----------------------------------------------------------------------------- 1. weight decay and loss


def test_weight_decay_formula():
    # Boston's fit part: N = int(0.8 * 455) = 364 rows, p = 0.05, tau = 0.1.
    assert dropout.weight_decay(0.05, 0.1, 364) == pytest.approx(1e-4 * 0.95 / (2 * 364 * 0.1), rel=1e-15)
    assert dropout.weight_decay(0.05, 0.1, 364) == pytest.approx(1.3049450549450549e-06, rel=1e-12)
    got = dropout.weight_decay(np.array([0.0, 0.5]), np.array([2.0, 4.0]), 10, lengthscale=0.1)
    np.testing.assert_allclose(got, [0.01 / 40, 0.005 / 80], rtol=1e-15)


def test_loss_equals_numpy_mse_plus_decay_of_weights_only():
    rng = np.random.default_rng(0)
    params = random_params(rng, [3, 7, 7, 1])  # non-zero biases: a decay on them would show
    x, y = rng.normal(size=(11, 3)), rng.normal(size=11)
    keep = [rng.random((11, d)) > 0.3 for d in (3, 7, 7)]
    p, reg = 0.3, 0.0123
    f = np_forward(params, x, keep, p)
    decay = sum(np.sum(np.asarray(layer["w"]) ** 2) for layer in params)
    want = np.mean((y - f) ** 2) + reg * decay
    got = dropout.loss(params, jnp.asarray(x), jnp.asarray(y), [jnp.asarray(k) for k in keep], p, reg)
    assert float(got) == pytest.approx(want, rel=1e-12)
    # a padded partial batch: the mean runs over the real rows only
    w = (np.arange(11) < 6).astype(float)
    want6 = np.mean((y[:6] - f[:6]) ** 2) + reg * decay
    got6 = dropout.loss(params, jnp.asarray(x), jnp.asarray(y), [jnp.asarray(k) for k in keep], p, reg,
                        jnp.asarray(w))
    assert float(got6) == pytest.approx(want6, rel=1e-12)


# One synthetic regression (1 input, 300 rows, batches of 32: 9 full ones and a partial one of 12), shared by
# the training tests so that they share one compiled program.
N_TRAIN, WIDTH, EPOCHS, BATCH = 300, 50, 150, 32


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(8)
    x = rng.uniform(-3, 3, size=(N_TRAIN, 1))
    y = np.sin(x[:, 0]) + 0.1 * rng.normal(size=N_TRAIN)
    return x, (y - y.mean()) / y.std()


def test_training_loss_covers_every_row_once_per_epoch_with_a_partial_last_batch(regression):
    """With p = 0 and a step size of 1e-15 the parameters do not move, so each epoch's loss (batch losses
    weighted by batch size, as Keras reports it) is the full-data MSE plus the decay with N = 300. Padding
    rows counted, or the partial batch dropped, would change it."""
    x, y = regression
    params = dropout.init(jax.random.PRNGKey(3), 1, 1, WIDTH, F64)
    tau = 1e-5  # a large decay, so that it counts in the loss: reg = 1e-4 / (2 * 300 * 1e-5)
    res = dropout.train(jax.random.PRNGKey(4), params, x, y, dropout=0.0, tau=tau, epochs=EPOCHS,
                        batch_size=BATCH, lr=1e-15)
    reg = 1e-4 / (2 * N_TRAIN * tau)
    ones = [np.ones((N_TRAIN, 1)), np.ones((N_TRAIN, WIDTH))]
    want = np.mean((y - np_forward(params, x, ones, 0.0)) ** 2) \
        + reg * sum(np.sum(np.asarray(layer["w"]) ** 2) for layer in params)
    assert res.loss.shape == (EPOCHS,)
    np.testing.assert_allclose(res.loss, want, rtol=1e-10)


# ------------------------------------------------------------------------------------------ 2. masks


def test_kept_fraction_is_one_minus_p():
    p, n = 0.3, 4000
    params = dropout.init(jax.random.PRNGKey(0), 5, 1, 20, F64)
    keep = dropout.dropout_masks(jax.random.PRNGKey(1), params, n, p)
    assert [k.shape for k in keep] == [(n, 5), (n, 20)]  # inputs, then the hidden layer's output
    for k in keep:
        m = k.size
        z = (float(np.mean(k)) - (1 - p)) / math.sqrt(p * (1 - p) / m)
        assert abs(z) < Z_MAX, z


# Mask tests and the p = 0 test share one program: 1 -> 10 -> 1, 5 rows, 20000 passes.
T_MASK, ROWS, HIDDEN = 20000, 5, 10


def test_inputs_and_hidden_units_are_dropped_and_kept_ones_scaled_by_one_over_keep_prob():
    """x = 1, W1 = 1, b1 = 0, W2 = 1, b2 = 0: the hidden units are h_j = keep_x / (1 - p) and the output is
    f = keep_x K / (1 - p)^2 with keep_x ~ Bernoulli(1 - p) (the input's mask) and K ~ Bin(10, 1 - p) (the
    hidden units' masks before the output layer). So f (1 - p)^2 must be an integer (exact 1/(1-p) scaling
    at both layers), positive with probability (1 - p)(1 - p^10) (inputs dropped), of mean E[K | K > 0]."""
    p = 0.2
    params = [{"w": jnp.ones((1, HIDDEN), F64), "b": jnp.zeros(HIDDEN, F64)},
              {"w": jnp.ones((HIDDEN, 1), F64), "b": jnp.zeros(1, F64)}]
    f = np.asarray(dropout.predict(jax.random.PRNGKey(2), params, np.ones((ROWS, 1)), p, T_MASK)).ravel()
    k = f * (1 - p) ** 2
    np.testing.assert_allclose(k, np.round(k), atol=1e-12)
    assert set(np.unique(np.round(k))) <= set(range(HIDDEN + 1))
    m = f.size
    q = (1 - p) * (1 - p**HIDDEN)
    z_in = (np.mean(k > 0.5) - q) / math.sqrt(q * (1 - q) / m)
    pos = np.round(k[k > 0.5])
    p0 = p**HIDDEN  # E[K | K > 0] and Var[K | K > 0] of a binomial
    mean_k = HIDDEN * (1 - p) / (1 - p0)
    var_k = (HIDDEN * (1 - p) * p + (HIDDEN * (1 - p)) ** 2) / (1 - p0) - mean_k**2
    z_hid = (pos.mean() - mean_k) / math.sqrt(var_k / pos.size)
    print(f"masks: z(input kept) = {z_in:.2f}, z(hidden kept) = {z_hid:.2f}")
    assert abs(z_in) < Z_MAX and abs(z_hid) < Z_MAX


def test_p_zero_is_the_deterministic_plain_mlp():
    rng = np.random.default_rng(5)
    params = random_params(rng, [1, HIDDEN, 1])
    x = rng.normal(size=(ROWS, 1))
    f = np.asarray(dropout.predict(jax.random.PRNGKey(0), params, x, 0.0, T_MASK))
    h = np.maximum(x @ np.asarray(params[0]["w"]) + np.asarray(params[0]["b"]), 0)
    plain = (h @ np.asarray(params[1]["w"]) + np.asarray(params[1]["b"]))[:, 0]
    np.testing.assert_allclose(f, np.broadcast_to(plain, f.shape), rtol=1e-13, atol=1e-13)


# ------------------------------------------------------------------------ 3. Gal's log-likelihood


def test_gal_log_likelihood_is_minus_the_harness_mnll_through_the_prediction_mapping():
    rng = np.random.default_rng(6)
    T, n, y_mean, y_std, tau = 500, 40, 22.5, 9.19, 0.15
    f_std = rng.normal(size=(T, n)) * 0.3 + rng.normal(size=n)  # MC outputs on standardised labels
    y_std_units = rng.normal(size=n)
    y_orig, yhat_orig = y_std_units * y_std + y_mean, f_std * y_std + y_mean
    ll = np_gal_ll(y_orig, yhat_orig, tau)
    pred = metrics.Prediction(f=f_std, var=1.0 / (tau * y_std**2))
    got = harness.evaluate(y_std_units, pred, y_std)["test_mnll"]
    assert got == pytest.approx(-ll.mean(), rel=1e-12)
    np.testing.assert_allclose(dropout.gal_log_likelihood(y_orig, yhat_orig, tau), ll, rtol=1e-12)


def test_mc_scores_stream_gals_formula_over_the_predict_passes():
    """mc_scores (passes in chunks of 7: 64 = 9 x 7 + 1, the surplus masked) against Gal's formula on the
    passes of predict (one chunk of 64) with the same key: pass t depends on fold_in(key, t) only.
    (Shapes as in the fit_select tests below, so that predict compiles once.)"""
    rng = np.random.default_rng(7)
    params = dropout.init(jax.random.PRNGKey(1), 2, 1, 16, F64)
    x, y = rng.normal(size=(30, 2)), rng.normal(size=30)
    p, tau, T, key = 0.1, 2.5, 64, jax.random.PRNGKey(9)
    f = np.asarray(dropout.predict(key, params, x, p, T))
    sc = dropout.mc_scores(key, params, x, y, dropout=p, tau=tau, n_samples=T, chunk=7)
    np.testing.assert_allclose(np.asarray(sc.ll), np_gal_ll(y, f, tau), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(sc.mean), f.mean(0), rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------------------------------ 4. training


def test_training_fits_a_synthetic_regression_and_is_deterministic(regression):
    x, y = regression
    key = jax.random.PRNGKey(10)
    params = dropout.init(key, 1, 1, WIDTH, F64)
    kw = {"dropout": 0.01, "tau": 50.0, "epochs": EPOCHS, "batch_size": BATCH}
    res = dropout.train(key, params, x, y, **kw)
    f = np.asarray(dropout.predict(key, res.params, x, 0.01, 100)).mean(0)
    rmse = float(np.sqrt(np.mean((f - y) ** 2)))
    print(f"train: loss {res.loss[0]:.3f} -> {res.loss[-1]:.4f}, MC-mean RMSE {rmse:.3f} (label sd 1)")
    assert res.loss[-1] < 0.1 * res.loss[0]
    assert rmse < 0.25  # the noise alone is 0.1 / sd(sin) ~ 0.15 standardised
    again = dropout.train(key, params, x, y, **kw)
    for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(again.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = dropout.train(jax.random.PRNGKey(11), params, x, y, **kw)
    assert not np.array_equal(np.asarray(other.params[0]["w"]), np.asarray(res.params[0]["w"]))


# ---------------------------------------------------------------------------------------- 5. fit_select


def test_validation_rows_are_the_last_20_percent():
    fit, val = dropout.validation_rows(455)  # Boston's training split
    np.testing.assert_array_equal(fit, np.arange(364))
    np.testing.assert_array_equal(val, np.arange(364, 455))
    fit, val = dropout.validation_rows(41157)  # Protein's: int(0.8 n), not round
    assert fit.size == 32925 and val[0] == 32925 and val[-1] == 41156


@pytest.fixture(scope="module")
def selection():
    """A linear problem with noise sd 0.5 (precision 4) and a grid around it; small and float64."""
    rng = np.random.default_rng(12)
    n = 150
    x = rng.normal(size=(n, 2)) * [3.0, 0.5] + [1.0, -2.0]
    y = 5.0 + 0.5 * x[:, 0] - x[:, 1] + 0.5 * rng.normal(size=n)
    x_eval = rng.normal(size=(7, 2))
    kw = {"hidden_layers": 1, "width": 16, "dropout_grid": [0.01, 0.1], "tau_grid": [0.01, 4.0, 1e4],
          "epochs": 60, "batch_size": 32, "n_samples": 64, "dtype": F64}
    key = jax.random.PRNGKey(13)
    pred = dropout.fit_select(key, x, y, x_eval, **kw)
    return {"x": x, "y": y, "x_eval": x_eval, "kw": kw, "key": key, "pred": pred}


def test_fit_select_recomputed_by_hand(selection):
    """The validation log-likelihoods, the choice and the final prediction, recomputed from the public pieces:
    the first int(0.8 n) rows standardised with their own statistics, each grid pair trained alone
    (:func:`dropout.train`, not the vmapped grid), Gal's formula in numpy on the last 20%, original units."""
    x, y, kw, pred = selection["x"], selection["y"], selection["kw"], selection["pred"]
    info = pred.info
    n_fit = int(0.8 * len(y))
    assert (info["n_fit"], info["n_val"]) == (n_fit, len(y) - n_fit) == (120, 30)
    k_select, k_final = jax.random.split(selection["key"])
    k_init, k_train, k_pred = jax.random.split(k_select, 3)
    xf, yf, xv, yv = x[:n_fit], y[:n_fit], x[n_fit:], y[n_fit:]
    xm, xs, ym, ys = xf.mean(0), xf.std(0), yf.mean(), yf.std()
    params0 = dropout.init(k_init, 2, 1, 16, F64)
    pairs = [(p, t) for p in kw["dropout_grid"] for t in kw["tau_grid"]]
    grid = dropout.train_grid(k_train, params0, (xf - xm) / xs, (yf - ym) / ys, dropout=[p for p, _ in pairs],
                              tau=[t for _, t in pairs], epochs=kw["epochs"], batch_size=32)
    want = []
    for i, (p, t) in enumerate(pairs):
        alone = dropout.train(k_train, params0, (xf - xm) / xs, (yf - ym) / ys, dropout=p, tau=t,
                              epochs=kw["epochs"], batch_size=32)
        # 5c. the vmapped grid equals training this pair alone, to float round-off
        for a, b in zip(jax.tree.leaves(alone.params), jax.tree.leaves(grid.params), strict=True):
            np.testing.assert_allclose(np.asarray(b[i]), np.asarray(a), rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(grid.loss[i], alone.loss, rtol=1e-9)
        f = np.asarray(dropout.predict(k_pred, alone.params, (xv - xm) / xs, p, kw["n_samples"])) * ys + ym
        want.append(np_gal_ll(yv, f, t).mean())
    got = np.asarray(info["val_ll"]).ravel()
    print("validation ll (p outer, tau inner):", np.round(got, 3))
    np.testing.assert_allclose(got, want, rtol=1e-8)
    # 5b. the choice is the best recorded pair, and here the one at the true precision
    best = int(np.argmax(got))
    assert (info["dropout"], info["tau"]) == pairs[best]
    assert info["tau"] == 4.0
    assert pred.var == pred.noise_var == pytest.approx(1 / 4.0)
    # the final fit: all rows, the chosen pair, k_final's keys; f in the units of y
    k_init, k_train, k_pred = jax.random.split(k_final, 3)
    xm, xs, ym, ys = x.mean(0), x.std(0), y.mean(), y.std()
    final = dropout.train(k_train, dropout.init(k_init, 2, 1, 16, F64), (x - xm) / xs, (y - ym) / ys,
                          dropout=info["dropout"], tau=info["tau"], epochs=kw["epochs"], batch_size=32)
    f = np.asarray(dropout.predict(k_pred, final.params, (selection["x_eval"] - xm) / xs, info["dropout"],
                                   kw["n_samples"])) * ys + ym
    assert pred.f.shape == (kw["n_samples"], 7) and pred.diverged == 0
    np.testing.assert_allclose(pred.f, f, rtol=1e-9, atol=1e-9)


def test_fit_select_on_standardised_labels_with_y_scale(selection):
    """Labels given as (y - c) / s with y_scale = s: the same selection (tau stays in original units), f in
    the given units, var = 1 / (tau s^2); the harness's MNLL is then -mean of Gal's ll in original units."""
    x, y, kw, ref = selection["x"], selection["y"], selection["kw"], selection["pred"]
    c, s = 5.0, 2.0
    pred = dropout.fit_select(selection["key"], x, (y - c) / s, selection["x_eval"], y_scale=s, **kw)
    np.testing.assert_allclose(pred.info["val_ll"], ref.info["val_ll"], rtol=1e-9)
    assert (pred.info["dropout"], pred.info["tau"]) == (ref.info["dropout"], ref.info["tau"])
    np.testing.assert_allclose(pred.f, (ref.f - c) / s, rtol=1e-9, atol=1e-9)
    assert pred.var == pytest.approx(1 / (ref.info["tau"] * s**2), rel=1e-15)
    y_test = 5.0 + 0.5 * selection["x_eval"][:, 0] - selection["x_eval"][:, 1]
    mnll = harness.evaluate((y_test - c) / s, pred, s)["test_mnll"]
    assert mnll == pytest.approx(-np_gal_ll(y_test, ref.f, ref.info["tau"]).mean(), rel=1e-9)


# --------------------------------------------------------------------------------------- 6. grid files

# From the mirror's README, section 3 (the files as shipped).
GRIDS = {"boston": (0.1, 0.15, 0.2), "concrete": (0.025, 0.05, 0.075), "energy": (0.25, 0.5, 0.75),
         "kin8nm": (150.0, 200.0, 250.0), "naval": (30000.0, 40000.0, 50000.0), "power": (0.05, 0.1, 0.15),
         "protein": (0.025, 0.05, 0.075), "wine": (2.5, 3.0, 3.5), "yacht": (0.25, 0.5, 0.75)}


@needs_mirror
@pytest.mark.parametrize("name", sorted(GRIDS))
def test_protocol_grid_from_the_mirror(name):
    g = dropout.protocol_grid(name, MIRROR)
    assert g.dropout_rates == (0.005, 0.01, 0.05, 0.1)
    assert g.tau_values == GRIDS[name]
    assert (g.n_epochs, g.n_hidden) == ((20, 100) if name == "protein" else (40, 50))


@needs_mirror
def test_protocol_grid_reads_bootens_data_dir(monkeypatch):
    monkeypatch.setenv("BOOTENS_DATA_DIR", MIRROR)
    assert dropout.protocol_grid("boston") == dropout.ProtocolGrid((0.005, 0.01, 0.05, 0.1), (0.1, 0.15, 0.2),
                                                                   40, 50)


# ------------------------------------------------------------------------------------------- 7. errors


def test_errors():
    key = jax.random.PRNGKey(0)
    params = dropout.init(key, 2, 1, 4, F64)
    x, y = np.zeros((10, 2)), np.zeros(10)
    kw = {"dropout": 0.1, "tau": 1.0, "epochs": 1}
    bad_x = x.copy()
    bad_x[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"x contains 1 NaN/Inf value\(s\) \(rows \[3\]\)"):
        dropout.train(key, params, bad_x, y, **kw)
    with pytest.raises(ValueError, match="y contains 1 NaN/Inf"):
        dropout.train(key, params, x, np.r_[y[:-1], np.inf], **kw)
    with pytest.raises(ValueError, match=r"inputs x must have shape \(n, d\)"):
        dropout.train(key, params, x[:, 0], y, **kw)
    with pytest.raises(ValueError, match=r"labels y must be a vector"):
        dropout.train(key, params, x, y[:, None], **kw)
    with pytest.raises(ValueError, match="x has 10 rows but y has 9 labels"):
        dropout.train(key, params, x, y[:9], **kw)
    with pytest.raises(ValueError, match="x has 3 features but the network takes 2"):
        dropout.train(key, params, np.zeros((10, 3)), y, **kw)
    for p in (1.0, -0.1, 1.5, float("nan"), "a"):
        with pytest.raises(ValueError, match=r"dropout rate must (lie in|be a number in) \[0, 1\)"):
            dropout.train(key, params, x, y, **{**kw, "dropout": p})
    for tau in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="precision tau must be positive and finite"):
            dropout.train(key, params, x, y, **{**kw, "tau": tau})
    with pytest.raises(ValueError, match="epochs must be an integer >= 1"):
        dropout.train(key, params, x, y, **{**kw, "epochs": 0})
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        dropout.train(key, params, x, y, batch_size=0, **kw)
    with pytest.raises(ValueError, match="dropout and tau pair up: got 2 dropout rates and 1 taus"):
        dropout.train_grid(key, params, x, y, dropout=[0.1, 0.2], tau=[1.0], epochs=1)
    with pytest.raises(ValueError, match="n_samples must be an integer >= 1"):
        dropout.predict(key, params, x, 0.1, 0)
    with pytest.raises(ValueError, match="params must be a list of"):
        dropout.predict(key, {"w": 1}, x, 0.1, 1)
    with pytest.raises(ValueError, match=r"y_hat must have shape \(T, n\) with n = 10"):
        dropout.gal_log_likelihood(y, np.zeros((5, 9)), 1.0)

    fs = {"hidden_layers": 1, "width": 4, "dropout_grid": [0.1], "tau_grid": [1.0], "epochs": 1,
          "n_samples": 2}
    xr, yr = np.arange(20.0).reshape(10, 2), np.arange(10.0)
    with pytest.raises(ValueError, match="an empty dropout grid: nothing to select from"):
        dropout.fit_select(key, xr, yr, xr, **{**fs, "dropout_grid": []})
    with pytest.raises(ValueError, match="an empty tau grid: nothing to select from"):
        dropout.fit_select(key, xr, yr, xr, **{**fs, "tau_grid": ()})
    with pytest.raises(ValueError, match="precision tau must be positive"):
        dropout.fit_select(key, xr, yr, xr, **{**fs, "tau_grid": [1.0, 0.0]})
    with pytest.raises(ValueError, match="x_eval has 3 features but the network takes 2"):
        dropout.fit_select(key, xr, yr, np.zeros((4, 3)), **fs)
    with pytest.raises(ValueError, match="y_scale must be positive and finite"):
        dropout.fit_select(key, xr, yr, xr, y_scale=0.0, **fs)
    with pytest.raises(ValueError, match="a training split of 2 rows is too small"):
        dropout.fit_select(key, xr[:2], yr[:2], xr, **fs)
    with pytest.raises(ValueError, match="hidden_layers must be an integer >= 0"):
        dropout.fit_select(key, xr, yr, xr, **{**fs, "hidden_layers": -1})
    with pytest.raises(ValueError, match="unknown UCI dataset 'bostn'"):
        dropout.protocol_grid("bostn", MIRROR)


# ------------------------------------------------------------------------------------------ classifiers


def test_categorical_loss_is_the_softmax_cross_entropy_plus_decay():
    from scipy.special import log_softmax

    params = dropout.init(jax.random.key(0), 3, 1, 5, jnp.float64, out_dim=4)
    x = np.random.default_rng(0).normal(size=(6, 3))
    y = np.eye(4)[[0, 1, 2, 3, 0, 1]]
    keep = [jnp.ones((6, layer["w"].shape[0]), bool) for layer in params]
    f = np.asarray(dropout.forward(params, jnp.asarray(x), keep, 0.0))
    assert f.shape == (6, 4)
    decay = sum(float(jnp.sum(layer["w"] ** 2)) for layer in params)
    want = -np.mean(np.sum(y * log_softmax(f, axis=1), axis=1)) + 0.01 * decay
    got = dropout.loss(params, jnp.asarray(x), jnp.asarray(y), keep, 0.0, 0.01, likelihood="categorical")
    assert float(got) == pytest.approx(want, rel=1e-12)


def test_categorical_training_separates_classes_and_predicts_per_class():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 2))
    labels = (x[:, 0] + x[:, 1] > 0).astype(int)
    params = dropout.init(jax.random.key(1), 2, 1, 16, jnp.float32, out_dim=2)
    fit = dropout.train(jax.random.key(2), params, x, np.eye(2)[labels], dropout=0.05, tau=1.0, epochs=200,
                        likelihood="categorical")
    assert fit.loss[-1] < 0.5 * fit.loss[0]
    logits = dropout.predict(jax.random.key(3), fit.params, x, 0.05, 7)
    assert logits.shape == (7, 64, 2)
    p = np.asarray(jax.nn.softmax(logits, axis=-1).mean(0))
    assert np.mean(p.argmax(1) == labels) > 0.9


def test_categorical_labels_must_be_one_hot():
    params = dropout.init(jax.random.key(0), 2, 1, 4, out_dim=3)
    with pytest.raises(ValueError, match=r"one-hot rows of shape \(n, 3\)"):
        dropout.train(jax.random.key(1), params, np.zeros((4, 2)), np.array([0, 1, 2, 0]), dropout=0.1, tau=1.0,
                      epochs=1, likelihood="categorical")
    with pytest.raises(ValueError, match="likelihood must be"):
        dropout.train(jax.random.key(1), params, np.zeros((4, 2)), np.eye(3)[[0, 1, 2, 0]], dropout=0.1, tau=1.0,
                      epochs=1, likelihood="bernoulli")
