"""experiments.linear (Figures 2 and 5, Section 4.1) at the quick profile (= the paper's scale).

The experiment runs once for the module (about two minutes on one core), with the cache off, as the chapter runs it
(``chapter_run`` in conftest.py), and is handed to the book build that follows. Tolerances: the
self-distance and the Section 4.1 reference are estimated from n = 20 repetitions, so a z-score built on their
sample sd follows Student's t with n - 1 degrees of freedom; we reject at two-sided level 1e-4 (|t_19| > 5.0), or
the matching one-sided prediction bound for a single new draw.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bootens_core.exact import linear
from bootens_core import models
from bootens_core.repro.experiments.linear.config import LinearConfig
from bootens_core.data import synthetic
from bootens_core.repro.experiments import linear as experiment

pytestmark = pytest.mark.slow

CFG = LinearConfig.quick()
LEVEL = 1e-4

CONTRACT = (
    "kl_initial",
    "kl_final",
    "self_distance_mean",
    "self_distance_sd",
    "kl_monotone_fraction",
    "kl_estimator",
    "map_cov_rel_error",
    "map_cov_rel_error_expected",
)


@pytest.fixture(scope="module")
def result(chapter_run):
    return chapter_run("linear", CFG)  # the chapter's own run: the book build that follows reads it


@pytest.fixture(scope="module")
def post(result):
    """The exact posterior of the experiment's data, rebuilt from the same keys (checked against its
    arrays)."""
    k_omega, k_data = jax.random.split(jax.random.key(CFG.seed), 8)[:2]
    omega = synthetic.trig_frequencies(k_omega, CFG.n_features, CFG.lengthscale)
    data = synthetic.trig_regression(k_data, CFG.n_data, CFG.noise_var)
    np.testing.assert_array_equal(data.x, result["x"])
    # y is a sum of sines of x plus noise: computed by another XLA program (the run's process compiles at
    # another optimisation level, see conftest.py) it may differ in the last place.
    np.testing.assert_allclose(data.y, result["y"], rtol=1e-14, atol=1e-15)
    Phi = np.asarray(models.trig_features(jnp.asarray(omega)).features(jnp.asarray(data.x)))
    return linear.posterior(Phi, data.y, CFG.noise_var, CFG.prior_var)


def _t(n):
    return stats.t.isf(LEVEL / 2, n - 1)


def test_contract_keys(result):
    s = result.summary
    for key in CONTRACT:
        assert key in s, key
    assert isinstance(s["kl_estimator"], str) and s["kl_estimator"].endswith(".")
    assert "r = min(n, D) = 64" in s["kl_estimator"] and f"k = {CFG.n_particles}" in s["kl_estimator"]
    assert 0.0 <= s["kl_monotone_fraction"] <= 1.0
    np.testing.assert_array_equal(result["stages"], CFG.stages)
    assert result["kl_curve"].shape == (CFG.steps + 1,)
    assert s["kl_initial"] == result["kl_curve"][0] and s["kl_final"] == result["kl_curve"][-1]
    selfd = result["self_distance"]
    assert selfd.shape == (CFG.n_selfdist_populations,)
    assert s["self_distance_mean"] == pytest.approx(selfd.mean()) and s["self_distance_sd"] == pytest.approx(
        selfd.std(ddof=1)
    )


def test_typed_summary_is_the_summary_json(result, tmp_path):
    """The typed summary holds exactly the keys the run writes (the continued run's only when it ran), also
    read back from disk; the verdicts read it as they read the dict."""
    import dataclasses

    from bootens_core.repro import store

    typed = experiment.Summary.of(result)
    assert typed.as_summary() == result.summary
    assert experiment.Summary.of(store.load(store.save(result, tmp_path / "r"))) == typed
    assert {k: str(v) for k, v in experiment.verdicts.evaluate(typed, typed).items()} == {
        k: str(v) for k, v in experiment.verdicts.evaluate(result.summary, result.summary).items()}
    # The continued run is optional: without it the fields are None and summary.json lacks them.
    assert CFG.paper_steps_continued <= CFG.paper_steps or typed.paper_setting_continued_steps is not None
    short = dataclasses.replace(typed, paper_setting_continued_steps=None,
                                paper_setting_continued_steps_to_self_distance_2sd=None,
                                paper_setting_continued_steps_to_self_distance_3sd=None)
    assert not any(k.startswith("paper_setting_continued_") for k in short.as_summary())
    assert experiment.Summary.of(short.as_summary()) == short
    with pytest.raises(ValueError, match="no kl_final: not a Summary"):
        experiment.Summary.of({k: v for k, v in result.summary.items() if k != "kl_final"})


def test_self_distance_matches_its_closed_form(result):
    """The mean of n = 20 self-distances has SE sd / sqrt(20)."""
    s, n = result.summary, CFG.n_selfdist_populations
    assert s["self_distance_expected"] == pytest.approx(linear.expected_self_distance(64, CFG.n_particles))
    se = s["self_distance_sd"] / np.sqrt(n)
    assert abs(s["self_distance_mean"] - s["self_distance_expected"]) < _t(n) * se


def test_particles_reach_the_posterior(result):
    """The final KL is one draw of the estimator; if the particles are posterior samples it falls within the
    self-distance spread: below mean + t sd sqrt(1 + 1/n) (one-sided prediction bound at level 1e-4)."""
    s, n = result.summary, CFG.n_selfdist_populations
    bound = s["self_distance_mean"] + stats.t.isf(LEVEL, n - 1) * s["self_distance_sd"] * np.sqrt(1 + 1 / n)
    assert s["kl_final"] <= bound
    assert s["kl_initial"] > 100 * s["kl_final"]


def test_off_subspace_variance_is_the_priors(result, post):
    """Off the data subspace the posterior is the prior: for k posterior samples the summed sample variance
    over the D - r directions, over alpha^2 (D - r), is 1 with sd sqrt(2 / ((k - 1)(D - r)))."""
    k, m = CFG.n_particles, post.D - post.V.shape[1]
    assert abs(result.summary["off_subspace_var_ratio"] - 1) < 5 * np.sqrt(2 / ((k - 1) * m))


def test_paper_setting_is_reported_and_has_not_converged(result):
    s, n = result.summary, CFG.n_selfdist_populations
    assert s["paper_setting_steps"] == 400 and s["paper_setting_step_size"] == 0.01
    assert result["paper_kl_curve"].shape == (401,)
    assert s["paper_setting_kl_final"] > s["kl_final"]
    # The stated deviation: 400 Adagrad steps at h = 0.01 leave the KL far above the self-distance.
    assert s["paper_setting_kl_final"] > s["self_distance_mean"] + 10 * _t(n) * s["self_distance_sd"]
    assert f"{s['paper_setting_kl_final']:.3g}" in s["deviation"]


def test_gradient_ascent_at_the_papers_step_is_labelled_with_it(result, post):
    """The chapter's 'with the paper's h' paragraph prints ``paper_step_gd_step_size``: it must be the paper's
    step, and the spectral radius and exact KL beside it must be those of that step (closed forms on the
    posterior's eigenvalues; at this step the largest eigenvalue sets the radius)."""
    s = result.summary
    h, n = s["paper_step_gd_step_size"], s["paper_step_gd_steps"]
    assert h == CFG.paper_step_size == s["paper_setting_step_size"] and n == CFG.paper_step_gd_steps
    assert s["paper_step_gd_spectral_radius"] == pytest.approx(abs(1 - h * post.lam.max()), rel=1e-12)
    assert s["paper_step_gd_spectral_radius"] > 1
    law = linear.gd_population_kl(post, linear.gd_population(post, h, np.arange(n + 1)))
    np.testing.assert_allclose(result["paper_step_gd_kl"], law, rtol=1e-10)
    assert s["paper_step_gd_kl_final"] == pytest.approx(law[-1], rel=1e-10)
    # Not the numbers of the deviation's step, which the chapter once printed under the paper's label.
    assert s["paper_step_gd_spectral_radius"] != pytest.approx(abs(1 - CFG.step_size * post.lam.max()), rel=1e-3)


def test_default_model_is_unscaled(result):
    s = result.summary
    assert s["feature_scale"] == "none" and s["feature_scale_value"] == 1.0
    assert s["prior_function_sd"] == pytest.approx(np.sqrt(CFG.n_features / 2), rel=0.05)
    assert "paper_setting_continued_steps" not in s and "paper_kl_curve_continued" not in result.arrays


def test_section_41_map_samples(result):
    """Closed-form perturbed MAPs vs exact sampling: the covariance error within the exact-sampling spread
    (n = 20 repeats, t_19 at level 1e-4), and the chi-square test of the mean not rejected at 1e-3."""
    s, n = result.summary, CFG.n_map_repeats
    z = (s["map_cov_rel_error"] - s["map_cov_rel_error_exact_samples_mean"]) / s[
        "map_cov_rel_error_exact_samples_sd"
    ]
    assert z == pytest.approx(s["map_cov_z"])
    assert abs(z) < _t(n) * np.sqrt(1 + 1 / n)
    assert s["map_mean_chi2_pvalue"] > 1e-3 and s["map_mean_chi2_dof"] == CFG.n_features


def test_perturbed_maps_match_the_posterior_on_the_data_subspace(result):
    """The data-subspace KL of the k closed-form MAPs sits at its closed-form expectation for k exact samples
    (t_19 at level 1e-4 with the sd estimated from 20 exact populations), and the summary's z is that ratio."""
    s, n = result.summary, CFG.n_map_repeats
    z = (s["map_subspace_kl"] - s["map_subspace_kl_expected"]) / s["map_subspace_kl_exact_samples_sd"]
    assert z == pytest.approx(s["map_subspace_kl_z"])
    assert abs(z) < _t(n) * np.sqrt(1 + 1 / n)


def test_section_41_expected_error_is_the_rms_of_exact_sampling(result):
    """map_cov_rel_error_expected is the RMS for exact samples: the mean of the 20 squared reference errors
    is within t SE of its square."""
    s, n = result.summary, CFG.n_map_repeats
    e2 = result["map_ref_errors"] ** 2
    assert e2.shape == (n,)
    assert abs(e2.mean() - s["map_cov_rel_error_expected"] ** 2) < _t(n) * e2.std(ddof=1) / np.sqrt(n)


def test_gradient_ascent_estimate_matches_its_exact_law(result, post):
    """Plain gradient ascent from the anchors: the particles are k iid draws of a known Gaussian (its law in
    closed form), so the 200-particle KL estimate has a known distribution. Its mean is the exact KL plus the
    estimator's bias, E = KL + expected_self_distance(r, k) + (tr(Sigma_p^-1 Sigma_q) - r) / (2k); its sd we
    simulate from that law (M populations drawn in the data-subspace basis, where the law is diagonal).
    The empirical value must lie within 5 simulated sd of E."""
    s = result.summary
    k, r, t = CFG.n_particles, post.V.shape[1], CFG.gd_steps
    law = linear.gd_population(post, s["gd_step_size"], np.array([t]))
    exact = linear.gd_population_kl(post, law)[0]
    assert s["gd_exact_kl_final"] == pytest.approx(exact, rel=1e-10)
    bias = linear.expected_self_distance(r, k) + (np.sum(post.lam * law.var[0]) - r) / (2 * k)
    M = 400
    rng = np.random.default_rng(0)
    coords = law.mean[0] + np.sqrt(law.var[0]) * rng.standard_normal((M, k, r))
    sim = linear.projected_kl_path(post, coords)
    # The simulation confirms the analytic mean (5 SE) and gives the spread.
    assert abs(sim.mean() - (exact + bias)) < 5 * sim.std(ddof=1) / np.sqrt(M)
    assert abs(s["gd_empirical_kl_final"] - (exact + bias)) < 5 * sim.std(ddof=1)
    assert result["gd_empirical_kl"].shape == (t + 1,)


def test_figures_build(result):
    """Every figure of the chapter builds from this result, comes back closed and renders."""
    import io

    import matplotlib.pyplot as plt

    figs = {
        "stages": experiment.figures.stages(result),
        "stages_paper": experiment.figures.stages(result, run="paper"),
        "particles": experiment.figures.particles(result),
        "kl": experiment.figures.kl(result),
    }
    assert len(figs["stages"].axes) == len(CFG.stages) + 1
    assert len(figs["stages_paper"].axes) == len(CFG.paper_stages) + 1
    assert len(figs["particles"].axes) == len(CFG.stages)
    assert len(figs["kl"].axes) == 2
    for name, fig in figs.items():
        assert fig.number not in plt.get_fignums(), name
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        assert buf.getvalue().startswith(b"\x89PNG"), name
