"""The library as a user meets it: a model written by hand, trained through public names only, checked
against the closed-form answer; the init/step kernel in a loop of one's own; and no global JAX setting
changed by importing the package."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bootens_core import ensemble, models
from bootens_core.exact import linear

NOISE_VAR, PRIOR_VAR = 0.1, 0.5


def _user_linear_model() -> models.Model:
    """What a user writes: a plain ``apply(params, x)`` and a prior variance per leaf."""

    def apply(params, x):
        return x @ params["w"] + params["b"]

    return models.Model(apply=apply, shapes={"w": (3,), "b": ()}, prior_var={"w": PRIOR_VAR, "b": PRIOR_VAR})


def _data(n: int = 25) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 3))
    y = x @ np.array([0.7, -1.2, 0.4]) + 0.3 + np.sqrt(NOISE_VAR) * rng.normal(size=n)
    return x, y


def _design(x: np.ndarray) -> np.ndarray:
    """The user model as a linear model in (w, b): the exact reference's design matrix."""
    return np.hstack([x, np.ones((x.shape[0], 1))])


def _flat(params) -> np.ndarray:
    return np.hstack([np.asarray(params["w"]), np.asarray(params["b"])[:, None]])


def test_user_model_particles_are_the_closed_form_perturbed_maps():
    """Algorithm 1 on a hand-written linear model: every particle converges to its replicate's closed-form
    MAP (Section 4.1), and the particles' mean is the exact posterior mean within Monte-Carlo error."""
    x, y = _data()
    model = _user_linear_model()
    k = 400
    opt = ensemble.optimizer("lbfgs", 1.0, linesearch="zoom")
    res = ensemble.train(jax.random.key(0), model, x, y, noise_var=NOISE_VAR, n_particles=k, opt=opt, steps=60)

    Phi = _design(x)
    post = linear.posterior(Phi, y, NOISE_VAR, PRIOR_VAR)
    want = linear.perturbed_map(post, Phi, np.asarray(res.perturbation.y), _flat(res.perturbation.anchor))
    got = _flat(res.params)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-8)

    se = np.sqrt(np.diag(post.cov) / k)  # the exact posterior's spread over k independent draws
    z = (got.mean(0) - post.mean) / se
    assert np.all(np.abs(z) < 4.5), z  # 4 coordinates; P(any |z| > 4.5) < 3e-5 under the theorem


def test_kernel_loop_matches_train():
    """``init`` then ``step`` in a Python loop (room for early stopping or a validation metric) takes the
    same steps as ``train``."""
    x, y = _data()
    model = _user_linear_model()
    opt = ensemble.optimizer("adam", 0.05)
    key = jax.random.key(1)
    res = ensemble.train(key, model, x, y, noise_var=NOISE_VAR, n_particles=16, opt=opt, steps=30)

    state = ensemble.init(key, model, jnp.asarray(y), jnp.asarray(NOISE_VAR), 16, opt)
    step = jax.jit(functools.partial(ensemble.step, model=model, opt=opt, x=jnp.asarray(x), noise_var=NOISE_VAR))
    losses = []
    for _ in range(30):
        state, info = step(state)
        losses.append(info.loss)
    assert int(state.step) == 30
    assert info.loss.shape == (16,)
    np.testing.assert_allclose(_flat(state.params), _flat(res.params), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.stack(losses), np.asarray(res.loss), rtol=1e-9, atol=1e-12)


_NO_X64_SCRIPT = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    import jax
    before = jax.config.jax_enable_x64
    import bootens_core
    for m in pkgutil.walk_packages(bootens_core.__path__, "bootens_core."):
        importlib.import_module(m.name)
    assert jax.config.jax_enable_x64 == before, "importing the package changed jax_enable_x64"
    assert before is False

    import numpy as np
    from bootens_core import ensemble, models
    from bootens_core.repro import config
    model = models.mlp(1, (4,))
    x = np.linspace(-1, 1, 10)
    opt = ensemble.optimizer("adam", 0.01)
    res = ensemble.train(jax.random.key(0), model, x, x, noise_var=0.1, n_particles=3, opt=opt, steps=2)
    assert res.params[0]["w"].dtype == np.float32, res.params[0]["w"].dtype
    try:
        ensemble.train(jax.random.key(0), model, x, x, noise_var=0.1, n_particles=3, opt=opt, steps=2,
                       dtype=np.float64)
    except ValueError as e:
        assert "64-bit mode" in str(e), e
    else:
        raise AssertionError("float64 without the 64-bit mode did not raise")
    try:
        config.require_x64("univariate")
    except RuntimeError as e:
        assert "jax_enable_x64" in str(e), e
    else:
        raise AssertionError("require_x64 did not raise")
    print("ok")
    """
)


def test_import_changes_no_jax_setting():
    """In a fresh process: importing every module leaves ``jax_enable_x64`` off; the library then computes
    in float32, refuses float64 with an error naming the mode, and the experiments refuse to run."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", _NO_X64_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


@pytest.mark.parametrize("bad", ["int32", "nonsense"])
def test_float_dtype_rejects_non_floats(bad):
    with pytest.raises(ValueError, match="dtype"):
        models.float_dtype(bad)


def test_float_dtype_follows_the_mode():
    assert models.float_dtype() == jnp.float64  # the test suite runs with the mode on (conftest)
    with jax.enable_x64(False):
        assert models.float_dtype() == jnp.float32
        with pytest.raises(ValueError, match="64-bit mode"):
            models.float_dtype(jnp.float64)
