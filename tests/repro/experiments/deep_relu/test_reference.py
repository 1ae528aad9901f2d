"""experiments.deep_relu.reference: the resumable NUTS reference samples the experiment's own posterior from
its own starting points (its draws are the experiment's NUTS draws), its diagnostics judge convergence as
ArviZ's R-hat and ESS say on draws of known law, and the command runs, resumes and refuses other settings."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest

from bootens_core.repro import cli
from bootens_core.repro.config import MHConfig, NUTSConfig
from bootens_core.repro.experiments import deep_relu
from bootens_core.repro.experiments.deep_relu import reference
from bootens_core.repro.experiments.deep_relu.config import DeepReluConfig
from bootens_core.samplers import resumable

TINY = DeepReluConfig(
    n_data=20, depth=2, width=5,
    mh=MHConfig(proposal_var=0.01, chains=2, burn_in=1, thin=1, draws=2),
    nuts=NUTSConfig(chains=2, warmup=4, draws=4, max_tree_depth=4, target_accept=0.9, chain_method="auto"),
    n_particles=2, steps=2, stages=(0, 2), agreement_every=2, x_grid_points=9,
)
TINY_SETS = ["--set", "n_data=20", "--set", "depth=2", "--set", "width=5", "--set", "nuts.chains=2",
             "--set", "nuts.warmup=4", "--set", "nuts.max_tree_depth=4", "--set", "x_grid_points=9"]


@pytest.mark.slow  # the whole experiment at a tiny size: about 20 s of CPU, nearly all of it compilation
def test_the_reference_draws_are_the_experiments_nuts_draws(tmp_path):
    """The truth: the experiment's own run (its data, prior, NUTS call and keys); the reference, run in two
    chunks, keeps ``f(x_grid)`` of the same draws (in float32)."""
    key = jax.random.key(TINY.seed)
    exp = deep_relu.run(key, TINY, use_cache=False)
    progress, diag = reference.run_reference(key, TINY, tmp_path / "ref", chunk_draws=2,
                                             n_draws=TINY.nuts.draws)
    run = resumable.read_run(tmp_path / "ref")
    want = exp["f_nuts"].reshape(TINY.nuts.chains, TINY.nuts.draws, TINY.x_grid_points)
    assert run.record.shape == want.shape and progress.chunks == 2 and progress.stopped == "done"
    np.testing.assert_allclose(run.record, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())
    assert diag.draws == TINY.nuts.draws and diag.chains == TINY.nuts.chains
    assert diag.divergences == exp.summary["nuts_divergences"]
    assert diag.mean_num_steps == pytest.approx(exp.summary["nuts_mean_num_steps"])
    assert run.manifest["identity"]["caller"] == json.loads(json.dumps(reference.identity(TINY)))
    # Read back for the experiment's configuration, the reference judges the run as its own NUTS did: the same
    # draws give the same summary (up to the record's float32) and the same verdicts.
    ref = reference.read(tmp_path / "ref", TINY)
    assert ref.config == TINY and ref.diagnostics == diag and ref.f.dtype == np.float64
    judged = reference.against(exp, ref)
    assert judged.summary.keys() == exp.summary.keys()
    for k, v in exp.summary.items():
        if k in ("nuts_sampler", "nuts_rhat_max", "nuts_rhat_mean", "nuts_ess_min", "nuts_accept_rate",
                 "rhat_max", "rhat_mean", "ess_min"):
            continue  # the sampler's description; its diagnostics below
        if isinstance(v, (list, float)):
            np.testing.assert_allclose(judged.summary[k], v, rtol=1e-4, err_msg=k)
        else:
            assert judged.summary[k] == v, k
    assert judged.summary["rhat_max"] == diag.rhat_max and judged.summary["ess_min"] == diag.ess_bulk_min
    np.testing.assert_allclose(judged["f_nuts"], exp["f_nuts"], rtol=2e-6, atol=2e-6 * np.abs(want).max())
    np.testing.assert_array_equal(judged["f_stages"], exp["f_stages"])
    # A configuration of other data, network or grid is refused, naming what differs; NUTS's settings may differ.
    for change, named in (({"noise_var": 0.2}, "noise_var: 0.1 there, 0.2 here"), ({"width": 6}, "width"),
                          ({"x_grid_points": 11}, "x_grid_points"), ({"seed": 1}, "seed")):
        with pytest.raises(ValueError, match=named):
            reference.read(tmp_path / "ref", dataclasses.replace(TINY, **change))
    other_nuts = dataclasses.replace(TINY, nuts=dataclasses.replace(TINY.nuts, chains=3, max_tree_depth=6))
    assert reference.read(tmp_path / "ref", other_nuts).config == TINY
    # the run's own noise keys never survive into a judgement by another reference: a reference too short for a
    # sample of the ensemble's size (here 2 particles against 8 draws: long enough) is judged in its own units
    with_own = dataclasses.replace(exp, summary={**exp.summary, "sample_noise_mad": 123.0, "sample_noise_log_sd": 1.0,
                                                 "sample_noise_n": 2, "sample_noise_repeats": 1})
    assert reference.against(with_own, ref).summary["sample_noise_mad"] != 123.0
    short = ref._replace(f=ref.f[:, :1])  # 2 draws: no sample of 2 particles against the rest
    with warnings.catch_warnings():  # statistics of single draws: NaN, as they should be
        warnings.simplefilter("ignore", RuntimeWarning)
        assert "sample_noise_mad" not in reference.against(with_own, short).summary
    # a run without the particles of every recorded step (older code) cannot be judged again: said so
    old_run = dataclasses.replace(exp, arrays={k: v for k, v in exp.arrays.items() if k != "f_along"})
    with pytest.raises(ValueError, match="lacks f_along"):
        reference.against(old_run, ref)


def _record(f: np.ndarray, num_steps: np.ndarray) -> resumable.RunRecord:
    c, n = f.shape[:2]
    manifest = {"identity": {"sampler": {"max_tree_depth": 3}}}
    return resumable.RunRecord(manifest, f.astype(np.float32), np.ones((c, n)), num_steps,
                               np.zeros((c, n), bool), np.zeros((c, n)))


def test_diagnostics_on_draws_of_known_law():
    """Independent N(0, 1) draws: R-hat near 1 and bulk ESS near the number of draws (its sampling sd is
    small against the bounds); one chain shifted by 1 sd: R-hat far above 1.01, not converged."""
    rng = np.random.default_rng(0)
    f = rng.normal(size=(4, 500, 3))
    steps = np.full((4, 500), 5)
    steps[:, :100] = 7  # 2**3 - 1: a fifth of the draws at the depth limit
    d = reference.diagnostics(_record(f, steps))
    assert d.rhat_max < 1.01 and 1500 < d.ess_bulk_min < 2500 and d.converged
    assert d.ess_bulk_per_draw == pytest.approx(d.ess_bulk_min / 2000)
    assert d.tree_depth_hit_fraction == pytest.approx(0.2) and d.mean_num_steps == pytest.approx(5.4)
    f[0] += 1.0
    bad = reference.diagnostics(_record(f, steps))
    assert bad.rhat_max > 1.1 and not bad.converged
    assert not reference.diagnostics(_record(rng.normal(size=(4, 500, 3)), steps), target_ess=3000).converged
    few = reference.diagnostics(_record(f[:, :3], steps[:, :3]))
    assert np.isnan(few.rhat_max) and not few.converged


def test_command_runs_resumes_and_refuses_other_settings(tmp_path, capsys):
    out = str(tmp_path)
    args = ["deep-relu-reference", "--out", out, *TINY_SETS, "--chunk-draws", "4", "--quiet"]
    assert cli.main([*args, "--draws", "4"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["warmup_done"], first["draws"], first["chains"]) == (4, 4, 2)
    where = tmp_path / reference.DIRNAME
    manifest = json.loads((where / resumable.MANIFEST).read_text())
    assert {"git_commit", "device", "versions", "profile"} <= set(manifest["chunks"][0]["note"])
    # "auto" is sequential on a CPU: naming the method it resolves to resumes the same run.
    assert cli.main([*args, "--draws", "4", "--set", "nuts.chain_method=sequential"]) == 0
    assert json.loads(capsys.readouterr().out)["draws"] == 4
    # A budget already spent: nothing more is run, the diagnostics so far are printed.
    assert cli.main([*args, "--draws", "8", "--time-budget", "1e-9"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["draws"] == 4 and "time budget spent" in captured.err
    # --status reads what is kept, without the sampler.
    assert cli.main(["deep-relu-reference", "--out", out, "--status"]) == 0
    assert json.loads(capsys.readouterr().out) == first
    # Other settings in the same directory: one line, status 2, nothing changed.
    assert cli.main([*args, "--draws", "8", "--set", "noise_var=0.2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a run of other settings (caller.noise_var: 0.1 there, 0.2 here" in err[0]
    assert json.loads((where / resumable.MANIFEST).read_text()) == manifest


COMMITTED = Path(__file__).resolve().parents[4] / "results" / "paper" / "deep-relu" / reference.DIRNAME


def test_the_committed_reference_is_converged_and_serves_every_profile():
    """results/paper/deep-relu/nuts-reference: the chapter's reference, read for the quick and the paper
    profiles (they differ in NUTS's settings only) and converged by the targets it was run to."""
    if not COMMITTED.is_dir():
        pytest.skip("no committed reference in this checkout")
    for cfg in (DeepReluConfig.quick(), DeepReluConfig.paper()):
        ref = reference.read(COMMITTED, cfg)
        assert ref.f.shape == (10, ref.diagnostics.draws, cfg.x_grid_points) and ref.diagnostics.draws >= 4
        # the paper profile's NUTS settings (and its draws), the rest the configuration's
        assert ref.config == dataclasses.replace(cfg, nuts=dataclasses.replace(
            DeepReluConfig.paper().nuts, draws=ref.diagnostics.draws))
        d = ref.diagnostics
        assert d.converged and d.rhat_max < reference.TARGET_RHAT and d.ess_bulk_min >= reference.TARGET_ESS
    with pytest.raises(ValueError, match="n_data: 40 there, 30 here"):
        reference.read(COMMITTED, DeepReluConfig(n_data=30))


def test_reading_a_directory_without_a_run_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a resumable NUTS run"):
        reference.read(tmp_path, TINY)
