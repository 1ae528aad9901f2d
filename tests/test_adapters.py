"""Networks of one's own: a plain ``apply``, Flax Linen, Flax NNX and Equinox modules as models. Each adapter
computes what its framework computes, gives every leaf its prior variance, and trains with Algorithm 1 to the
closed-form perturbed MAPs of a linear model (Section 4.1); a hidden-layer network of each trains too."""

from __future__ import annotations

import math

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree

from bootens_core import adapters, ensemble, models
from bootens_core.exact import linear

NOISE_VAR, PRIOR_VAR, D = 0.1, 0.5, 3


def _data(n: int = 25) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, D))
    return x, x @ np.array([0.7, -1.2, 0.4]) + 0.3 + math.sqrt(NOISE_VAR) * rng.normal(size=n)


class _NNXLinear(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.out = nnx.Linear(D, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(x)


class _NNXMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(D, 16, rngs=rngs)
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.hidden(x)))


def _linear_models(prior_var=PRIOR_VAR) -> dict[str, tuple[models.Model, object]]:
    """Each framework's linear model ``x w + b`` with its own forward pass ``(params, x) -> outputs``."""
    x1 = jnp.zeros((1, D))
    linen = nn.Dense(1)
    nnx_mod = _NNXLinear(nnx.Rngs(0))
    eqx_mod = eqx.nn.Linear(D, "scalar", key=jax.random.key(0))
    graphdef, _, rest = nnx.split(nnx_mod, nnx.Param, ...)
    eqx_static = eqx.partition(eqx_mod, eqx.is_inexact_array)[1]

    def own(p, x):
        return x @ p["w"] + p["b"]

    return {
        "apply": (adapters.from_apply(own, {"w": jnp.zeros(D), "b": jnp.zeros(())}, prior_var),
                  own),
        "flax-linen": (adapters.from_flax_linen(linen, x1, prior_var),
                       lambda p, x: linen.apply({"params": p}, x)[:, 0]),
        "flax-nnx": (adapters.from_flax_nnx(nnx_mod, prior_var),
                     lambda p, x: nnx.merge(graphdef, p, rest)(x)[:, 0]),
        "equinox": (adapters.from_equinox(eqx_mod, prior_var),
                    lambda p, x: jax.vmap(eqx.combine(p, eqx_static))(x)),
    }


@pytest.mark.parametrize("framework", ["apply", "flax-linen", "flax-nnx", "equinox"])
def test_adapter_computes_what_the_framework_computes(framework):
    model, own = _linear_models()[framework]
    x = jnp.asarray(_data()[0])
    params = models.prior_sample(jax.random.key(1), model)
    out = model.apply(params, x)
    assert out.shape == (x.shape[0],)
    np.testing.assert_allclose(out, own(params, x), rtol=1e-12)
    assert models.n_params(model) == D + 1
    assert all(v == PRIOR_VAR for v in jax.tree.leaves(model.prior_var))


@pytest.mark.parametrize("framework", ["apply", "flax-linen", "flax-nnx", "equinox"])
def test_linear_module_particles_are_the_closed_form_perturbed_maps(framework):
    """Every particle converges to its replicate's closed-form MAP, computed from the design matrix the
    module itself defines (its Jacobian in the flat parameters, exact for a linear model)."""
    model, _ = _linear_models()[framework]
    x, y = _data()
    opt = ensemble.optimizer("lbfgs", 1.0, linesearch="zoom")
    res = ensemble.train(jax.random.key(0), model, x, y, noise_var=NOISE_VAR, n_particles=64, opt=opt,
                         steps=60)
    flat0, unravel = ravel_pytree(models.zeros(model))
    design = np.asarray(jax.jacfwd(lambda t: model.apply(unravel(t), jnp.asarray(x)))(flat0))
    flat = jax.vmap(lambda p: ravel_pytree(p)[0])
    post = linear.posterior(design, y, NOISE_VAR, PRIOR_VAR)
    want = linear.perturbed_map(post, design, np.asarray(res.perturbation.y),
                                np.asarray(flat(res.perturbation.anchor)))
    np.testing.assert_allclose(np.asarray(flat(res.params)), want, rtol=0, atol=1e-8)


def test_layer_prior_matches_the_built_in_network():
    """Fan-in-scaled variances of a 3-16-1 network: Flax kernels ``(in, out)``, Equinox weights ``(out, in)``,
    both as :func:`models.mlp` with ``scale_by_fan_in`` gives them."""
    want = sorted(jax.tree.leaves(models.mlp(D, (16,), "tanh", weight_var=2.0, bias_var=0.3,
                                             scale_by_fan_in=True).prior_var))
    prior = adapters.layer_prior(2.0, 0.3, fan_in="flax")
    linen = adapters.from_flax_linen(nn.Sequential([nn.Dense(16), nn.tanh, nn.Dense(1)]), jnp.zeros((1, D)),
                                     prior)
    nnx_model = adapters.from_flax_nnx(_NNXMLP(nnx.Rngs(0)), prior)
    eqx_mlp = eqx.nn.MLP(D, "scalar", 16, 1, activation=jnp.tanh, key=jax.random.key(0))
    eqx_model = adapters.from_equinox(eqx_mlp, adapters.layer_prior(2.0, 0.3, fan_in="equinox"))
    for model in (linen, nnx_model, eqx_model):
        assert sorted(jax.tree.leaves(model.prior_var)) == pytest.approx(want)
    per_leaf = {"w": 0.2, "b": 0.7}
    own = adapters.from_apply(lambda p, x: x @ p["w"] + p["b"], {"w": jnp.zeros(D), "b": jnp.zeros(())},
                              per_leaf)
    assert own.prior_var == per_leaf


@pytest.mark.parametrize("framework", ["flax-linen", "flax-nnx", "equinox"])
def test_hidden_layer_networks_train(framework):
    """A 3-16-1 tanh network in each framework: Algorithm 1 lowers every particle's objective and the
    ensemble fits the data better than its prior draws."""
    prior = adapters.layer_prior(1.0, 1.0, fan_in="equinox" if framework == "equinox" else "flax")
    model = {
        "flax-linen": lambda: adapters.from_flax_linen(nn.Sequential([nn.Dense(16), nn.tanh, nn.Dense(1)]),
                                                       jnp.zeros((1, D)), prior),
        "flax-nnx": lambda: adapters.from_flax_nnx(_NNXMLP(nnx.Rngs(0)), prior),
        "equinox": lambda: adapters.from_equinox(
            eqx.nn.MLP(D, "scalar", 16, 1, activation=jnp.tanh, key=jax.random.key(0)), prior),
    }[framework]()
    x, y = _data()
    res = ensemble.train(jax.random.key(2), model, x, y, noise_var=NOISE_VAR, n_particles=8,
                         opt=ensemble.optimizer("adam", 0.02), steps=300)
    assert np.all(res.loss[-1] < res.loss[0])
    def rmse(p):
        return np.sqrt(np.mean((np.asarray(ensemble.predict(model, p, x)).mean(0) - y) ** 2))

    assert rmse(res.params) < 0.5 * rmse(res.init_params)


def test_bad_priors_and_modules_are_named():
    params = {"w": jnp.zeros(D), "b": jnp.zeros(())}
    own = lambda p, x: x @ p["w"] + p["b"]  # noqa: E731
    with pytest.raises(ValueError, match=r"prior variance of \['b'\]"):
        adapters.from_apply(own, params, {"w": 1.0, "b": -1.0})
    with pytest.raises(ValueError, match="structure"):
        adapters.from_apply(own, params, {"w": 1.0})
    with pytest.raises(ValueError, match="prior variance"):
        adapters.from_apply(own, params, lambda path, shape: math.nan)
    with pytest.raises(ValueError, match="fan_in"):
        adapters.layer_prior(fan_in="torch")
    with pytest.raises(ValueError, match="no parameters"):
        adapters.from_apply(own, {}, 1.0)

    class WithBatchNorm(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1)(nn.BatchNorm(use_running_average=True)(x))

    with pytest.raises(ValueError, match="batch_stats"):
        adapters.from_flax_linen(WithBatchNorm(), jnp.zeros((1, D)))
