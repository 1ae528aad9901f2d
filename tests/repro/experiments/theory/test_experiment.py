"""experiments.theory: the recorded steps, and the chapter's own run (``chapter_run`` in conftest.py: the book
build's run, or computed once and handed to it), whose linear rates agree with the closed form."""

from __future__ import annotations

import numpy as np
import pytest

from bootens_core.repro.experiments.theory.config import TheoryConfig
from bootens_core.repro.experiments import theory


def test_record_steps():
    s = theory.record_steps(1000, 20)
    assert s[0] == 0 and s[1] == 1 and s[-1] == 1000
    assert np.all(np.diff(s) > 0)
    assert len(s) <= 21
    np.testing.assert_array_equal(theory.record_steps(0, 5), [0])


CFG = TheoryConfig.quick()


@pytest.fixture(scope="module")
def result(chapter_run):
    return chapter_run("theory", CFG)  # the chapter's own run: read from the book build's cache


@pytest.mark.slow
def test_contract_keys(result):
    s = result.summary
    for name in theory.SETTINGS:
        assert 0 <= s[name]["frac_steps_condition_holds"] <= 1, name
    assert np.isfinite(s["linear"]["max_abs_err_vs_exact_kl_rate"])


@pytest.mark.slow
def test_typed_summary_is_the_summary_json(result, tmp_path):
    """The typed summary holds exactly the keys the run writes, also read back from disk; the verdicts read it
    as they read the dict; a setting is read by its name."""
    import dataclasses

    from bootens_core.repro import store

    typed = theory.Summary.of(result)
    assert dataclasses.asdict(typed) == result.summary
    assert theory.Summary.of(store.load(store.save(result, tmp_path / "r"))) == typed
    assert ({k: str(v) for k, v in theory.verdicts.evaluate(typed).items()}
            == {k: str(v) for k, v in theory.verdicts.evaluate(result.summary).items()})
    assert typed.setting("tanh") == result.summary["tanh"]
    with pytest.raises(ValueError, match="unknown setting 'sigmoid'"):
        typed.setting("sigmoid")


def test_measured_linear_rate_agrees_with_the_closed_form(result):
    """The particles' score-based KL rate is within Monte-Carlo error of the exact rate at every recorded step
    (4 se at each of the 37 recorded steps: a family-wise level of about 0.002), and the exact rate of the
    perturbed ensemble is never positive."""
    lin = result.summary["linear"]
    assert lin["max_z_vs_exact_kl_rate"] < 4
    assert lin["frac_steps_kl_decreasing_exact"] == 1.0
    assert np.all(result["linear__exact_rate"] <= 1e-9)


@pytest.mark.slow
def test_relu_curvature_is_zero_and_tanh_is_not(result):
    s = result.summary
    assert s["relu"]["curvature_abs_max"] == 0.0
    assert s["tanh"]["curvature_abs_max"] > 0.0


@pytest.mark.slow
def test_figures_render(result):
    from tests.repro.test_plots import render

    assert len(theory.figures.conditions(result).axes) == 2 * len(theory.SETTINGS)
    assert render(theory.figures.linear(result)).startswith(b"\x89PNG")
