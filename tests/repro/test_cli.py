"""The ``bootens`` command, called in-process."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bootens_core.repro import cli, experiments


def test_list_names_every_experiment(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == len(experiments.REGISTRY)
    for name, mod in experiments.REGISTRY.items():
        line = next(ln for ln in lines if ln.startswith(name))
        assert all(a in line for a in mod.ARTEFACTS)
    assert any(ln.startswith("univariate") for ln in lines) and any(ln.startswith("linear") for ln in lines)


@pytest.fixture(scope="module")
def univariate_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli")
    code = cli.main(["run", "univariate", "--profile", "quick", "--out", str(out)])
    return code, out


def test_run_univariate_writes_its_result(univariate_run):
    code, out = univariate_run
    assert code == 0
    d = out / "univariate"
    assert sorted(p.name for p in d.iterdir()) == [
        "arrays.npz",
        "config.json",
        "provenance.json",
        "summary.json",
    ]
    prov = json.loads((d / "provenance.json").read_text())
    assert prov["profile"] == "quick" and prov["name"] == "univariate"


def test_run_univariate_shows_convergence(univariate_run):
    """Figure 1's contract. After 200 steps the contraction |1 - h lambda|^200 is negligible, so the 200 final
    particles are exact posterior samples: the mean error (in posterior sd) is ~ N(0, 1/200) and the sd ratio
    ~ N(1, 1/(2 * 199)); 4 of those scales, and the KS test not rejected at 1e-3."""
    _, out = univariate_run
    s = json.loads((out / "univariate" / "summary.json").read_text())
    for key in ("mean_error_sd", "sd_ratio", "ks_pvalue"):
        assert key in s
    k = s["n_particles"]
    assert k == 200
    assert s["contraction_per_step"] ** s["steps"] < 1e-10
    assert s["mean_error_sd"] < 4 / np.sqrt(k)
    assert abs(s["sd_ratio"] - 1) < 4 / np.sqrt(2 * (k - 1))
    assert s["ks_pvalue"] > 1e-3


def test_run_prints_the_summary(tmp_path, capsys):
    assert cli.main(["run", "univariate", "--profile", "quick", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary == json.loads((tmp_path / "univariate" / "summary.json").read_text())
    assert "wrote" in captured.err


def test_quiet_run_prints_no_summary(tmp_path, capsys):
    assert cli.main(["run", "univariate", "--quiet", "--out", str(tmp_path), "--seed", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads((tmp_path / "univariate" / "config.json").read_text())["seed"] == 3


def test_unknown_experiment_exits_2_and_lists_the_known_ones(tmp_path, capsys):
    assert cli.main(["run", "nonesuch", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown experiment 'nonesuch'" in err
    for name in experiments.REGISTRY:
        assert name in err
    assert not (tmp_path / "nonesuch").exists()


def test_bad_profile_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "univariate", "--profile", "huge"])
    assert info.value.code == 2
    assert "huge" in capsys.readouterr().err


def test_experiments_get_unknown():
    with pytest.raises(KeyError, match="known are classification, deep-relu, linear, practice, theory, toy-relu, uci, "
                                       "univariate"):
        experiments.get("nonesuch")


def test_uci_stored_only_summarises_finished_cells(tmp_path, monkeypatch, capsys):
    import jax

    from bootens_core.repro import harness
    from bootens_core.repro.experiments.uci.config import UCIConfig
    from bootens_core.repro.experiments import uci

    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["run", "uci", "--profile", "quick", "--quiet", "--datasets", "yacht", "--methods", "gp",
            "--set", "max_splits=2", "--stored-only", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2  # nothing stored yet: one clear error, nothing computed
    assert "no finished cell" in capsys.readouterr().err
    cfg = UCIConfig.quick()
    cfg = type(cfg)(**{**cfg.__dict__, "datasets": ("yacht",), "methods": ("gp",), "max_splits": 2})
    rec = {f: 0 for f in harness.CELL_FIELDS} | {
        "dataset": "yacht", "split": 1, "method": "gp", "hidden_layers": 0, "test_rmse": 0.5, "test_mnll": 1.0,
        "coverage95": 0.9, "wall_s": 2.5, "diverged_particles": 0, "selection": "fitted with the model"}
    uci.experiment._cell_store(jax.random.key(cfg.seed), cfg).put(harness.Cell("yacht", 1, "gp"), rec)
    assert cli.main(argv) == 0
    s = json.loads((tmp_path / "out" / "uci" / "summary.json").read_text())
    prov = json.loads((tmp_path / "out" / "uci" / "provenance.json").read_text())
    assert s["n_cells"] == 1 and s["cells_missing"] == ["yacht/gp/split-0"]
    assert prov["wall_time_s"] == 2.5 and prov["assembled_from_stored_cells"] is True
    rmse = next(r for r in s["rows"] if r["metric"] == "rmse")
    assert rmse["mean"] == 0.5 and rmse["n_splits"] == 1


def test_stored_only_refused_for_other_experiments(tmp_path, capsys):
    assert cli.main(["run", "univariate", "--stored-only", "--quiet", "--out", str(tmp_path)]) == 2
    assert "--stored-only is for experiments stored cell by cell" in capsys.readouterr().err


@pytest.mark.parametrize("make_out", [
    lambda p: p / "a-file",                 # --out names an existing file
    lambda p: p / "a-file" / "under-it",    # --out cannot be created (its parent is a file)
])
@pytest.mark.parametrize("command", [["run", "univariate", "--quiet"], ["bench", "--quick", "--quiet"]])
def test_unwritable_out_is_one_line_before_any_work(tmp_path, capsys, make_out, command):
    (tmp_path / "a-file").write_text("not a folder")
    out = make_out(tmp_path)
    assert cli.main([*command, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"bootens: --out {out}:"), captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_default_out_is_not_beside_the_committed_record():
    parser_default = cli.DEFAULT_OUT
    assert not parser_default.startswith("results")
    import subprocess
    import sys

    helptext = subprocess.run([sys.executable, "-m", "bootens_core.repro.cli", "run", "--help"], capture_output=True,
                              text=True, check=True).stdout
    assert f"./{cli.DEFAULT_OUT}" in helptext and "committed record" in helptext


def test_main_computes_float32_products_in_float32(monkeypatch):
    import jax

    from bootens_core.repro import store

    monkeypatch.delenv("JAX_DEFAULT_MATMUL_PRECISION", raising=False)
    before = jax.config.jax_default_matmul_precision
    try:
        jax.config.update("jax_default_matmul_precision", None)
        assert cli.main(["list"]) == 0
        assert jax.config.jax_default_matmul_precision == cli.MATMUL_PRECISION == "highest"
        assert store.provenance()["matmul_precision"] == "highest"
        # the user's environment variable decides when it is set
        jax.config.update("jax_default_matmul_precision", None)
        monkeypatch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "tensorfloat32")
        assert cli.main(["list"]) == 0
        assert jax.config.jax_default_matmul_precision is None
    finally:
        jax.config.update("jax_default_matmul_precision", before)


def test_float32_products_are_the_cpu_default():
    # The setting changes GPU numbers only: on a CPU every float32 product is already float32, so records made
    # before it and the chapters' CPU numbers stay as they were (bitwise, a 4-layer network's loss gradient).
    import jax
    import jax.numpy as jnp

    from bootens_core import models

    if jax.devices()[0].platform != "cpu":
        pytest.skip("the CPU's default")
    m = models.mlp(13, (50, 50, 50, 50))
    kx, kp = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (200, 13), jnp.float32)
    params = [{"w": jax.random.normal(jax.random.fold_in(kp, 2 * i), (a, b), jnp.float32),
               "b": jax.random.normal(jax.random.fold_in(kp, 2 * i + 1), (b,), jnp.float32)}
              for i, (a, b) in enumerate(zip((13, 50, 50, 50, 50), (50, 50, 50, 50, 1)))]

    def grads():
        g = jax.jit(jax.grad(lambda p: jnp.sum(m.apply(p, x) ** 2)))(params)
        return np.concatenate([np.ravel(v) for v in jax.tree.leaves(g)])

    default = grads()
    with jax.default_matmul_precision("highest"):
        highest = grads()
    assert np.all(np.isfinite(default)) and np.array_equal(default, highest)
