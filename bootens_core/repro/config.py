"""Configurations: profiles, the helpers every configuration shares, and the methods' sub-configurations.

An experiment's configuration is one frozen dataclass with ``quick()`` and ``paper()``; it lives beside the
experiment (``experiments/<name>/config.py``; the benchmark's and the profiler's in ``performance/config.py``).
``profile()`` is the only place that reads ``BOOTENS_PROFILE``. A configuration is plain data: it is hashed (with the PRNG key and the package source)
into the result-cache key, so every field that changes a result must live in it.

The settings of one method are one sub-configuration (:class:`LBFGSConfig`, :class:`SGHMCConfig`,
:class:`NUTSConfig`, :class:`MHConfig`, :class:`MCDropoutConfig`, :class:`DropoutGridConfig`,
:class:`GPConfig`, :class:`NetworkConfig`),
a field of the experiment's configuration: ``cfg.lbfgs.step_size``, ``cfg.nuts.chains``. A field is named by
its dotted path (``lbfgs.linesearch``; :func:`get`, :func:`replace`, the CLI's ``--set``); the flat names of
earlier versions (``lbfgs_linesearch``, ``width``) are still understood, so committed ``config.json`` files
read back (:func:`from_dict`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PROFILES",
    "profile",
    "UCI_LBFGS_LINESEARCHES",
    "NetworkConfig",
    "LBFGSConfig",
    "GPConfig",
    "MCDropoutConfig",
    "DropoutGridConfig",
    "SGHMCConfig",
    "DeepEnsembleConfig",
    "MHConfig",
    "NUTSConfig",
    "for_profile",
    "as_dict",
    "plain",
    "from_dict",
    "resolve",
    "get",
    "replace",
    "require_x64",
]

PROFILES = ("quick", "paper")


def profile(name: str | None = None) -> str:
    """Return the active profile: ``name`` if given, else ``$BOOTENS_PROFILE``, else ``"quick"``."""
    value = name if name is not None else os.environ.get("BOOTENS_PROFILE", "quick")
    value = value.strip().lower()
    if value not in PROFILES:
        raise ValueError(f"unknown profile {value!r}: choose one of {', '.join(PROFILES)} (BOOTENS_PROFILE)")
    return value


def for_profile(config_cls: type, name: str | None = None) -> Any:
    """Instantiate ``config_cls.quick()`` or ``config_cls.paper()`` for the active profile."""
    return getattr(config_cls, profile(name))()


def plain(value: Any) -> Any:
    """A configuration value as plain JSON data: a (sub-)configuration becomes a dict, a tuple a list (also
    inside dicts and lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def as_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass: sub-configurations become nested dicts, tuples lists."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"as_dict takes a configuration (a dataclass instance), got {type(cfg).__name__}")
    return plain(cfg)


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def _sub_configs(cls: type) -> dict[str, type]:
    """The fields of ``cls`` that hold a sub-configuration, with its class (read from the defaults)."""
    return {k: type(v) for k, v in _defaults(cls).items() if dataclasses.is_dataclass(v)}


def resolve(cls: type, name: str) -> tuple[str, ...]:
    """The path of a field of configuration class ``cls``: a dotted name (``"lbfgs.linesearch"``), a top-level
    field, or a flat name of earlier versions (``"lbfgs_linesearch"``: a sub-configuration's name, ``_`` and
    its field; or one of the class's ``LEGACY_NAMES``, e.g. ``"width"`` -> ``network.width``). A name that is
    none of these is a ``ValueError`` listing the fields."""
    fields = {f.name for f in dataclasses.fields(cls)}
    subs = _sub_configs(cls)
    if "." in name:
        head, _, rest = name.partition(".")
        if head in subs:
            return (head, *resolve(subs[head], rest))
    elif name in fields:
        return (name,)
    else:
        legacy = getattr(cls, "LEGACY_NAMES", {})
        if name in legacy:
            return tuple(legacy[name].split("."))
        for head, sub in subs.items():
            if name.startswith(head + "_") and name[len(head) + 1:] in {f.name for f in dataclasses.fields(sub)}:
                return (head, name[len(head) + 1:])
    known = sorted(fields - set(subs)) + [f"{h}.{f.name}" for h, sub in subs.items() for f in dataclasses.fields(sub)]
    raise ValueError(f"{cls.__name__} has no field {name!r}: its fields are {', '.join(known)}")


def get(cfg: Any, name: str) -> Any:
    """The value of a field of ``cfg`` by name (see :func:`resolve`)."""
    value = cfg
    for part in resolve(type(cfg), name):
        value = getattr(value, part)
    return value


def replace(cfg: Any, name: str, value: Any) -> Any:
    """``cfg`` with one field (named as :func:`resolve` reads it) set to ``value``; the sub-configuration's own
    checks run on the new value."""
    path = resolve(type(cfg), name)

    def go(obj: Any, parts: tuple[str, ...]) -> Any:
        if len(parts) == 1:
            return dataclasses.replace(obj, **{parts[0]: value})
        return dataclasses.replace(obj, **{parts[0]: go(getattr(obj, parts[0]), parts[1:])})

    return go(cfg, path)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """A configuration of class ``cls`` from a dict of :func:`as_dict` (or a ``config.json``): nested dicts for
    the sub-configurations, lists for tuples, and the flat names of earlier versions (:func:`resolve`).
    Fields the dict does not name keep ``cls``'s defaults (the paper's); a name ``cls`` does not have is a
    ``ValueError``."""
    if not isinstance(data, dict):
        raise ValueError(f"a {cls.__name__} is read from a dict, got {type(data).__name__}")
    subs = _sub_configs(cls)
    defaults = _defaults(cls)
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for name, value in data.items():
        if name in subs and isinstance(value, dict):
            nested.setdefault(name, {}).update(value)
            continue
        path = resolve(cls, name)
        if len(path) == 1:
            top[name] = value
        else:
            nested.setdefault(path[0], {})[".".join(path[1:])] = value
    for head, values in nested.items():
        # a sub-configuration the dict names in part keeps the rest of ``cls``'s own default for it
        top[head] = from_dict(subs[head], {**as_dict(defaults[head]), **values})
    for name, value in top.items():
        if isinstance(value, list) and isinstance(defaults.get(name), tuple):
            top[name] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return cls(**top)


def require_x64(experiment: str) -> None:
    """Raise ``RuntimeError`` unless JAX's 64-bit mode is on.

    The experiments compare against analytic references in float64 and name the dtype their networks train
    in; without the mode JAX would compute every float64 array in float32 and the chapter's numbers would
    change without a word. The ``bootens`` command and every chapter switch the mode on first.
    """
    import jax

    if not jax.config.jax_enable_x64:
        raise RuntimeError(
            f"the {experiment} experiment computes in float64 and needs JAX's 64-bit mode: call "
            "jax.config.update('jax_enable_x64', True) before anything else creates JAX arrays"
        )


# --- The settings of one method: sub-configurations of the experiments' configurations. ---


@dataclass(frozen=True)
class NetworkConfig:
    """A ReLU network and its prior: ``width`` units per hidden layer (the depth is the method's), weights
    N(0, ``weight_var``) (N(0, ``weight_var`` / fan-in) with ``scale_by_fan_in``), biases N(0, ``bias_var``),
    trained in ``dtype``."""

    width: int = 50
    weight_var: float = 1.0
    bias_var: float = 1.0
    scale_by_fan_in: bool = False
    dtype: str = "float32"


@dataclass(frozen=True)
class LBFGSConfig:
    """The ensembles' L-BFGS: ``steps`` steps of up to ``iters_per_step`` iterations each at ``step_size``,
    ``memory`` curvature pairs; ``linesearch`` is one of :data:`UCI_LBFGS_LINESEARCHES`.

    "32 steps, step size 0.5" is read as ``torch.optim.LBFGS(lr=0.5)`` stepped 32 times, each step of up to
    ``iters_per_step`` iterations (torch's default ``max_iter`` is 20): 640 iterations at most. The literal
    reading, 32 iterations in all, is ``iters_per_step=1`` (kept runnable; it leaves the particles far from any
    fit -- shown in the chapter). ``memory`` is optax's ``memory_size`` or torch's ``history_size`` for the
    "torch" variants (torch's default, 100, is the faithful value: the paper states none).

    ``linesearch``: "zoom" (every profile, a named deviation): optax's zoom line search (strong Wolfe) from the
    step 0.5, 640 iterations; None: optax's L-BFGS with the fixed step 0.5, 640 iterations (diverges for many
    particles); "torch": the paper's optimizer as written, ``torch.optim.LBFGS(lr=0.5)`` stepped ``steps``
    times. It skips the pairs with y.s <= 1e-10 and so never steps uphill, yet its fixed step diverges too,
    more often than optax's (CPU, sigma^2 = 1e-4, 1 layer, splits 0-2: Yacht 12-14 and Energy 8-12 particles
    of 200 per split, optax 0-2; PyTorch 2.13 itself, float64, 12 on Yacht split 0): the profiles keep
    "zoom"; "torch-strong-wolfe": the same with torch's strong-Wolfe line search.
    """

    steps: int = 32
    iters_per_step: int = 20
    step_size: float = 0.5
    memory: int = 10
    linesearch: str | None = "zoom"

    def __post_init__(self) -> None:
        # The CLI's --set passes strings verbatim: "null"/"none" mean None (optax's fixed step).
        if isinstance(self.linesearch, str) and self.linesearch.strip().lower() in ("null", "none"):
            object.__setattr__(self, "linesearch", None)
        if self.linesearch not in UCI_LBFGS_LINESEARCHES:
            raise ValueError(
                f"unknown L-BFGS linesearch {self.linesearch!r}: choose null (optax, fixed step), 'zoom' "
                "(optax, zoom line search), 'torch' (torch.optim.LBFGS, fixed step) or 'torch-strong-wolfe'"
            )
        for name in ("steps", "iters_per_step", "memory"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"L-BFGS {name} must be a positive integer, got {v!r}")
        step = self.step_size
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not (0 < step < float("inf")):
            raise ValueError(f"L-BFGS step_size must be a positive finite number, got {step!r}")


@dataclass(frozen=True)
class GPConfig:
    """The GP baseline: at most ``max_iter`` L-BFGS-B iterations of the marginal likelihood (ELBO); sparse
    (SGPR/SVGP, ``n_inducing`` inducing points) on ``svgp_datasets``, exact GPR elsewhere."""

    max_iter: int = 1000
    svgp_datasets: tuple[str, ...] = ("protein",)
    n_inducing: int = 400


@dataclass(frozen=True)
class MCDropoutConfig:
    """MC dropout on Gal's UCI protocol (:mod:`bootens_core.baselines.dropout`): the grid is the dataset's
    dropout_rates.txt x tau_values.txt; epochs = n_epochs.txt (40; Protein 20) x ``epochs_x``; ``samples``
    forward passes at test time. The upstream readme says "10x", the logs behind its grid-search numbers are
    named "100_xepochs": we take the logs' 100x."""

    epochs_x: int = 100
    samples: int = 10_000


@dataclass(frozen=True)
class DropoutGridConfig:
    """MC dropout with its own grid (the classification chapter): the dropout rate is chosen from
    ``dropout_grid`` on held-out data, ``epochs`` of training, ``samples`` forward passes at test time."""

    dropout_grid: tuple[float, ...] = (0.005, 0.01, 0.05, 0.1, 0.2)
    epochs: int = 500
    samples: int = 1000


@dataclass(frozen=True)
class DeepEnsembleConfig:
    """Deep ensembles (Lakshminarayanan et al. 2017, :mod:`bootens_core.baselines.deep_ensemble`) on their UCI
    protocol as we read it: ``n_networks`` ReLU networks of one hidden layer (``width`` units, ``width_large``
    for Protein), each from its own random initialisation, predicting a mean and a variance, trained on the
    Gaussian negative log-likelihood plus its value at fast-gradient-sign adversarial inputs
    (``adversarial_eps`` x each input's range) by Adam (``lr``, minibatches of ``batch_size``, ``epochs``)."""

    n_networks: int = 5
    width: int = 50
    width_large: int = 100
    epochs: int = 40
    batch_size: int = 100
    lr: float = 0.1
    adversarial_eps: float = 0.01


@dataclass(frozen=True)
class SGHMCConfig:
    """Scale-adapted SGHMC (Springenberg et al. 2016, :mod:`bootens_core.samplers.sghmc`).

    The paper: ``lr`` 0.001, ``mdecay`` 0.01, ``burn_in`` 2000, one sample every ``thin`` = 2000 steps,
    ``restarts`` = 10 from prior draws, 200 samples (``draws`` per restart). The minibatch size is not given:
    20 is the reference implementation's default. ``lr_scaling``: how lr becomes the step eps on the full-data
    gradient (see samplers.sghmc_model). Every profile uses "none": eps = lr = 0.001, as the reference code reads
    the paper's learning rate (pybnn's current PyTorch sampler, RoBO's Theano Bohamiann, whose default l_rate is
    the paper's 1e-3, and pysgmcmc). No restart diverged at it in the cases examined, but the restarts stay far
    apart after the paper's 42 000 steps (predictive R-hat ~3 on Boston and Yacht: uci.sghmc_step_study, shown
    in the chapter) -- a limitation of the paper's setting. "sqrt_lr" (eps = sqrt(lr) ~ 0.032, the convention
    of one pybnn version from October 2018 to February 2019) stays runnable; with minibatches of 20 it loses
    restarts to divergence after the burn-in and heats the survivors
    (results/paper/uci-sghmc-sqrt-lr/DIVERGENCE.md).
    """

    lr: float = 1e-3
    mdecay: float = 0.01
    burn_in: int = 2000
    thin: int = 2000
    restarts: int = 10
    draws: int = 20
    batch_size: int = 20
    lr_scaling: str = "none"


@dataclass(frozen=True)
class MHConfig:
    """Random-walk Metropolis-Hastings: a N(0, ``proposal_var``) proposal, ``chains`` restarts from prior
    draws, ``burn_in`` steps, then ``draws`` samples per chain, one every ``thin`` steps."""

    proposal_var: float = 0.5
    chains: int = 10
    burn_in: int = 10_000
    thin: int = 5_000
    draws: int = 20


@dataclass(frozen=True)
class NUTSConfig:
    """NUTS (NumPyro): ``chains`` chains from prior draws, ``warmup`` adaptation steps, ``draws`` draws per
    chain, trees of depth at most ``max_tree_depth``, step size adapted to ``target_accept``; the chains run
    as ``chain_method`` says ("vectorized", "sequential", or "auto": one after another on a CPU, vectorised on
    an accelerator, which pays where a gradient is expensive; see
    :func:`bootens_core.samplers.resolve_chain_method`)."""

    chains: int = 4
    warmup: int = 500
    draws: int = 250
    max_tree_depth: int = 8
    target_accept: float = 0.9
    chain_method: str = "vectorized"


# The L-BFGS variants of the UCI ensembles (``UCIConfig.lbfgs.linesearch``): None -- optax's L-BFGS with a fixed
# step, one iteration per step; "zoom" -- optax's L-BFGS with its zoom line search; "torch" --
# torch.optim.LBFGS(lr) (fixed step; bootens_core.ensemble.lbfgs.torch_lbfgs), one step = one outer step of up to
# ``lbfgs_iters_per_step`` iterations, history ``lbfgs_memory``; "torch-strong-wolfe" -- the same with
# line_search_fn="strong_wolfe" (at most 25 further evaluations per search, as PyTorch before 2.10).
UCI_LBFGS_LINESEARCHES: tuple[str | None, ...] = (None, "zoom", "torch", "torch-strong-wolfe")
