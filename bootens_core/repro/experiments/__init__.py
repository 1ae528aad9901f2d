"""One experiment per paper artefact: ``run(key, cfg) -> Result`` (cached in the result store).

Every experiment defines ``NAME``, ``DESCRIPTION``, ``ARTEFACTS`` (what of the paper it rebuilds),
``Config`` (the config class, with ``quick()``/``paper()``) and ``run(key, cfg, *, use_cache, force,
progress)``. An experiment is a folder that holds all of it in one place: ``config.py`` (its configuration),
``experiment.py`` (its run), ``figures.py`` (its figures) and ``verdicts.py`` (the rules that turn its summary
into verdicts, and its tables); the package re-exports the run's names and ``figures`` and ``verdicts``
(``linear.figures.kl(result)``, ``uci.verdicts.table(summary, "rmse")``).
"""

from __future__ import annotations

from types import ModuleType

from . import classification, deep_relu, linear, practice, theory, toy_relu, uci, univariate

__all__ = [
    "REGISTRY", "get", "linear", "univariate", "toy_relu", "deep_relu", "theory", "uci", "classification",
    "practice",
]

REGISTRY: dict[str, ModuleType] = {
    m.NAME: m for m in (univariate, linear, toy_relu, deep_relu, theory, uci, classification, practice)
}


def get(name: str) -> ModuleType:
    """The runner module of an experiment; a clear error lists the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown experiment {name!r}: known are {', '.join(sorted(REGISTRY))}") from None
