"""experiments.toy_relu (Figure 4): contract keys, the grid posterior's symmetry, quadrant bookkeeping, the
histogram study's bookkeeping (its estimator is tested against the truth in tests/exact/test_toy_relu_kl.py)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from bootens_core.exact import density
from bootens_core import models
from bootens_core.repro.config import MHConfig
from bootens_core.repro.experiments.toy_relu.config import ToyReluConfig
from bootens_core.repro.experiments import toy_relu

# Small but complete: a short MH, few KL evaluations, a coarse grid, a small histogram study.
CFG = dataclasses.replace(
    ToyReluConfig.quick(), mh=MHConfig(proposal_var=0.5, burn_in=500, thin=50, draws=20, chains=4), steps=40,
    kl_every=10,
    grid_points=61, kl_particles=2000, kl_repeats=3, kl_dense_steps=30,
)
CONTRACT = ("kl_monotone_fraction", "kl_final_vs_mh", "kl_final_vs_exact", "kl_mh_vs_exact", "rhat_max", "ess_min")


@pytest.fixture(scope="module")
def result():
    return toy_relu.run(jax.random.key(CFG.seed), CFG, use_cache=False)


def test_contract_keys(result):
    for k in CONTRACT:
        assert np.isfinite(result.summary[k]), k
    assert 0 <= result.summary["kl_monotone_fraction"] <= 1


def test_same_key_same_result(result):
    again = toy_relu.run(jax.random.key(CFG.seed), CFG, use_cache=False)
    assert again.summary == result.summary


def test_typed_summary_is_the_summary_json(result, tmp_path):
    """The typed summary holds exactly the keys the run writes, also read back from disk; the verdicts read
    it as they read the dict."""
    import dataclasses as dc

    from bootens_core.repro import store

    typed = toy_relu.Summary.of(result)
    assert dc.asdict(typed) == result.summary
    assert toy_relu.Summary.of(store.load(store.save(result, tmp_path / "r"))) == typed
    assert ({k: str(v) for k, v in toy_relu.verdicts.evaluate(typed).items()}
            == {k: str(v) for k, v in toy_relu.verdicts.evaluate(result.summary).items()})
    with pytest.raises(ValueError, match="no histogram: not a Summary"):
        toy_relu.Summary.of({k: v for k, v in result.summary.items() if k != "histogram"})


def test_exact_posterior_is_symmetric_under_swapping_the_units(result):
    """f(x; w1, w2) = f(x; w2, w1), and the prior is exchangeable: the grid posterior must be symmetric."""
    lp = result["log_exact"]
    np.testing.assert_allclose(lp, lp.T, atol=1e-9)
    q = result.summary["quadrant_mass_exact"]
    assert sum(q) == pytest.approx(1.0)
    assert q[1] == pytest.approx(q[2], rel=1e-9)


def test_quadrant_mass_counts():
    w = np.array([[1, 1], [1, -1], [-1, 1], [-1, -1], [2, -3]], float)
    np.testing.assert_allclose(toy_relu.experiment._quadrant_mass(w), [0.2, 0.4, 0.2, 0.2])


def test_grid_sampler_reproduces_the_grid_density():
    """Draws from a grid density have that density's quadrant masses (binomial error)."""
    g = density.grid(3.0, 61)
    logp = density.normalise(-0.5 * ((g.points[:, 0] - 1) ** 2 + g.points[:, 1] ** 2).reshape(g.shape), g)
    draws = toy_relu.experiment._sample_grid(jax.random.key(0), logp, g, 20000)
    expect = toy_relu.experiment._grid_quadrant_mass(logp, g)
    got = toy_relu.experiment._quadrant_mass(draws)
    se = np.sqrt(expect * (1 - expect) / 20000)
    assert np.all(np.abs(got - expect) < 4 * se + 1e-3)  # + the cell-splitting at the axes (grid step 0.1)


def test_final_particles_are_the_perturbed_maps_of_their_quadrant(result):
    """Algorithm 1 converges: every final particle has a zero perturbed gradient; the predictive functions
    in the result are those of the final particles."""
    model = models.toy_relu(CFG.prior_var)
    f = np.asarray(models.predict(model, {"w": result["particles"]}, result["x_grid"]))
    np.testing.assert_allclose(f, result["f_ensemble"], rtol=1e-12)


def test_figures_render(result):
    from tests.repro.test_plots import render

    for fig in (toy_relu.figures.posterior(result), toy_relu.figures.kl(result), toy_relu.figures.kl_histogram(result)):
        assert render(fig).startswith(b"\x89PNG")


def test_histogram_study_bookkeeping(result):
    h = result.summary["histogram"]
    t = result["hist_times"]
    # The paper's step and the small step cover the same times; the excluded window is where an overshoot at
    # the largest curvature decays below the tolerance.
    assert t[-1] == pytest.approx(CFG.steps * CFG.step_size)
    assert h["small_step"]["steps"] == CFG.steps * round(CFG.step_size / CFG.small_step_size)
    hl = h["paper_step"]["h_curvature_max"]
    assert hl > 1 > h["small_step"]["h_curvature_max"]
    assert h["overshoot_steps"] == toy_relu.overshoot_steps(hl, CFG.overshoot_tolerance)
    assert abs(1 - hl) ** h["overshoot_steps"] <= CFG.overshoot_tolerance
    for lab in toy_relu.STEP_LABELS:
        k = result[f"hist_kl_{lab}"]
        assert k.shape == (CFG.kl_repeats, t.size) and np.all(np.isfinite(k))
        st = h[lab]
        assert st["net_all"] == pytest.approx(np.mean(k[:, -1] - k[:, 0]))
        assert st["net_all"] < 0
        # Nobody enters the same-sign quadrants, and the same-sign share only falls.
        assert st["enter_fraction"] == 0 and st["returned"] == 0
        s = result[f"same_sign_{lab}"]
        assert np.all(np.diff(s, axis=1) <= 0)
        assert s[:, -1].mean() == pytest.approx(st["same_sign_start"] * (1 - st["leave_fraction"]), rel=0.02)
    # Both steps start from the same replicates: the same particles, the same KL at step 0.
    np.testing.assert_array_equal(result["hist_kl_paper_step"][:, 0], result["hist_kl_small_step"][:, 0])
    # The paper's step, overshooting along the diagonal, sends more same-sign particles across an axis.
    assert h["paper_step"]["leave_fraction"] > h["small_step"]["leave_fraction"]
    assert h["particles_outside"] == 0


def test_tables(result):
    kt, st = toy_relu.verdicts.kl_table(result), toy_relu.verdicts.same_sign_table(result)
    assert kt.shape[1] == 2 and st.shape[1] == 3
    assert "final - minimum (cross-fitted)" in kt.index
