"""bootens_core.repro.performance.profiling: compile counting against jit's own cache, the profile document, CI records."""

import json

import jax
import jax.numpy as jnp
import pandas as pd
import pytest

from bootens_core.repro.performance import figures, profiling, verdicts
from bootens_core.repro.performance.config import ProfileConfig


def test_compile_counter_counts_one_compilation_per_new_shape_and_none_on_a_cache_hit():
    f = jax.jit(lambda x: jnp.tanh(x) * 2.0 + 1.0)
    a, b = jnp.ones(7), jnp.ones(9)
    with profiling.CompileCounter() as first:
        f(a).block_until_ready()
    with profiling.CompileCounter() as again:
        f(a + 1.0).block_until_ready()  # same shape: jit's cache; the eager add compiles its own tiny program
    with profiling.CompileCounter() as other:
        f(b).block_until_ready()
    assert first.compiles == 1 and first.seconds > 0
    with profiling.CompileCounter() as hit:
        f(a).block_until_ready()
    assert hit.compiles == 0 and hit.seconds == 0
    assert other.compiles == 1
    assert again.compiles <= 1  # at most the eager `a + 1.0`


def test_counters_nest_and_timed_call_splits_the_wall_time():
    g = jax.jit(lambda x: jnp.sin(x) @ x.T)
    x5, x6 = jnp.ones((5, 3)), jnp.ones((6, 3))  # made outside: creating them compiles too
    with profiling.CompileCounter() as outer:
        row = profiling.timed_call(lambda: g(x5))
        with profiling.CompileCounter() as inner:
            g(x6).block_until_ready()
    assert row["compiles"] == 1 and inner.compiles == 1
    assert outer.compiles == row["compiles"] + inner.compiles
    assert row["wall_s"] == pytest.approx(row["compile_s"] + row["compute_s"])


def test_line_search_step_reports_both_rates_and_their_paired_ratio():
    cfg = ProfileConfig(line_search_rows=40, line_search_particles=4, line_search_steps=3, repeats=3)
    out = profiling.line_search_step(jax.random.key(0), cfg)
    rates = out["particle_steps_per_s"]
    assert set(rates) == {"ensemble", "vmapped"} and all(v > 0 for v in rates.values())
    assert out["speedup_spread"]["min"] <= out["speedup"] <= out["speedup_spread"]["max"]
    assert out["shape"]["rows"] == 40


def test_profile_of_the_mcmc_references_has_two_calls_each_and_draws_a_figure():
    cfg = ProfileConfig(uci_methods=(), mcmc_warmup=20, mcmc_draws=10, mh_burn_in=10, mh_thin=1,
                        line_search_rows=40, line_search_particles=2, line_search_steps=2, repeats=1)
    doc = profiling.measure(jax.random.key(1), cfg)
    stages = [(c["stage"], c["call"]) for c in doc["calls"]]
    assert stages == [("NUTS (NumPyro)", 1), ("NUTS (NumPyro)", 2), ("Metropolis-Hastings", 1),
                      ("Metropolis-Hastings", 2)]
    assert all(c["compiles"] > 0 for c in doc["calls"] if c["call"] == 1)
    table = verdicts.profile_table(doc)
    assert list(table.columns) == ["on", "wall s", "compile s", "compute s", "XLA compiles"]
    fig = figures.calls(doc)
    assert len(fig.axes[0].patches) == 2 * len(doc["calls"])


def test_ci_records_load_and_bad_ones_name_the_file(tmp_path):
    assert profiling.load_ci_records(tmp_path) == {}
    assert verdicts.ci_timings_table({}).empty
    rec = {"stages": {"test-unit": 300, "book": 700}, "total_s": 1100, "machine": "x86_64, 2 cores",
           "commit": "abc", "date": "2026-11-23"}
    (tmp_path / "local.json").write_text(json.dumps(rec))
    recs = profiling.load_ci_records(tmp_path)
    assert recs == {"local": rec}
    table = verdicts.ci_timings_table(recs | {"older": {**rec, "date": "2026-11-01", "stages": {"test": 900}}})
    assert list(table.index) == ["older", "local"]  # by date
    assert table.loc["local", "total (s)"] == 1100 and table.loc["local", "unit (s)"] == 300
    assert table.loc["older", "unit (s)"] is pd.NA and table.loc["older", "test (s)"] == 900
    (tmp_path / "bad.json").write_text(json.dumps({"total_s": 3}))
    with pytest.raises(ValueError, match="bad.json is not a CI timing record"):
        profiling.load_ci_records(tmp_path)


def test_a_second_sghmc_cell_compiles_nothing_even_when_a_restart_diverged():
    """The profile's SGHMC cells (Boston, 2 restarts x 5 draws) on the key the profile gives them: on split 1 a
    restart diverges, and the prediction of the kept draws must not compile again for their new number."""
    import dataclasses
    import os
    from pathlib import Path

    mirror = os.environ.get("BOOTENS_DATA_DIR") or str(Path(__file__).resolve().parents[3].parent / "shared"
                                                         / "data" / "uci")
    if not Path(mirror).is_dir():
        pytest.skip(f"no UCI mirror at {mirror}")
    cfg = dataclasses.replace(ProfileConfig(), uci_methods=("sghmc-1",))
    k_uci = jax.random.split(jax.random.key(cfg.seed), 3)[0]  # as profiling.measure gives the UCI calls
    rows = profiling._uci_calls(k_uci, cfg)
    assert [r["call"] for r in rows] == [1, 2] and rows[0]["compiles"] > 0
    assert rows[1]["compiles"] == 0


def test_measure_groups_times_both_ways_alternating_with_the_same_scores(monkeypatch):
    # A tiny UCI cell (Yacht, 4 particles, 1 L-BFGS step of 2 iterations, 2 values of sigma^2) twice each way:
    # the ways alternate (grouped first on repeat 0, all at once first on repeat 1), every row splits its
    # seconds, and both ways compute the same cell and fit (their scores equal to float rounding). The
    # estimator is left out here (its defaults take tens of seconds); the summary's ratio is all over grouped.
    import dataclasses

    from bootens_core.repro import config
    from bootens_core.repro.experiments.uci.config import UCIConfig

    pytest.importorskip("sklearn")
    cfg = config.for_profile(UCIConfig, "quick")
    cfg = dataclasses.replace(config.replace(config.replace(cfg, "lbfgs.steps", 1), "lbfgs.iters_per_step", 2),
                              n_particles=4, noise_grid=(0.01, 0.1))
    doc = profiling.measure_groups(jax.random.key(0), cfg, "yacht", 1, repeats=2, estimator=False)
    assert [(r["repeat"], r["way"]) for r in doc["rows"]] == [
        (0, "grouped"), (0, "all at once"), (1, "all at once"), (1, "grouped")]
    for r in doc["rows"]:
        assert r["wall_s"] >= r["compute_s"] >= 0 and r["compile_s"] >= 0
        # 4 particles a sigma^2 fit in any cache: the library steps them at once both ways
        assert r["groups"] and all(g is None for _, g in r["groups"])
    first = doc["rows"][0]
    for r in doc["rows"][1:]:
        assert r["rmse"] == pytest.approx(first["rmse"], rel=1e-4) and r["mnll"] == pytest.approx(first["mnll"], rel=1e-4)
    (s,) = doc["summary"]
    assert s["speedup"] == pytest.approx(s["all_compute_s"] / s["grouped_compute_s"])
    table = verdicts.groups_table(doc)
    assert len(table) == 4 and set(table.index.get_level_values("particles")) == {"grouped", "all at once"}
    assert set(table["all at once ÷ grouped (compute)"]) == {round(s["speedup"], 2)}
    with pytest.raises(ValueError, match="repeats"):
        profiling.measure_groups(jax.random.key(0), cfg, "yacht", 1, repeats=0, estimator=False)
    with pytest.raises(ValueError, match="hidden layers"):
        profiling.measure_groups(jax.random.key(0), cfg, "yacht", 2, estimator=False)


def test_first_fit_is_measured_in_a_fresh_process_with_its_programs(tmp_path, monkeypatch):
    """bootens bench --case first-fit on a tiny estimator: the first fit compiles (the driver's programs are
    named in the compile log, largest first), a second fit of the same shapes compiles nothing, the summary
    reads the rows, and the document is written."""
    from bootens_core.repro import cli

    settings = {"hidden_layer_sizes": [4], "n_particles": 2, "steps": 2, "noise_grid": [0.1, 1.0],
                "optimizer": "adam", "learning_rate": 0.01}
    doc = profiling.measure_first_fit(settings)
    by = {r["what"]: r for r in doc["rows"]}
    assert list(by) == ["import", "first fit", "second fit, same shapes", "fit on 90% of the rows", "predict"]
    first, second = by["first fit"], by["second fit, same shapes"]
    assert first["compiles"] > 0 and first["compile_s"] > 0 and 0 < first["backend_s"] <= first["compile_s"]
    assert second["compiles"] == 0
    secs = [sec for _, sec in first["programs"]]
    assert secs == sorted(secs, reverse=True) and any("run_chunk" in name for name, _ in first["programs"])
    assert doc["summary"]["first_fit_s"] == first["wall_s"] and doc["summary"]["second_fit_s"] == second["wall_s"]
    assert doc["settings"] == settings
    with pytest.raises(ValueError, match="the first-fit process failed"):
        profiling.measure_first_fit({"n_particles": -1})
    # the command writes the document (the measurement itself is the one above)
    monkeypatch.setattr(profiling, "measure_first_fit", lambda settings: {**doc, "settings": settings})
    assert cli.main(["bench", "--case", "first-fit", "--quick", "--quiet", "--out", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "first-fit.json").read_text())
    assert written["case"] == "first-fit" and written["settings"]["n_particles"] == 4 and "device" in written
