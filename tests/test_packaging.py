"""Packaging: the library imports and trains with its light dependencies alone, what needs more says which
extra to install, and the citation file and changelog describe the package as it is."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import yaml

import bootens_core

ROOT = Path(__file__).parents[1]
LIGHT = {"numpy", "scipy", "jax", "jaxlib", "optax", "tqdm"}
# Everything an extra brings that the library must not need at import (nor to train and score an ensemble).
HEAVY = ("pandas", "matplotlib", "sklearn", "numpyro", "arviz", "pooch", "tensorflow", "gpflow", "flax",
         "equinox", "torch", "IPython", "yaml", "pytest")

_BLOCK = textwrap.dedent(
    f"""
    import importlib.abc, sys
    class _Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {HEAVY!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None
    sys.meta_path.insert(0, _Absent())
    """
)

_LIBRARY = _BLOCK + textwrap.dedent(
    """
    import importlib, pkgutil
    import numpy as np
    import bootens_core
    imported, refused = [], {}
    for m in pkgutil.walk_packages(bootens_core.__path__, "bootens_core."):
        if m.name.startswith("bootens_core.repro"):
            continue
        try:
            importlib.import_module(m.name)
            imported.append(m.name)
        except ModuleNotFoundError as err:
            refused[m.name] = str(err)
    import jax
    from bootens_core import adapters, ensemble, metrics, models
    x = np.linspace(-1, 1, 20)
    model = models.mlp(1, (8,))
    res = ensemble.train(jax.random.key(0), model, x, np.sin(3 * x), noise_var=0.1, n_particles=4,
                         opt=ensemble.optimizer("adam", 0.05), steps=20)
    f = np.asarray(ensemble.predict(model, res.params, x))
    assert np.isfinite(metrics.mixture_mnll(np.sin(3 * x), f, 0.1))
    try:
        adapters.from_equinox(object())
    except ModuleNotFoundError as err:
        refused["adapters.from_equinox"] = str(err)
    print(repr((imported, refused)))
    """
)


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}, cwd=ROOT)


def test_core_dependencies_are_the_light_ones():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~ \[]", dep)[0].lower() for dep in project["dependencies"]}
    assert names == LIGHT
    extras = project["optional-dependencies"]
    assert {"repro", "sklearn", "flax", "equinox", "mcmc", "gp", "data"} <= set(extras)


def test_library_imports_and_trains_with_its_light_dependencies_alone():
    """In a process where every package of an extra is absent: each library module imports, an ensemble
    trains and is scored; the modules that need an extra refuse with the extra's name."""
    proc = _run(_LIBRARY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported, refused = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr
    assert {"bootens_core.ensemble.kernel", "bootens_core.samplers.nuts", "bootens_core.baselines.gp",
            "bootens_core.data.uci", "bootens_core.adapters", "bootens_core.persist"} <= set(imported)
    assert set(refused) == {"bootens_core.estimators", "adapters.from_equinox"}, refused
    assert 'pip install scikit-learn (in a checkout of bootens: pip install ".[sklearn]")' in refused[
        "bootens_core.estimators"]
    assert 'pip install equinox (in a checkout of bootens: pip install ".[equinox]")' in refused[
        "adapters.from_equinox"]


def test_command_names_the_reproduction_extra():
    proc = _run(_BLOCK + "from bootens_core.repro.cli import main\nraise SystemExit(main(['list']))")
    assert proc.returncode == 2, proc.stderr[-2000:]
    want = ('needs the reproduction extra (missing: pandas, matplotlib): pip install pandas matplotlib '
            '(in a checkout of bootens: pip install ".[repro]")')
    assert want in proc.stderr


def test_citation_file_describes_this_package_and_the_paper():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["message"] and cff["authors"]
    assert cff["version"] == bootens_core.__version__
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert cff["version"] == project["version"]
    paper = cff["preferred-citation"]
    bibfile = (ROOT / "book" / "references.bib").read_text()
    bib = bibfile.split("@misc{milios2020variational,")[1].split("\n}")[0]
    assert paper["title"].replace("Bayesian", "{Bayesian}") in bib
    assert f"year          = {{{paper['year']}}}" in bib
    assert paper["identifiers"][0]["value"] == "arXiv:" + re.search(r"eprint\s*=\s*\{(.+?)\}", bib).group(1)
    assert [a["family-names"] for a in paper["authors"]] == ["Milios", "Michiardi", "Filippone"]


def test_changelog_has_the_released_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert versions and versions[0] == "Unreleased"
    assert bootens_core.__version__ in versions
