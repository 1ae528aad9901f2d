"""``torch.optim.LBFGS`` (``bootens_core.ensemble.lbfgs.torch_lbfgs``) as an ensemble optimizer and as the UCI ensembles'
L-BFGS: one ensemble step is one outer ``.step(closure)``, the step accounting, the config's values, errors.

The references are the transformation run by hand, ``jax.vmap``-ed over the particles of the same replicates
(``ensemble.init`` with the same key), in float64.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bootens_core import ensemble, models
from bootens_core.repro import config
from bootens_core.repro.config import UCI_LBFGS_LINESEARCHES, LBFGSConfig, NetworkConfig
from bootens_core.repro.experiments.uci.config import UCIConfig
from bootens_core.repro.experiments import uci
from bootens_core.ensemble.lbfgs import TorchLBFGSState
from bootens_core.perturb import perturbed_log_joint


def _toy(n=14, d=2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = np.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.1 * rng.normal(size=n)
    return x, y


def _by_hand(key, model, x, y, noise_var, k, opt, steps):
    """``steps`` outer steps of ``opt.tx`` on every particle, vmapped, from ``ensemble.init``'s replicates."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    state = ensemble.init(key, model, y, noise_var, k, opt)
    pert = state.perturbation

    def one(params, st, p):
        def loss(q):
            return -perturbed_log_joint(model, q, x, p, noise_var)

        value, grad = jax.value_and_grad(loss)(params)
        updates, st = opt.tx.update(grad, st, params, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(params, updates), st, value

    step = jax.jit(jax.vmap(one))
    params, st, values = state.params, state.opt_state, []
    for _ in range(steps):
        params, st, v = step(params, st, pert)
        values.append(np.asarray(v))
    return params, st, np.stack(values)


def _flat(tree):
    return np.concatenate([np.asarray(a).reshape(a.shape[0], -1) for a in jax.tree.leaves(tree)], axis=1)


# --------------------------------------------------------------------------------------------------------------
# ensemble.optimizer("torch-lbfgs")


def test_torch_lbfgs_optimizer_defaults_are_torchs():
    opt = ensemble.optimizer("torch-lbfgs", 0.5)
    assert opt.needs_value and opt.iterations_per_step == 20
    assert "history 100" in opt.description and "fixed step 0.5" in opt.description
    st = opt.tx.init({"w": jnp.zeros(3)})
    assert isinstance(st, TorchLBFGSState) and st.old_dirs.shape == (100, 3)
    wolfe = ensemble.optimizer("torch-lbfgs", 1.0, max_iter=5, history_size=7, line_search_fn="strong_wolfe")
    assert wolfe.iterations_per_step == 5 and "strong Wolfe" in wolfe.description and "history 7" in wolfe.description
    # the optax optimizers: one iteration per step
    for name in ("sgd", "adagrad", "adam", "lbfgs"):
        assert ensemble.optimizer(name, 0.1).iterations_per_step == 1


def test_steps_for_counts_outer_steps():
    assert ensemble.optimizer("lbfgs", 0.5).steps_for(640) == 640
    assert ensemble.optimizer("torch-lbfgs", 0.5).steps_for(640) == 32
    assert ensemble.optimizer("torch-lbfgs", 0.5, max_iter=1).steps_for(32) == 32
    assert ensemble.optimizer("torch-lbfgs", 0.5).steps_for(0) == 0
    with pytest.raises(ValueError, match="630 iterations are not a whole number of steps.*up to 20 iterations"):
        ensemble.optimizer("torch-lbfgs", 0.5).steps_for(630)
    for bad in (-20, 2.5, True):
        with pytest.raises(ValueError, match="iterations must be a non-negative integer"):
            ensemble.optimizer("torch-lbfgs", 0.5).steps_for(bad)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"history_size": 0}, ValueError, "history_size must be a positive integer"),
        ({"max_iter": 0}, ValueError, "max_iter must be a positive integer"),
        ({"line_search_fn": "zoom"}, ValueError, "unknown line_search_fn 'zoom'"),
        ({"max_ls": -1}, ValueError, "max_ls must be None or a non-negative integer"),
        ({"memory_size": 10}, TypeError, r"optimizer 'torch-lbfgs' does not take \['memory_size'\]"),
    ],
)
def test_torch_lbfgs_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        ensemble.optimizer("torch-lbfgs", 0.5, **kwargs)


def test_torch_lbfgs_bad_learning_rate():
    with pytest.raises(ValueError, match="learning rate must be a positive finite number"):
        ensemble.optimizer("torch-lbfgs", 0.0)


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_train_with_torch_lbfgs_is_the_vmapped_transformation(line_search_fn):
    """``train(steps=s)`` = ``s`` outer steps of ``torch_lbfgs`` by hand on every particle (float64), and its
    ``loss`` is each particle's loss at the start of each outer step."""
    model = models.mlp(2, (6,), "relu")
    x, y = _toy()
    opt = ensemble.optimizer("torch-lbfgs", 0.5, max_iter=5, history_size=4, line_search_fn=line_search_fn)
    key = jax.random.key(3)
    res = ensemble.train(key, model, x, y, noise_var=0.05, n_particles=4, opt=opt, steps=3, on_diverged="report")
    params, st, values = _by_hand(key, model, x, y, 0.05, 4, opt, 3)
    assert not res.diverged.any()
    assert int(np.min(st.n_iter)) > 3  # several inner iterations per ensemble step
    want = _flat(params)
    np.testing.assert_allclose(_flat(res.params), want, rtol=0, atol=1e-9 * max(1.0, np.abs(want).max()))
    np.testing.assert_allclose(res.loss, values, rtol=1e-10)


# --------------------------------------------------------------------------------------------------------------
# UCIConfig.lbfgs.linesearch


def test_config_lbfgs_linesearch_values():
    assert UCI_LBFGS_LINESEARCHES == (None, "zoom", "torch", "torch-strong-wolfe")
    for v in UCI_LBFGS_LINESEARCHES:
        assert LBFGSConfig(linesearch=v).linesearch == v
    # the CLI passes strings verbatim: "null"/"none" are None
    assert LBFGSConfig(linesearch="null").linesearch is None
    assert LBFGSConfig(linesearch="None") == LBFGSConfig(linesearch=None)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"linesearch": "backtracking"}, "unknown L-BFGS linesearch 'backtracking'"),
        ({"linesearch": "strong_wolfe"}, "unknown L-BFGS linesearch 'strong_wolfe'"),
        ({"memory": 0}, "L-BFGS memory must be a positive integer"),
        ({"steps": 0}, "L-BFGS steps must be a positive integer"),
        ({"iters_per_step": 2.5}, "L-BFGS iters_per_step must be a positive integer"),
        ({"step_size": -0.5}, "L-BFGS step_size must be a positive finite number"),
        ({"step_size": float("nan")}, "L-BFGS step_size must be a positive finite number"),
    ],
)
def test_config_bad_lbfgs_values(changes, match):
    with pytest.raises(ValueError, match=match):
        LBFGSConfig(**changes)
    (name, value), = changes.items()
    with pytest.raises(ValueError, match=match):  # config.replace (the CLI's --set) checks too
        config.replace(UCIConfig(), f"lbfgs.{name}", value)


def test_cli_set_selects_the_torch_lbfgs():
    import argparse

    from bootens_core.repro import cli

    def configure(*sets):
        args = argparse.Namespace(profile="paper", seed=None, datasets=None, methods=None, workers=None,
                                  set=list(sets))
        return cli._configure(uci, args)

    assert configure("lbfgs.linesearch=torch", "lbfgs.memory=100").lbfgs == LBFGSConfig(linesearch="torch",
                                                                                        memory=100)
    assert configure("lbfgs.linesearch=null").lbfgs.linesearch is None
    # the flat names of earlier versions still work (results/paper/README's commands of committed records)
    assert configure("lbfgs_linesearch=torch", "lbfgs_memory=100") == configure("lbfgs.linesearch=torch",
                                                                                "lbfgs.memory=100")
    assert configure("lbfgs.nosuch=1") == 2 and configure("lbfgs=1") == 2


def test_only_the_ensembles_hashes_follow_lbfgs_linesearch():
    # the bootstrap ensemble and the plain one (the same particles and L-BFGS, unperturbed)
    base = {f: uci.experiment._family_hash(UCIConfig(), f) for f in uci.experiment._FAMILIES}
    seen = {base["ensemble"]}
    for v in (None, "torch", "torch-strong-wolfe"):
        h = {f: uci.experiment._family_hash(UCIConfig(lbfgs=LBFGSConfig(linesearch=v)), f) for f in uci.experiment._FAMILIES}
        assert {f for f in h if h[f] != base[f]} == {"ensemble", "plain"}
        seen.add(h["ensemble"])
    assert len(seen) == 4
    # torch_lbfgs's source decides the ensembles' numbers
    assert "ensemble/lbfgs.py" in uci.experiment.family_code("ensemble").files


# --------------------------------------------------------------------------------------------------------------
# the UCI ensemble cell


def _tiny_cfg(linesearch="torch"):
    return UCIConfig(n_particles=3, network=NetworkConfig(width=5, dtype="float64"),
                     lbfgs=LBFGSConfig(steps=3, iters_per_step=4, memory=6, linesearch=linesearch))


@pytest.mark.parametrize(("linesearch", "steps"), [("torch", 3), ("torch-strong-wolfe", 3), ("zoom", 12), (None, 12)])
def test_uci_ensemble_steps(monkeypatch, linesearch, steps):
    """lbfgs.steps x lbfgs.iters_per_step iterations: 3 torch outer steps of up to 4 iterations, 12 optax ones."""
    calls = []
    train = ensemble.train

    def spy(*args, **kwargs):
        calls.append((kwargs["steps"], kwargs["opt"]))
        return train(*args, **kwargs)

    monkeypatch.setattr(ensemble, "train", spy)
    cfg = _tiny_cfg(linesearch)
    x, y = _toy()
    m = uci.method("ensemble-1", cfg, "toy", x.shape[1])
    m.fit(jax.random.key(0), x, y, x, 0.1)
    (n, opt), = calls
    assert n == steps and n * opt.iterations_per_step == cfg.lbfgs.steps * cfg.lbfgs.iters_per_step
    st = opt.tx.init({"w": jnp.zeros(2)})
    if linesearch is not None and linesearch.startswith("torch"):
        assert st.old_dirs.shape[0] == cfg.lbfgs.memory  # lbfgs.memory is torch's history_size
        assert ("strong Wolfe" in opt.description) == (linesearch == "torch-strong-wolfe")


@pytest.mark.parametrize("linesearch", ["torch", "torch-strong-wolfe"])
def test_uci_ensemble_with_torch_lbfgs_equals_the_transformation_by_hand(linesearch):
    """The UCI ensemble's fit with the torch L-BFGS: the particles are ``lbfgs.steps`` outer steps of
    ``torch_lbfgs(step_size, max_iter=iters_per_step, history_size=memory)`` run by hand,
    vmapped over the particles of the same key; the predictions are theirs."""
    cfg = _tiny_cfg(linesearch)
    x, y = _toy(seed=1)
    key = jax.random.key(7)
    pred = uci.method("ensemble-1", cfg, "toy", x.shape[1]).fit(key, x, y, x, 0.05)
    net, lb = cfg.network, cfg.lbfgs
    model = models.mlp(x.shape[1], (net.width,), "relu", weight_var=net.weight_var, bias_var=net.bias_var)
    opt = ensemble.optimizer("torch-lbfgs", lb.step_size, max_iter=lb.iters_per_step, history_size=lb.memory,
                             **({"line_search_fn": "strong_wolfe", "max_ls": 25} if "wolfe" in linesearch else {}))
    params, st, _ = _by_hand(key, model, x, y, 0.05, cfg.n_particles, opt, lb.steps)
    assert np.all(np.asarray(st.n_iter) > lb.steps)  # more than one iteration per outer step
    want = np.asarray(models.predict(model, params, jnp.asarray(x)))
    assert pred.diverged == 0 and pred.f.shape == want.shape
    np.testing.assert_allclose(pred.f, want, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------------------------------------------
# lbfgs_check: the torch L-BFGS beside optax's fixed step, on one particle of a UCI cell


_MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(Path(__file__).resolve().parents[3] / "shared" / "data" / "uci")


@pytest.mark.skipif(not Path(_MIRROR).is_dir() and not os.environ.get("CI"), reason=f"no UCI mirror at {_MIRROR}")
def test_lbfgs_check_runs_the_torch_lbfgs(monkeypatch):
    monkeypatch.setenv("BOOTENS_DATA_DIR", _MIRROR)
    cfg = UCIConfig(network=NetworkConfig(width=6), lbfgs=LBFGSConfig(iters_per_step=4, memory=9))
    key = jax.random.key(0)
    r = uci.lbfgs_check(key, cfg, dataset="yacht", steps=12)
    assert r["torch"].shape == (3,) and r["torch_iters"][0] == 0
    assert np.all(np.diff(r["torch_iters"]) <= 4) and np.all(np.diff(r["torch_iters"]) >= 1)
    assert r["torch"][0] == pytest.approx(r["fixed"][0], rel=1e-12)  # the same particle, the same start
    pairs = r["torch_pairs"]
    assert pairs["stored"] + pairs["skipped"] == pairs["built"] and pairs["skipped"] >= 0
    assert 0 <= r["fixed_uphill"] <= 12 and 0 <= r["fixed_negative_pairs"] <= 11
    # the same particle through ensemble.train with the UCI ensembles' torch optimizer: the same losses
    opt = uci.experiment._lbfgs(dataclasses.replace(cfg.lbfgs, linesearch="torch"))
    from bootens_core.data import uci as uci_data

    data = uci_data.load("yacht", 0)
    net = cfg.network
    model = models.mlp(data.x_train.shape[1], (net.width,), "relu", weight_var=net.weight_var,
                       bias_var=net.bias_var, scale_by_fan_in=net.scale_by_fan_in)
    res = ensemble.train(key, model, data.x_train, data.y_train, noise_var=0.1, n_particles=1, opt=opt,
                         steps=opt.steps_for(12), on_diverged="report")
    np.testing.assert_allclose(res.loss[:, 0], r["torch"], rtol=1e-10)
