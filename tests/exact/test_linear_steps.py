"""The linear chapter's step labels and the sqrt(2/D) feature-scaling option, without running the experiment.

- ``experiments.linear.gradient_ascent_at`` reports the step it used beside what it computed: run at two
  steps, each report carries its own step, and its spectral radius and exact KL after a few steps equal a
  closed form computed here independently (eigenvalues of the full precision matrix; the Gaussian law of
  ``w_t`` propagated with full matrices, no SVD).
- The chapter prints that step from the summary, never a literal.
- ``LinearConfig.feature_scale``: the default leaves the paper's model untouched; ``"sqrt(2/D)"`` multiplies
  every feature by sqrt(2/D), so prior functions have variance about 1 instead of about D/2.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from bootens_core.exact import linear
from bootens_core.repro.experiments.linear.config import LinearConfig
from bootens_core.repro.experiments import linear as experiment

NOISE_VAR, PRIOR_VAR = 0.3, 0.7  # not 1, so that a swapped variance or a dropped prior term shows
CHAPTER = Path(__file__).resolve().parents[2] / "book" / "linear.ipynb"


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(17)
    n, D = 4, 7  # D > n: the iteration also has the prior's eigenvalue 1 / alpha^2 off the data subspace
    Phi = rng.normal(size=(n, D))
    y = Phi @ rng.normal(size=D) + np.sqrt(NOISE_VAR) * rng.normal(size=n)
    return Phi, y, linear.posterior(Phi, y, NOISE_VAR, PRIOR_VAR)


def _closed_form(Phi, y, h, t):
    """Law of ``w_t = M^t w~ + (I - M^t) w_*`` (``M = I - h A``, ``w~ ~ N(0, alpha^2 I)``, ``y~ ~ N(y, sigma^2 I)``,
    ``w_* = A^-1 (Phi^T y~ / sigma^2 + w~ / alpha^2)``) in full matrices, and its KL to ``N(w_bar, A^-1)``."""
    D = Phi.shape[1]
    A = Phi.T @ Phi / NOISE_VAR + np.eye(D) / PRIOR_VAR
    Ainv = np.linalg.inv(A)
    w_bar = Ainv @ Phi.T @ y / NOISE_VAR
    Mt = np.linalg.matrix_power(np.eye(D) - h * A, t)
    B = Mt + (np.eye(D) - Mt) @ Ainv / PRIOR_VAR  # coefficient of w~
    C = (np.eye(D) - Mt) @ Ainv @ Phi.T / NOISE_VAR  # coefficient of y~
    mean = C @ y
    cov = PRIOR_VAR * B @ B.T + NOISE_VAR * C @ C.T
    AS = A @ cov
    d = mean - w_bar
    kl = 0.5 * (np.trace(AS) - D - np.linalg.slogdet(AS)[1] + d @ A @ d)
    return np.linalg.eigvalsh(A), kl


@pytest.mark.parametrize("lam_h", [0.3, 1.5, 2.6], ids=["stable", "stable, overshooting", "diverging"])
def test_gradient_ascent_reports_its_own_step_and_matching_numbers(problem, lam_h):
    Phi, y, post = problem
    eig = np.linalg.eigvalsh(Phi.T @ Phi / NOISE_VAR + np.eye(Phi.shape[1]) / PRIOR_VAR)
    h = lam_h / eig.max()
    n = 5
    g = experiment.gradient_ascent_at(post, h, n)
    assert g["step_size"] == h and g["n_steps"] == n
    assert g["lambda_max"] == pytest.approx(eig.max(), rel=1e-12)
    assert g["spectral_radius"] == pytest.approx(np.max(np.abs(1 - h * eig)), rel=1e-12)
    assert (g["spectral_radius"] > 1) == (lam_h > 2)
    assert g["kl"].shape == (n + 1,) and g["kl"][0] == pytest.approx(_closed_form(Phi, y, h, 0)[1], rel=1e-10)
    for t in range(1, n + 1):
        assert g["kl"][t] == pytest.approx(_closed_form(Phi, y, h, t)[1], rel=1e-8), t


def test_two_steps_two_labels(problem):
    """The bug this guards against: numbers of one step reported under the label of another."""
    _, _, post = problem
    small, large = (experiment.gradient_ascent_at(post, h / post.lam.max(), 3) for h in (0.5, 2.5))
    assert small["step_size"] == 0.5 / post.lam.max() and large["step_size"] == 2.5 / post.lam.max()
    # Beyond 2 / lambda_max the largest eigenvalue sets the radius: |1 - h lambda_max| = 1.5 at the large step.
    assert large["spectral_radius"] == pytest.approx(abs(1 - large["step_size"] * large["lambda_max"]), rel=1e-12)
    assert large["spectral_radius"] == pytest.approx(1.5, rel=1e-12)
    assert small["spectral_radius"] < 1 < large["spectral_radius"]
    assert large["kl"][-1] > small["kl"][-1]


def test_off_subspace_eigenvalue_counts_for_small_steps(problem):
    """For a tiny step the slowest direction is the prior's (eigenvalue 1 / alpha^2 off the data subspace)."""
    _, _, post = problem
    h = 1e-3
    g = experiment.gradient_ascent_at(post, h, 1)
    assert g["spectral_radius"] == pytest.approx(1 - h / PRIOR_VAR, rel=1e-12)


def _markdown(nb: dict) -> str:
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_chapter_prints_the_steps_it_computed_with():
    """The paragraph on plain gradient ascent at the paper's step takes the step and the number of steps from
    the summary (glued), next to the numbers computed with them, and names no step literally."""
    nb = json.loads(CHAPTER.read_text())
    md = _markdown(nb)
    para = next(p for p in md.split("\n\n") if "lin_rho" in p)
    assert "{glue:text}`lin_gd_h" in para and "{glue:text}`lin_gd_n" in para, para
    # A literal step ("h = 0.01"); "h = 1/lambda_max" is a formula, not a number.
    assert not re.search(r"h\s*=\s*\d[\d.]*(?![\d./])", para), para
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    for name, key in (("lin_gd_h", "paper_step_gd_step_size"), ("lin_gd_n", "paper_step_gd_steps"),
                      ("lin_rho", "paper_step_gd_spectral_radius"), ("lin_gd5", "paper_step_gd_kl_final")):
        assert re.search(rf'\("{name}", "{key}"\)', code), name


def test_feature_scale_default_is_the_papers_model():
    cfg = LinearConfig()
    assert cfg.feature_scale == "none" and cfg.feature_scale_value == 1.0
    omega = np.linspace(-2.0, 2.0, 16)
    x = jnp.linspace(-3.0, 3.0, 9)
    m = experiment.trig_model(omega, cfg)
    np.testing.assert_array_equal(np.asarray(m.features(x)), np.cos(np.asarray(x)[:, None] * omega - np.pi / 4))
    with pytest.raises(ValueError, match="feature_scale"):
        LinearConfig(feature_scale="sqrt(D)")


def test_sqrt_2_over_d_scaling():
    cfg = LinearConfig(n_features=64, feature_scale="sqrt(2/D)")
    assert cfg.feature_scale_value == pytest.approx(np.sqrt(2 / 64), rel=1e-15)
    omega = np.random.default_rng(0).normal(0.0, 1.6, 64)
    x = jnp.linspace(-3.0, 3.0, 101)
    plain = np.asarray(experiment.trig_model(omega, LinearConfig(n_features=64)).features(x))
    scaled = experiment.trig_model(omega, cfg)
    np.testing.assert_allclose(np.asarray(scaled.features(x)), np.sqrt(2 / 64) * plain, rtol=1e-15)
    w = np.random.default_rng(1).normal(size=64)
    np.testing.assert_allclose(np.asarray(scaled.apply({"w": jnp.asarray(w)}, x)), np.sqrt(2 / 64) * plain @ w,
                               rtol=1e-12)
    # Prior function variance: alpha^2 |phi(x)|^2 = (2/D) sum cos^2, which averages to 1 over x.
    assert np.mean(np.sum(np.asarray(scaled.features(x)) ** 2, axis=1)) == pytest.approx(1.0, abs=0.1)


def test_scaled_features_study_config():
    base = LinearConfig()
    c = base.scaled_features()
    assert c.feature_scale == "sqrt(2/D)" and c.paper_steps_continued > c.paper_steps
    # The paper's Adagrad setting itself is unchanged; only the model and the auxiliary runs differ.
    for f in ("paper_step_size", "paper_steps", "paper_stages", "n_particles", "n_selfdist_populations", "seed"):
        assert getattr(c, f) == getattr(base, f), f
    assert dataclasses.replace(c, feature_scale="none", steps=base.steps, stages=base.stages,
                               gd_steps=base.gd_steps, paper_steps_continued=0) == base
