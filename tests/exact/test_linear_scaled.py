"""The linear experiment on the model with features times sqrt(2/D) (``LinearConfig.scaled_features()``).

It runs once for the module (about half a minute on one core), with the cache off, as the chapter runs it
(``chapter_run`` in conftest.py), and is handed to the book build that follows. What is checked: the posterior the
particles are measured against is the scaled model's (rebuilt here from the same keys); the continued run of the
paper's Adagrad setting starts as the 400-step run and its first step within the self-distance band is read off
its own curve; the chapter's verdict follows the rule on these numbers.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bootens_core.exact import linear
from bootens_core.repro.experiments.linear.config import LinearConfig
from bootens_core.data import synthetic
from bootens_core.repro.experiments import linear as experiment

pytestmark = pytest.mark.slow

CFG = LinearConfig.quick().scaled_features()


@pytest.fixture(scope="module")
def result(chapter_run):
    return chapter_run("linear", CFG)  # the chapter's own run: the book build that follows reads it


def _phi(x, omega):
    """The scaled features, written out: sqrt(2/D) cos(omega x - pi/4)."""
    return np.sqrt(2 / CFG.n_features) * np.cos(np.asarray(x)[:, None] * omega[None] - np.pi / 4)


@pytest.fixture(scope="module")
def omega():
    k_omega = jax.random.split(jax.random.key(CFG.seed), 8)[0]
    return synthetic.trig_frequencies(k_omega, CFG.n_features, CFG.lengthscale)


@pytest.fixture(scope="module")
def post(result, omega):
    k_data = jax.random.split(jax.random.key(CFG.seed), 8)[1]
    data = synthetic.trig_regression(k_data, CFG.n_data, CFG.noise_var)
    np.testing.assert_array_equal(data.x, result["x"])
    return linear.posterior(_phi(data.x, omega), data.y, CFG.noise_var, CFG.prior_var)


def test_summary_names_the_scaling(result):
    s = result.summary
    assert s["feature_scale"] == "sqrt(2/D)"
    assert s["feature_scale_value"] == pytest.approx(np.sqrt(2 / CFG.n_features), rel=1e-15)
    # Prior functions: variance about 1 instead of about D / 2.
    assert s["prior_function_sd"] == pytest.approx(1.0, rel=0.05)


def test_measured_against_the_scaled_models_posterior(result, post, omega):
    s = result.summary
    assert s["lambda_max"] == pytest.approx(post.lam.max(), rel=1e-8)
    np.testing.assert_allclose(result["posterior_mean_f"], _phi(result["x_grid"], omega) @ post.mean,
                               rtol=1e-6, atol=1e-9)
    # The paper's step for plain gradient ascent, on this model.
    h = s["paper_step_gd_step_size"]
    assert h == CFG.paper_step_size
    assert s["paper_step_gd_spectral_radius"] == pytest.approx(
        np.max(np.abs(1 - h * np.append(post.lam, 1 / CFG.prior_var))), rel=1e-10)


def test_continued_run_extends_the_papers_run(result):
    s = result.summary
    long, short = result["paper_kl_curve_continued"], result["paper_kl_curve"]
    assert long.shape == (CFG.paper_steps_continued + 1,) and short.shape == (CFG.paper_steps + 1,)
    # Same key, same start, same updates: the first 400 steps are the 400-step run (up to rounding).
    np.testing.assert_allclose(long[: short.size], short, rtol=1e-9)
    for n_sd in (2, 3):
        level = s["self_distance_mean"] + n_sd * s["self_distance_sd"]
        first = s[f"paper_setting_continued_steps_to_self_distance_{n_sd}sd"]
        below = np.nonzero(long <= level)[0]
        assert first == (int(below[0]) if below.size else None)


def test_verdict_follows_the_rule(result):
    s = result.summary
    v = experiment.verdicts.evaluate(s, s)["scaled"]
    limit = s["self_distance_mean"] + 3 * s["self_distance_sd"]
    reached = s["paper_setting_kl_final"] <= limit
    assert str(v) == f"{'reaches' if reached else 'does not reach'} the self-distance in {CFG.paper_steps} steps"
    assert v.margin == pytest.approx(abs(s["paper_setting_kl_final"] - limit) / s["self_distance_sd"])
    first = s["paper_setting_continued_steps_to_self_distance_3sd"]
    if not reached and first is not None:
        assert first > CFG.paper_steps


def test_self_distance_does_not_depend_on_the_scaling(result):
    """The estimator's self-distance is pivotal (its law does not depend on the posterior): with the same keys
    it is the unscaled run's up to rounding; its mean matches the closed form."""
    s = result.summary
    assert s["self_distance_expected"] == pytest.approx(linear.expected_self_distance(64, CFG.n_particles))
    sd = s["self_distance_sd"]
    assert abs(s["self_distance_mean"] - s["self_distance_expected"]) < 5 * sd / np.sqrt(CFG.n_selfdist_populations)
