"""bootens_core.repro.config: profile selection and JSON-ready configs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bootens_core.repro import config
from bootens_core.repro.config import as_dict, for_profile, from_dict, profile
from bootens_core.repro.experiments.linear.config import LinearConfig
from bootens_core.repro.experiments.practice.config import PracticeConfig
from bootens_core.repro.experiments.classification.config import ClassificationConfig
from bootens_core.repro.experiments.deep_relu.config import DeepReluConfig
from bootens_core.repro.experiments.toy_relu.config import ToyReluConfig
from bootens_core.repro.experiments.uci.config import UCIConfig
from bootens_core.repro.experiments.univariate.config import UnivariateConfig

CONFIGS = [UnivariateConfig, LinearConfig, PracticeConfig]


def test_profile_defaults_to_quick(monkeypatch):
    monkeypatch.delenv("BOOTENS_PROFILE", raising=False)
    assert profile() == "quick"


@pytest.mark.parametrize("value, expected", [("quick", "quick"), ("paper", "paper"), (" Paper ", "paper")])
def test_profile_reads_environment(monkeypatch, value, expected):
    monkeypatch.setenv("BOOTENS_PROFILE", value)
    assert profile() == expected


def test_explicit_name_beats_environment(monkeypatch):
    monkeypatch.setenv("BOOTENS_PROFILE", "paper")
    assert profile("quick") == "quick"


def test_unknown_profile_from_environment_is_named(monkeypatch):
    monkeypatch.setenv("BOOTENS_PROFILE", "fullscale")
    with pytest.raises(ValueError, match="unknown profile 'fullscale'") as info:
        profile()
    # The message tells the user what the valid choices are and where the value came from.
    assert "quick" in str(info.value) and "paper" in str(info.value)
    assert "BOOTENS_PROFILE" in str(info.value)


def test_unknown_profile_argument_is_named():
    with pytest.raises(ValueError, match="unknown profile 'gpu'"):
        profile("gpu")


@pytest.mark.parametrize("cls", CONFIGS)
@pytest.mark.parametrize("name", config.PROFILES)
def test_for_profile_builds_that_profile(cls, name):
    cfg = for_profile(cls, name)
    assert isinstance(cfg, cls)
    assert cfg == getattr(cls, name)()


@pytest.mark.parametrize("cls", CONFIGS)
def test_for_profile_follows_environment(monkeypatch, cls):
    monkeypatch.setenv("BOOTENS_PROFILE", "paper")
    assert for_profile(cls) == cls.paper()
    monkeypatch.delenv("BOOTENS_PROFILE")
    assert for_profile(cls) == cls.quick()


@pytest.mark.parametrize("cls", CONFIGS)
def test_as_dict_is_json_ready(cls):
    cfg = cls.quick()
    d = as_dict(cfg)
    text = json.dumps(d)  # raises if anything is not JSON-able
    assert json.loads(text) == d  # and survives the round trip unchanged (tuples already became lists)
    assert set(d) == {f.name for f in dataclasses.fields(cls)}
    for f in dataclasses.fields(cls):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):  # a method's sub-configuration (e.g. PracticeConfig.deep)
            assert d[f.name] == as_dict(value) and from_dict(type(value), d[f.name]) == value
        else:
            assert d[f.name] == (list(value) if isinstance(value, tuple) else value)


@pytest.mark.parametrize("cls", CONFIGS)
def test_configs_are_frozen_and_hashable(cls):
    cfg = cls.quick()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 1  # type: ignore[misc]
    assert hash(cfg) == hash(cls.quick())
    assert dataclasses.replace(cfg, seed=cfg.seed + 1) != cfg


def test_linear_config_is_the_papers_setting():
    """Appendix 'Bayesian linear regression': D = 1024, l = 1.6, 64 points, sigma^2 = 0.1, alpha^2 = 1,
    200 particles, Adagrad 400 steps at h = 0.01, self-distance over 20 populations."""
    for cfg in (LinearConfig.quick(), LinearConfig.paper()):
        assert (cfg.n_features, cfg.lengthscale, cfg.n_data) == (1024, 1.6, 64)
        assert (cfg.noise_var, cfg.prior_var, cfg.n_particles) == (0.1, 1.0, 200)
        assert (cfg.paper_step_size, cfg.paper_steps) == (0.01, 400)
        assert cfg.n_selfdist_populations == 20
        assert cfg.paper_stages[0] == 0 and cfg.paper_stages[-1] == cfg.paper_steps
        assert cfg.stages[0] == 0 and cfg.stages[-1] == cfg.steps


def test_univariate_config_has_the_papers_particle_count():
    cfg = UnivariateConfig.quick()
    assert cfg.n_particles == 200
    assert cfg.stages[0] == 0 and cfg.stages[-1] == cfg.steps


def test_uci_profiles_use_the_line_search_and_faithful_is_torchs_lbfgs():

    assert UCIConfig.paper().lbfgs.linesearch == "zoom" and UCIConfig.quick().lbfgs.linesearch == "zoom"
    assert UCIConfig.paper().lbfgs.memory == 10
    # "32 steps, step size 0.5": torch.optim.LBFGS(lr=0.5) with torch's defaults, stepped 32 times
    f = UCIConfig.faithful()
    assert f.lbfgs.linesearch == "torch" and f.lbfgs.step_size == 0.5 and f.lbfgs.steps == 32
    assert f.lbfgs.iters_per_step == 20 and f.lbfgs.memory == 100  # torch's max_iter and history_size
    assert f.n_particles == 200 and f.network.weight_var == f.network.bias_var == 1.0
    assert not f.network.scale_by_fan_in
    # optax's fixed step: 640 iterations of optax.lbfgs(0.5, memory_size=10, linesearch=None)
    o = UCIConfig.optax_fixed_step()
    assert o.lbfgs.linesearch is None and o.lbfgs.memory == 10 and o.lbfgs.steps * o.lbfgs.iters_per_step == 640
    assert config.replace(o, "lbfgs.linesearch", "zoom") == UCIConfig.paper()


# --------------------------------------------------------------------------------------------------------------
# Nested configurations: a method's settings are one sub-configuration; names, dicts and earlier flat names


@pytest.mark.parametrize("cls", [UCIConfig, ToyReluConfig, DeepReluConfig,
                                 ClassificationConfig])
@pytest.mark.parametrize("profile", ["quick", "paper"])
def test_as_dict_round_trips_through_json(cls, profile):
    cfg = config.for_profile(cls, profile)
    d = json.loads(json.dumps(config.as_dict(cfg)))
    assert config.from_dict(cls, d) == cfg


def test_sub_configurations_are_nested_dicts():
    d = config.as_dict(UCIConfig.paper())
    assert d["lbfgs"] == {"steps": 32, "iters_per_step": 20, "step_size": 0.5, "memory": 10, "linesearch": "zoom"}
    assert d["network"]["width"] == 50 and d["sghmc"]["lr_scaling"] == "none" and d["gp"]["svgp_datasets"] == [
        "protein"]
    assert config.as_dict(DeepReluConfig.paper())["nuts"]["max_tree_depth"] == 10
    assert config.as_dict(ClassificationConfig.paper())["mcd"] == {
        "dropout_grid": [0.005, 0.01, 0.05, 0.1, 0.2], "epochs": 500, "samples": 10_000}
    assert config.from_dict(ClassificationConfig, {"mcd_samples": 7}).mcd.epochs == 500


def test_the_flat_names_of_earlier_versions_read_back():
    """A config.json written before the sub-configurations (flat names) gives the same configuration: every
    committed UCI record reads as the paper's settings it was made with."""
    flat = {
        "seed": 0, "n_particles": 200, "width": 50, "weight_var": 1.0, "bias_var": 1.0, "scale_by_fan_in": False,
        "dtype": "float32", "lbfgs_steps": 32, "lbfgs_iters_per_step": 20, "lbfgs_step_size": 0.5,
        "lbfgs_memory": 100, "lbfgs_linesearch": "torch", "gp_max_iter": 1000, "svgp_datasets": ["protein"],
        "n_inducing": 400, "mcd_epochs_x": 100, "mcd_samples": 10000, "sghmc_lr": 0.001, "sghmc_thin": 2000,
        "sghmc_lr_scaling": "sqrt_lr", "noise_grid": [1e-4, 1.0],
    }
    cfg = config.from_dict(UCIConfig, flat)
    faithful = UCIConfig.faithful()
    assert cfg == dataclasses.replace(faithful, noise_grid=(1e-4, 1.0),
                                      sghmc=dataclasses.replace(faithful.sghmc, lr_scaling="sqrt_lr"))
    assert config.from_dict(DeepReluConfig, {"mh_burn_in": 7, "nuts_chains": 3}) == dataclasses.replace(
        DeepReluConfig(), mh=dataclasses.replace(DeepReluConfig().mh, burn_in=7),
        nuts=dataclasses.replace(DeepReluConfig().nuts, chains=3))
    root = Path(__file__).resolve().parents[2] / "results" / "paper"
    for name in ("uci", "uci-mcd-sghmc", "uci-fixed-step"):
        stored = json.loads((root / name / "config.json").read_text())
        got = config.from_dict(UCIConfig, stored)
        assert got.network == config.NetworkConfig(**{k: stored.get(k, v) for k, v in
                                                      config.as_dict(config.NetworkConfig()).items()})


def test_names_resolve_get_and_replace():
    cfg = UCIConfig.paper()
    assert config.resolve(UCIConfig, "lbfgs.linesearch") == ("lbfgs", "linesearch")
    assert config.resolve(UCIConfig, "lbfgs_linesearch") == ("lbfgs", "linesearch")
    assert config.resolve(UCIConfig, "width") == ("network", "width")
    assert config.resolve(UCIConfig, "n_particles") == ("n_particles",)
    assert config.get(cfg, "sghmc.restarts") == 10
    new = config.replace(cfg, "sghmc.restarts", 3)
    assert new.sghmc.restarts == 3 and cfg.sghmc.restarts == 10 and new.lbfgs == cfg.lbfgs
    for bad in ("nosuch", "lbfgs.nosuch", "sghmc_nosuch", "nosuch.steps"):
        with pytest.raises(ValueError, match="UCIConfig has no field|LBFGSConfig has no field|SGHMCConfig has no"):
            config.resolve(UCIConfig, bad)
    with pytest.raises(ValueError, match="UCIConfig has no field 'nosuch'"):
        config.from_dict(UCIConfig, {"nosuch": 1})
    with pytest.raises(ValueError, match="must be a NetworkConfig"):
        UCIConfig(network={"width": 3})
    with pytest.raises(TypeError, match="takes a configuration"):
        config.as_dict({"a": 1})
