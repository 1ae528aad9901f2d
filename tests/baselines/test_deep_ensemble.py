"""bootens_core.baselines.deep_ensemble (deep ensembles, Lakshminarayanan et al. 2017) against scipy, independent
numpy transcriptions, finite differences, a training loop written out step by step, and a heteroscedastic toy
problem and a separable classification problem whose answers are known.

Statistical tolerances are stated where they are used; the keys are fixed, so every run is deterministic.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats
from scipy.special import log_softmax

from bootens_core.baselines import deep_ensemble as de


def np_forward(params, x):
    """Independent numpy forward pass: ReLU hidden layers, linear output."""
    h = np.asarray(x, float)
    for i, layer in enumerate(params):
        h = h @ np.asarray(layer["w"], float) + np.asarray(layer["b"], float)
        if i < len(params) - 1:
            h = np.maximum(h, 0.0)
    return h


def np_softplus(z):
    return np.logaddexp(0.0, z)


def random_params(rng, sizes):
    return [{"w": jnp.asarray(rng.normal(size=(a, b))), "b": jnp.asarray(rng.normal(size=b))}
            for a, b in itertools.pairwise(sizes)]


def np_gaussian_rows(params, x, y, min_var=de.MIN_VAR):
    out = np_forward(params, x)
    return -stats.norm.logpdf(y, loc=out[:, 0], scale=np.sqrt(np_softplus(out[:, 1]) + min_var))


def np_categorical_rows(params, x, labels):
    return -log_softmax(np_forward(params, x), axis=1)[np.arange(len(labels)), labels]


def network(ens, m):
    return jax.tree.map(lambda a: a[m], ens.params)


@pytest.fixture(scope="module")
def reg_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(23, 3))
    return x, x @ np.array([0.5, -1.0, 0.3]) + 0.2 * rng.normal(size=23)


@pytest.fixture(scope="module")
def cls_data():
    """Three Gaussian blobs in 2-D, centres about 7 apart, spread 0.7 per coordinate."""
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 4.0], [-3.5, -2.0], [3.5, -2.0]])
    labels = np.repeat(np.arange(3), 100)
    x = centres[labels] + 0.7 * rng.normal(size=(300, 2))
    return x, labels


# ------------------------------------------------------------------------------------------- losses


def test_gaussian_loss_is_the_scipy_negative_log_density():
    rng = np.random.default_rng(2)
    params = random_params(rng, [3, 6, 2])
    x, y = rng.normal(size=(17, 3)), rng.normal(size=17)
    want = np_gaussian_rows(params, x, y)
    got = de.row_losses(params, jnp.asarray(x), jnp.asarray(y), "gaussian")
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    assert float(de.loss(params, jnp.asarray(x), jnp.asarray(y))) == pytest.approx(want.mean(), rel=1e-12)
    # the elementwise helper, at a variance floor: min_var enters the variance
    mu, var = rng.normal(size=5), rng.uniform(0.1, 2.0, size=5)
    yy = rng.normal(size=5)
    np.testing.assert_allclose(np.asarray(de.gaussian_nll(mu, var, yy)),
                               -stats.norm.logpdf(yy, mu, np.sqrt(var)), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(de.row_losses(params, jnp.asarray(x), jnp.asarray(y), "gaussian", 0.5)),
                               np_gaussian_rows(params, x, y, 0.5), rtol=1e-12)
    # a padded partial batch: the mean runs over its own rows only
    w = (np.arange(17) < 6).astype(float)
    got_w = de.loss(params, jnp.asarray(x), jnp.asarray(y), weights=jnp.asarray(w))
    assert float(got_w) == pytest.approx(want[:6].mean(), rel=1e-12)


def test_categorical_loss_is_the_numpy_cross_entropy():
    rng = np.random.default_rng(3)
    params = random_params(rng, [2, 5, 4])
    x, labels = rng.normal(size=(13, 2)), rng.integers(0, 4, size=13)
    want = np_categorical_rows(params, x, labels)
    got = de.row_losses(params, jnp.asarray(x), jnp.asarray(labels), "categorical")
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    assert float(de.loss(params, jnp.asarray(x), jnp.asarray(labels), "categorical")) == pytest.approx(
        want.mean(), rel=1e-12)
    np.testing.assert_allclose(np.asarray(de.categorical_nll(np.eye(3) * 2.0, np.array([0, 2, 1]))),
                               -log_softmax(np.eye(3) * 2.0, axis=1)[[0, 1, 2], [0, 2, 1]], rtol=1e-12)


def test_init_is_glorot_uniform_with_zero_biases():
    params = de.init(jax.random.key(0), (40, 60, 2))
    w = np.asarray(params[0]["w"])
    a = math.sqrt(6 / 100)
    assert w.shape == (40, 60) and np.abs(w).max() <= a
    # U(-a, a) has variance a^2/3; 2400 draws: the sample variance's relative SE is about sqrt(0.8/2400) = 0.018
    assert w.var() == pytest.approx(a**2 / 3, rel=4 * 0.018)
    assert all(np.all(np.asarray(layer["b"]) == 0) for layer in params)
    assert params[1]["w"].shape == (60, 2) and np.abs(np.asarray(params[1]["w"])).max() <= math.sqrt(6 / 62)


# -------------------------------------------------------------------------------------- adversarial


@pytest.mark.parametrize("likelihood", ["gaussian", "categorical"])
def test_adversarial_inputs_follow_the_sign_of_finite_differences(likelihood):
    """x' = x + eps * range * sign(d loss_i / d x_i), the sign from central differences of the numpy loss."""
    rng = np.random.default_rng(4)
    params = random_params(rng, [3, 8, 2 if likelihood == "gaussian" else 3])
    x = rng.normal(size=(9, 3))
    y = rng.normal(size=9) if likelihood == "gaussian" else rng.integers(0, 3, size=9)
    rows = np_gaussian_rows if likelihood == "gaussian" else np_categorical_rows
    h = 1e-6
    grad = np.zeros_like(x)
    for d in range(3):
        e = np.zeros(3)
        e[d] = h
        grad[:, d] = (rows(params, x + e, y) - rows(params, x - e, y)) / (2 * h)
    assert np.all(np.abs(grad) > 1e-5)  # no sign is decided by round-off
    x_range, eps = np.array([1.0, 2.0, 0.5]), 0.03
    want = x + eps * x_range * np.sign(grad)
    got = de.adversarial_inputs(params, jnp.asarray(x), jnp.asarray(y), eps, jnp.asarray(x_range), likelihood)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-14)


def test_adversarial_step_on_a_known_gradient():
    """A linear mean ``mu = 2 x``, constant variance: d loss / dx = -2 (y - mu) / var, so the step moves x away
    from the label's side: down where y > mu, up where y < mu."""
    params = [{"w": jnp.array([[2.0, 0.0]]), "b": jnp.array([0.0, 0.3])}]
    x = jnp.array([[0.0], [1.0], [-1.0]])
    y = jnp.array([1.0, 2.0, -3.0])  # above, on, below the mean (2x = 0, 2, -2)
    got = de.adversarial_inputs(params, x, y, 0.1, jnp.array([4.0]))
    np.testing.assert_allclose(np.asarray(got)[:, 0], [-0.4, 1.0, -0.6], atol=1e-15)


# ----------------------------------------------------------------------------------------- training


def reference_train(key, x, y, *, sizes, epochs, batch_size, lr, eps, likelihood):
    """Network 0's training written out: Python loops over epochs and batches, the losses transcribed here,
    the adversarial inputs made by jax.grad as a separate step (constants of the update), optax's Adam."""
    n = x.shape[0]
    k_init, k_shuffle = jax.random.split(jax.random.fold_in(key, 0))
    params = de.init(k_init, sizes)
    x_range = x.max(0) - x.min(0)

    def rows_loss(p, xb, yb):
        h = xb
        for layer in p[:-1]:
            h = jnp.maximum(h @ layer["w"] + layer["b"], 0.0)
        out = h @ p[-1]["w"] + p[-1]["b"]
        if likelihood == "categorical":
            return -(out[jnp.arange(yb.size), yb] - jax.scipy.special.logsumexp(out, axis=1))
        var = jnp.logaddexp(0.0, out[:, 1]) + de.MIN_VAR
        return 0.5 * jnp.log(2 * jnp.pi * var) + 0.5 * (yb - out[:, 0]) ** 2 / var

    def objective(p, xb, yb, xa):
        plain = jnp.mean(rows_loss(p, xb, yb))
        return plain if xa is None else plain + jnp.mean(rows_loss(p, xa, yb))

    opt = optax.adam(lr)
    state = opt.init(params)
    for e in range(epochs):
        order = np.asarray(de.batch_order(jax.random.fold_in(k_shuffle, e), n))
        for j in range(0, n, batch_size):
            rows = order[j:j + batch_size]
            xb, yb = jnp.asarray(x[rows]), jnp.asarray(y[rows])
            xa = None
            if eps > 0:
                g = jax.grad(lambda z, p=params, yb=yb: jnp.sum(rows_loss(p, z, yb)))(xb)
                xa = xb + eps * x_range * jnp.sign(g)
            grads = jax.grad(objective)(params, xb, yb, xa)
            updates, state = opt.update(grads, state, params)
            params = optax.apply_updates(params, updates)
    return params


@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_training_is_the_loop_written_out(reg_data, eps):
    """Minibatches of 5 of 23 rows (the last batch has 3), 3 epochs: the vmapped scan driver takes the steps of
    the loop above. eps = 0 is plain training, not the plain loss counted twice."""
    x, y = reg_data
    key = jax.random.key(7)
    ens = de.fit(key, x, y, hidden=(6,), n_networks=2, epochs=3, batch_size=5, lr=0.01, adversarial_eps=eps)
    want = reference_train(key, x, y, sizes=(3, 6, 2), epochs=3, batch_size=5, lr=0.01, eps=eps,
                           likelihood="gaussian")
    for got_leaf, want_leaf in zip(jax.tree.leaves(network(ens, 0)), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got_leaf), np.asarray(want_leaf), rtol=1e-9, atol=1e-12)
    assert ens.loss.shape == (2, 3) and not ens.diverged.any()
    assert ens.adversarial_eps == eps
    np.testing.assert_array_equal(ens.x_range, x.max(0) - x.min(0))


def test_categorical_training_is_the_loop_written_out(cls_data):
    x, labels = cls_data
    x, labels = x[::10], labels[::10]  # 30 rows, batches of 8: the last has 6
    key = jax.random.key(8)
    ens = de.fit(key, x, labels, hidden=(4,), n_networks=1, epochs=2, batch_size=8, lr=0.01,
                 likelihood="categorical")
    want = reference_train(key, x, labels, sizes=(2, 4, 3), epochs=2, batch_size=8, lr=0.01, eps=0.01,
                           likelihood="categorical")
    for got_leaf, want_leaf in zip(jax.tree.leaves(network(ens, 0)), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got_leaf), np.asarray(want_leaf), rtol=1e-9, atol=1e-12)


def test_epoch_loss_is_the_row_mean_of_the_plain_loss(reg_data):
    """One full batch, one epoch: the recorded loss is the plain loss at the initial weights (before the
    update), whatever eps is."""
    x, y = reg_data
    key = jax.random.key(9)
    ens = de.fit(key, x, y, hidden=(5,), n_networks=2, epochs=1, batch_size=1000)
    for m in range(2):
        k_init, _ = jax.random.split(jax.random.fold_in(key, m))
        p0 = de.init(k_init, (3, 5, 2))
        assert ens.loss[m, 0] == pytest.approx(np_gaussian_rows(p0, x, y).mean(), rel=1e-12)


def test_first_networks_do_not_depend_on_the_ensemble_size(reg_data):
    x, y = reg_data
    five = de.fit(jax.random.key(3), x, y, hidden=(6,), n_networks=5, epochs=4, batch_size=10)
    three = de.fit(jax.random.key(3), x, y, hidden=(6,), n_networks=3, epochs=4, batch_size=10)
    for a, b in zip(jax.tree.leaves(five.params), jax.tree.leaves(three.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a)[:3], np.asarray(b))
    np.testing.assert_array_equal(five.loss[:3], three.loss)
    # and the networks differ from one another (own initialisation, own batch order)
    w = np.asarray(five.params[0]["w"])
    assert all(np.abs(w[i] - w[j]).max() > 1e-3 for i in range(5) for j in range(i))


def test_same_key_same_ensemble(reg_data):
    x, y = reg_data
    a = de.fit(jax.random.key(4), x, y, hidden=(6,), n_networks=3, epochs=4, batch_size=10)
    b = de.fit(jax.random.key(4), x, y, hidden=(6,), n_networks=3, epochs=4, batch_size=10)
    for la, lb in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(np.asarray(la), np.asarray(lb))
    np.testing.assert_array_equal(a.loss, b.loss)
    np.testing.assert_array_equal(de.predict(a, x)[1], de.predict(b, x)[1])


def test_float32_when_asked_and_float64_by_default(reg_data):
    x, y = reg_data
    assert de.fit(jax.random.key(0), x, y, hidden=(3,), n_networks=1, epochs=1).params[0]["w"].dtype == jnp.float64
    ens = de.fit(jax.random.key(0), x, y, hidden=(3,), n_networks=1, epochs=1, dtype=jnp.float32)
    assert ens.params[0]["w"].dtype == jnp.float32 and de.predict(ens, x)[0].dtype == np.float32


# ------------------------------------------------------------------------------------- what it learns


def test_heteroscedastic_toy_is_learned():
    """y = 2x + (0.2 + 0.3|x|) e, x ~ U(-2, 2), n = 1000, the protocol's defaults (5 networks, 50 units, lr 0.1,
    40 epochs, eps = 0.01).

    Tolerances. A network's value at x is in effect a local average of the labels near x; taking the
    neighbourhood |x' - x| < 0.25 (about 125 of the 1000 rows), the standard error of a local mean is
    sigma / sqrt(125) = 0.09 sigma and that of a local standard deviation sigma / sqrt(250) = 0.063 sigma.
    Allowed: 4 standard errors, 0.36 sigma for the ensemble mean and 25% for the networks' mean predicted sd.
    The target of the sd is the one adversarial training aims at: half of the objective sees inputs moved by
    delta = eps * range * |slope| = 0.01 * 4 * 2 = 0.08 in the direction that raises the loss, i.e. residuals
    |r| + delta, so the best variance is (sigma^2 + E(|r| + delta)^2) / 2 = sigma^2 + delta sigma sqrt(2/pi)
    + delta^2 / 2 (5-7% above sigma here). Points at |x| = 1 and 1.5, away from the kink of sigma at 0 (which a
    smooth fit rounds off) and from the data's edges. The sd at |x| = 1.5 must exceed the one at |x| = 1 (true
    ratio 1.3) on each side: the noise is learned as heteroscedastic.
    """
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, 1000)
    sigma = lambda t: 0.2 + 0.3 * np.abs(t)
    y = 2 * x + sigma(x) * rng.normal(size=1000)
    ens = de.fit(jax.random.key(5), x[:, None], y)
    assert not ens.diverged.any() and ens.loss.shape == (5, 40)
    xs = np.array([-1.5, -1.0, 1.0, 1.5])
    mu, var = de.predict(ens, xs[:, None])
    assert mu.shape == var.shape == (5, 4) and np.all(var > 0)
    s, delta = sigma(xs), 0.08
    target_sd = np.sqrt(s**2 + delta * s * np.sqrt(2 / np.pi) + delta**2 / 2)
    assert np.all(np.abs(mu.mean(0) - 2 * xs) < 0.36 * s), (mu.mean(0), 2 * xs)
    sd = np.sqrt(var).mean(0)
    assert np.all(np.abs(sd / target_sd - 1) < 0.25), (sd, target_sd)
    assert sd[0] > sd[1] and sd[3] > sd[2], sd
    # the training loss fell: the last epoch's NLL is well below the first's
    assert np.all(ens.loss[:, -1] < ens.loss[:, 0] - 0.5)


def test_separable_three_classes_are_classified(cls_data):
    """Three blobs about 7 apart with spread 0.7: each class boundary lies 5 sd from the centres, so the Bayes
    error is below 1e-6 and a learned classifier makes no mistake on 300 fresh test rows; accuracy > 0.95
    allows 15."""
    x, labels = cls_data
    ens = de.fit(jax.random.key(6), x, labels, likelihood="categorical")
    rng = np.random.default_rng(11)
    centres = np.array([[0.0, 4.0], [-3.5, -2.0], [3.5, -2.0]])
    y_test = rng.integers(0, 3, size=300)
    x_test = centres[y_test] + 0.7 * rng.normal(size=(300, 2))
    p = de.predict_proba(ens, x_test)
    assert p.shape == (5, 300, 3)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    assert np.mean(p.mean(0).argmax(1) == y_test) > 0.95
    with pytest.raises(ValueError, match="predict_proba"):
        de.predict(ens, x_test)


# ---------------------------------------------------------------------------------------- divergence


def test_divergence_is_reported_and_dropped(reg_data):
    x, y = reg_data
    boom = de.fit(jax.random.key(0), x, y, hidden=(6,), n_networks=3, epochs=2, lr=1e10, dtype=jnp.float32)
    assert boom.diverged.tolist() == [True, True, True]
    with pytest.raises(RuntimeError, match="lr = 1e\\+10"):
        de.predict(boom, x)
    ens = de.fit(jax.random.key(0), x, y, hidden=(6,), n_networks=3, epochs=2)
    mu, var = de.predict(ens, x)
    part = ens._replace(diverged=np.array([False, True, False]))
    mu2, var2 = de.predict(part, x)
    np.testing.assert_array_equal(mu2, mu[[0, 2]])
    np.testing.assert_array_equal(var2, var[[0, 2]])


# ------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"x": np.zeros(23)}, "shape \\(n, d\\)"),
        ({"x": np.zeros((0, 3)), "y": np.zeros(0)}, "no rows"),
        ({"y": np.zeros(22)}, "23 rows but y has 22"),
        ({"y": np.zeros((23, 1))}, "vector of shape"),
        ({"x": np.full((23, 3), np.nan)}, "x contains"),
        ({"y": np.r_[np.inf, np.zeros(22)]}, "y contains"),
        ({"hidden": 50}, "hidden must be a sequence"),
        ({"hidden": (50, 0)}, "hidden width"),
        ({"n_networks": 0}, "n_networks"),
        ({"n_networks": 2.0}, "n_networks"),
        ({"epochs": 0}, "epochs"),
        ({"batch_size": -1}, "batch_size"),
        ({"lr": 0.0}, "learning rate"),
        ({"lr": float("nan")}, "learning rate"),
        ({"adversarial_eps": -0.01}, "adversarial_eps"),
        ({"min_var": 0.0}, "min_var"),
        ({"likelihood": "poisson"}, "likelihood"),
        ({"n_classes": 3}, "n_classes is for"),
        ({"dtype": "int32"}, "dtype"),
        ({"likelihood": "categorical", "y": np.full(23, 0.5)}, "integer class indices"),
        ({"likelihood": "categorical", "y": np.r_[-1, np.arange(22) % 2]}, "0 .. 1"),
        ({"likelihood": "categorical", "y": np.arange(23) % 3, "n_classes": 2}, "0 .. 1"),
        ({"likelihood": "categorical", "y": np.zeros(23, int)}, "at least 2 classes"),
        ({"likelihood": "categorical", "y": np.arange(23) % 2, "n_classes": 1}, "n_classes"),
    ],
)
def test_bad_inputs_are_named(reg_data, change, match):
    x, y = reg_data
    args = {"x": x, "y": y} | change
    x_, y_ = args.pop("x"), args.pop("y")
    with pytest.raises(ValueError, match=match):
        de.fit(jax.random.key(0), x_, y_, **args)


def test_bad_prediction_inputs_are_named(reg_data):
    x, y = reg_data
    ens = de.fit(jax.random.key(0), x, y, hidden=(3,), n_networks=1, epochs=1)
    with pytest.raises(ValueError, match="2 input columns but the networks take 3"):
        de.predict(ens, x[:, :2])
    with pytest.raises(ValueError, match="x contains"):
        de.predict(ens, np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match="use deep_ensemble.predict"):
        de.predict_proba(ens, x)
    with pytest.raises(TypeError, match="DeepEnsemble"):
        de.predict(ens.params, x)
