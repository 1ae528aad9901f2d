"""bootens_core.models: model functions against hand-written numpy, parameter counts, and the priors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bootens_core import models

KEY = jax.random.key(0)


def _np_act(name):
    return {"relu": lambda z: np.maximum(z, 0.0), "tanh": np.tanh}[name]


def _np_mlp(params, x, activation):
    """An independent forward pass: params as a list of {"w": (a, b), "b": (b,)} numpy arrays."""
    h = np.asarray(x, float)
    if h.ndim == 1:
        h = h[:, None]
    for layer in params[:-1]:
        h = _np_act(activation)(h @ np.asarray(layer["w"]) + np.asarray(layer["b"]))
    out = h @ np.asarray(params[-1]["w"]) + np.asarray(params[-1]["b"])
    return out[:, 0] if out.shape[1] == 1 else out


@pytest.mark.parametrize("hidden", [(), (7,), (6, 5, 4)], ids=["depth0", "depth1", "depth3"])
@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("in_dim, out_dim", [(1, 1), (3, 1), (3, 2)])
def test_mlp_forward_matches_numpy(hidden, activation, in_dim, out_dim):
    model = models.mlp(in_dim, hidden, activation, out_dim=out_dim, weight_var=2.0, bias_var=0.5)
    rng = np.random.default_rng(len(hidden) * 10 + in_dim + out_dim)
    widths = [in_dim, *hidden, out_dim]
    params = [
        {"w": rng.normal(size=(a, b)), "b": rng.normal(size=b)}
        for a, b in zip(widths[:-1], widths[1:], strict=True)
    ]
    n = 11
    x = rng.normal(size=(n, in_dim) if in_dim > 1 else n)
    apply = jax.jit(model.apply)
    got = np.asarray(apply(jax.tree.map(jnp.asarray, params), jnp.asarray(x)))
    want = _np_mlp(params, x, activation)
    assert got.shape == ((n,) if out_dim == 1 else (n, out_dim))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if in_dim == 1:  # (n,) and (n, 1) inputs are the same thing
        got2 = np.asarray(apply(jax.tree.map(jnp.asarray, params), jnp.asarray(x)[:, None]))
        np.testing.assert_allclose(got2, want, rtol=1e-12, atol=1e-12)


def test_mlp_parameter_shapes_and_name():
    model = models.mlp(2, (4, 3), "tanh", out_dim=2)
    assert model.shapes == [{"w": (2, 4), "b": (4,)}, {"w": (4, 3), "b": (3,)}, {"w": (3, 2), "b": (2,)}]
    assert "2-4-3-2" in model.name and "tanh" in model.name
    assert model.features is None


@pytest.mark.parametrize(
    "model, m",
    [
        (models.mlp(1, (50, 50)), 1 * 50 + 50 + 50 * 50 + 50 + 50 * 1 + 1),  # = 2701
        # The paper's deep ReLU network: 1-D input, 8 hidden layers of 50 units, 1 output.
        (models.mlp(1, (50,) * 8, "relu"), 50 + 50 + 7 * (50 * 50 + 50) + 50 + 1),  # = 18001
        (models.mlp(4, ()), 4 + 1),
        (models.mlp(3, (5,), out_dim=2), 3 * 5 + 5 + 5 * 2 + 2),
        (models.trig_features(np.linspace(-1, 1, 17)), 17),
        (models.scalar_linear(), 1),
        (models.toy_relu(), 2),
    ],
)
def test_n_params(model, m):
    assert models.n_params(model) == m
    # Independently: the length of the flattened parameter vector of a pytree of that structure.
    zeros = jax.tree.map(np.zeros, model.shapes, is_leaf=lambda s: isinstance(s, tuple))
    assert sum(np.size(a) for a in jax.tree.leaves(zeros)) == m


def test_n_params_literal_values():
    assert models.n_params(models.mlp(1, (50, 50))) == 2701
    assert models.n_params(models.mlp(1, (50,) * 8)) == 18001


def test_ravel_round_trip():
    model = models.mlp(2, (3,))
    params = models.prior_sample(KEY, model)
    theta, unravel = models.ravel(params)
    assert theta.shape == (models.n_params(model),)
    back = unravel(theta)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_prior_var_pytree_with_fan_in_scaling():
    model = models.mlp(3, (40,), weight_var=2.0, bias_var=0.5, scale_by_fan_in=True)
    assert model.prior_var == [{"w": 2.0 / 3, "b": 0.5}, {"w": 2.0 / 40, "b": 0.5}]
    plain = models.mlp(3, (40,), weight_var=2.0, bias_var=0.5)
    assert plain.prior_var == [{"w": 2.0, "b": 0.5}, {"w": 2.0, "b": 0.5}]


def test_prior_sample_shapes_and_dtype():
    model = models.mlp(3, (4,))
    one = models.prior_sample(KEY, model)
    many = models.prior_sample(KEY, model, 6, dtype=jnp.float32)
    for shape, a, b in zip(
        jax.tree.leaves(model.shapes, is_leaf=lambda s: isinstance(s, tuple)),
        jax.tree.leaves(one),
        jax.tree.leaves(many),
        strict=True,
    ):
        assert a.shape == shape and a.dtype == jnp.float64
        assert b.shape == (6, *shape) and b.dtype == jnp.float32


def test_prior_sample_per_leaf_variances():
    """Each leaf has mean 0 and its own prior variance (fan-in scaled weights).

    Tolerance from the sample size: over N iid N(0, v) entries the sample mean has sd sqrt(v/N) and the
    (ddof=1) sample variance has sd v sqrt(2/(N-1)); we allow 5 of each (two-sided p ~ 6e-7 per check).
    """
    model = models.mlp(3, (40,), weight_var=2.0, bias_var=0.5, scale_by_fan_in=True)
    n = 4000
    draws = models.prior_sample(jax.random.key(1), model, n)
    for layer, var in zip(draws, model.prior_var, strict=True):
        for name in ("w", "b"):
            x = np.asarray(layer[name]).ravel()
            v = var[name]
            N = x.size
            assert abs(x.mean()) < 5 * np.sqrt(v / N), name
            assert abs(x.var(ddof=1) - v) < 5 * v * np.sqrt(2 / (N - 1)), (name, x.var(ddof=1), v)
    # Different leaves get different keys: the two bias leaves (same variance) are not the same draws.
    assert not np.allclose(np.asarray(draws[0]["b"][:, 0]), np.asarray(draws[1]["b"][:, 0]))


def test_prior_sample_draws_are_independent_across_particles():
    """The sample correlation between two parameters over N draws has sd ~ 1/sqrt(N)."""
    model = models.mlp(2, (3,))
    n = 4000
    theta = jax.vmap(lambda p: models.ravel(p)[0])(models.prior_sample(jax.random.key(2), model, n))
    corr = np.corrcoef(np.asarray(theta), rowvar=False)
    off = corr[~np.eye(corr.shape[0], dtype=bool)]
    assert np.max(np.abs(off)) < 5 / np.sqrt(n)


@pytest.mark.parametrize("with_mean", [False, True])
def test_prior_logpdf_matches_scipy(with_mean):
    model = models.mlp(2, (5,), weight_var=1.7, bias_var=0.3, scale_by_fan_in=True)
    k1, k2 = jax.random.split(jax.random.key(3))
    params = models.prior_sample(k1, model)
    mean = models.prior_sample(k2, model) if with_mean else None
    want = 0.0
    for i, layer in enumerate(params):
        for name in ("w", "b"):
            mu = 0.0 if mean is None else np.asarray(mean[i][name])
            want += stats.norm.logpdf(np.asarray(layer[name]), mu, np.sqrt(model.prior_var[i][name])).sum()
    got = float(models.prior_logpdf(model, params, mean))
    assert got == pytest.approx(want, rel=1e-12)


def test_trig_features():
    omega = np.array([0.3, -1.2, 2.5, 0.0, 4.1])
    model = models.trig_features(jnp.asarray(omega), prior_var=2.0)
    x = np.linspace(-3, 3, 9)
    w = np.arange(1.0, 6.0)
    Phi = np.cos(np.outer(x, omega) - np.pi / 4)
    np.testing.assert_allclose(np.asarray(model.features(jnp.asarray(x))), Phi, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(
        np.asarray(model.apply({"w": jnp.asarray(w)}, jnp.asarray(x))), Phi @ w, rtol=1e-12
    )
    np.testing.assert_allclose(
        np.asarray(model.apply({"w": jnp.asarray(w)}, jnp.asarray(x)[:, None])), Phi @ w, rtol=1e-12
    )
    assert model.shapes == {"w": (5,)} and model.prior_var == {"w": 2.0}


def test_given_features_is_the_model_on_its_features():
    omega = np.array([0.3, -1.2, 2.5])
    model = models.trig_features(jnp.asarray(omega), prior_var=2.0)
    on_phi = models.given_features(model)
    x = jnp.asarray(np.linspace(-3, 3, 7))
    w = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    np.testing.assert_allclose(np.asarray(on_phi.apply(w, model.features(x))), np.asarray(model.apply(w, x)),
                               rtol=1e-14)
    assert on_phi.shapes == model.shapes and on_phi.prior_var == model.prior_var and on_phi.features is None
    # Other features of the same number and prior: the same compiled programs.
    other = models.given_features(models.trig_features(jnp.asarray(omega + 1.0), prior_var=2.0))
    assert models.program_key(other) == models.program_key(on_phi) != models.program_key(model)
    with pytest.raises(ValueError, match="not linear in its parameters"):
        models.given_features(models.toy_relu())


def test_scalar_linear():
    model = models.scalar_linear(prior_var=0.7)
    x = np.array([-2.0, 0.0, 0.5, 3.0])
    np.testing.assert_allclose(np.asarray(model.apply({"w": jnp.array([1.5])}, jnp.asarray(x))), 1.5 * x)
    np.testing.assert_allclose(np.asarray(model.features(jnp.asarray(x))), x[:, None])
    assert model.shapes == {"w": (1,)} and model.prior_var == {"w": 0.7}


@pytest.mark.parametrize("w", [(1.0, 2.0), (-1.0, 0.5), (-0.3, -2.0), (0.0, 0.0)])
def test_toy_relu_matches_numpy(w):
    model = models.toy_relu(prior_var=1.0)
    x = np.linspace(-2, 2, 13)
    want = np.maximum(w[0] * x, 0) + np.maximum(w[1] * x, 0)
    np.testing.assert_allclose(
        np.asarray(model.apply({"w": jnp.asarray(w)}, jnp.asarray(x))), want, rtol=1e-14
    )


def test_predict_is_the_per_particle_apply():
    model = models.mlp(1, (4,), "tanh")
    params = models.prior_sample(KEY, model, 3)
    x = jnp.linspace(-1, 1, 5)
    got = np.asarray(models.predict(model, params, x))
    assert got.shape == (3, 5)
    for i in range(3):
        p_i = jax.tree.map(lambda a, i=i: a[i], params)
        np.testing.assert_allclose(got[i], np.asarray(model.apply(p_i, x)), rtol=1e-14)


def test_unknown_activation_is_named():
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        models.mlp(1, (5,), "swish")


def test_non_positive_width_raises():
    with pytest.raises(ValueError, match="positive"):
        models.mlp(1, (5, 0))


def test_template_gives_shape_dtype_structs_of_every_leaf():
    model = models.mlp(3, (4,), "relu")
    tpl = models.template(model, jnp.float32)
    leaves = jax.tree.leaves(tpl)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves)
    assert [leaf.shape for leaf in leaves] == [(4,), (3, 4), (1,), (4, 1)]  # tree order: b before w
    assert {leaf.dtype for leaf in leaves} == {np.dtype(np.float32)}
    # jax understands it: the output shape of the model from shapes alone
    out = jax.eval_shape(model.apply, tpl, jax.ShapeDtypeStruct((7, 3), jnp.float32))
    assert out.shape == (7,)
    assert models.n_params(model) == 3 * 4 + 4 + 4 + 1


def test_template_accepts_arrays_and_structs_as_shape_leaves():
    arrays = models.Model(lambda p, x: x @ p["w"], {"w": np.zeros((2, 1))}, {"w": 1.0})
    structs = arrays._replace(shapes={"w": jax.ShapeDtypeStruct((2, 1), jnp.float16)})
    for m in (arrays, structs):
        tpl = models.template(m, jnp.float32)
        assert tpl["w"].shape == (2, 1) and tpl["w"].dtype == np.float32
        zeros = models.zeros(m, jnp.float32)
        assert zeros["w"].shape == (2, 1) and not np.any(np.asarray(zeros["w"]))
    draws = models.prior_sample(KEY, structs, 5, dtype=jnp.float32)
    assert draws["w"].shape == (5, 2, 1)


def test_template_names_a_bad_shape_leaf():
    model = models.Model(lambda p, x: x, {"w": (2, -1), "b": (1,)}, {"w": 1.0, "b": 1.0})
    with pytest.raises(ValueError, match=r"model.shapes leaf \['w'\] is \(2, -1\)"):
        models.template(model)
