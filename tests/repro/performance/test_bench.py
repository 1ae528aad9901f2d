"""The particle-throughput benchmark: FLOP and byte counts, the roofline, the baselines' particles, bench.json."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bootens_core.repro import cli
from bootens_core.repro.performance import bench, figures, verdicts
from bootens_core import perturb


def test_step_flops_hand_count():
    # 2 -> 3 -> 1 on n = 4 rows. Forward: 2*4*2*3 = 48 and 2*4*3*1 = 24. Backward: the same two weight
    # gradients (72) and the input gradient of the second layer only (24): the inputs are data.
    f = bench.step_flops((2, 3, 1), 4)
    assert f == {"forward": 72, "backward": 96, "total": 168}


def test_step_bytes_and_intensity_hand_count():
    # Layer 1 (4x2 @ 2x3): 8 + 6 + 12 = 26 elements per product, 2 products (forward, weight gradient).
    # Layer 2 (4x3 @ 3x1): 12 + 3 + 4 = 19 elements per product, 3 products. 109 float32 = 436 bytes.
    assert bench.step_bytes((2, 3, 1), 4) == 436
    assert bench.step_bytes((2, 3, 1), 4, itemsize=8) == 872
    assert bench.arithmetic_intensity((2, 3, 1), 4) == pytest.approx(168 / 436)


def test_step_flops_agrees_with_xla_cost_analysis():
    """XLA's own count of the compiled gradient (matmuls plus elementwise work) is a little above ours."""
    p = bench.setup(jax.random.key(0), 5, 256, 2, 1, width=64)
    one = jax.tree.map(lambda a: a[0], (p["state"].params, p["state"].perturbation))

    def loss(params, pert):
        return -perturb.perturbed_log_joint(p["model"], params, p["x"], pert, p["noise_var"])

    cost = jax.jit(jax.grad(loss)).lower(*one).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    ours = bench.step_flops(p["widths"], 256)["total"]
    assert 1.0 <= cost["flops"] / ours <= 1.15


def test_widths_and_bad_input():
    assert bench.widths(13, 4) == (13, 50, 50, 50, 50, 1)
    with pytest.raises(ValueError, match="in_dim"):
        bench.widths(0, 1)
    with pytest.raises(ValueError, match="two positive"):
        bench.step_flops((3,), 10)


def test_roofline_is_the_lesser_bound():
    assert bench.roofline(1e12, 1e11, 2.0) == 2e11  # memory bound: 1e11 B/s x 2 FLOP/B
    assert bench.roofline(1e12, 1e11, 50.0) == 1e12  # compute bound
    with pytest.raises(ValueError, match="positive"):
        bench.roofline(1e12, 0.0, 2.0)


def test_spread():
    s = bench.spread([3.0, 1.0, 2.0, 4.0])
    assert s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 4.0 and s["q25"] == 1.75 and s["q75"] == 3.25


def test_jax_loop_and_vmapped_training_give_the_same_particles():
    p = bench.setup(jax.random.key(3), 3, 16, 2, 4, width=8, learning_rate=1e-2)
    together = bench.vmapped_train(p, 7)
    alone = bench.jax_loop_train(p, 7)
    assert len(alone) == 4
    moved = False
    for i, st in enumerate(alone):
        for a, b, s0 in zip(jax.tree.leaves(together.params), jax.tree.leaves(st.params),
                            jax.tree.leaves(p["state"].params), strict=True):
            assert a.dtype == jnp.float32
            np.testing.assert_allclose(np.asarray(b)[0], np.asarray(a)[i], rtol=1e-5, atol=1e-6)
            moved |= not np.allclose(np.asarray(a)[i], np.asarray(s0)[i])
    assert moved  # the particles did train
    assert int(together.step) == 7


def test_torch_loop_gives_the_same_particles():
    pytest.importorskip("torch")
    p = bench.setup(jax.random.key(3), 3, 16, 2, 3, width=8, learning_rate=1e-2)
    ref = bench.jax_loop_train(p, 7)
    got = bench.torch_loop_train(p, 7)
    for i, st in enumerate(ref):
        for a, b in zip(jax.tree.leaves(st.params), got[i], strict=True):
            np.testing.assert_allclose(b, np.asarray(a)[0], rtol=1e-4, atol=1e-5)


def test_bad_config_is_named():
    cfg = bench.Config.quick()
    import dataclasses

    with pytest.raises(ValueError, match="unknown bench dataset"):
        bench.measure(jax.random.key(0), dataclasses.replace(cfg, datasets=("mnist",)))
    with pytest.raises(ValueError, match="particle counts"):
        bench.measure(jax.random.key(0), dataclasses.replace(cfg, ks=(0,)))


@pytest.mark.skipif(not os.environ.get("BOOTENS_DATA_DIR"), reason="needs the UCI files (BOOTENS_DATA_DIR)")
def test_shapes_are_those_of_the_uci_splits():
    from bootens_core.data import uci

    for name, (d, n) in bench.SHAPES.items():
        assert uci.load(name, 0).x_train.shape == (n, d)


def test_cli_writes_the_bench_json_contract(tmp_path: Path, capsys):
    code = cli.main(["bench", "--k", "1", "4", "--models", "1", "--datasets", "boston", "--steps", "3",
                     "--repeats", "2", "--max-rows", "64", "--loop-particles", "2", "--quiet", "--out",
                     str(tmp_path)])
    assert code == 0
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["device"]["platform"] == jax.devices()[0].platform
    assert doc["versions"]["jax"] == jax.__version__ and "torch" in doc["versions"]
    assert [(r["model"], r["dataset"], r["k"]) for r in doc["rows"]] == [("mlp-1x50", "boston", 1),
                                                                          ("mlp-1x50", "boston", 4)]
    for r in doc["rows"]:
        assert set(bench.ROW_KEYS) <= set(r)
        for key in ("particle_steps_per_s", "flops_per_s", "speedup_vs_jax_loop", "roofline_fraction"):
            assert math.isfinite(r[key]) and r[key] > 0
        assert r["flops_per_s"] == pytest.approx(r["particle_steps_per_s"] * bench.step_flops((13, 50, 1), 64)["total"])
        # the row's bandwidth roof is the measured bandwidth of the cache level it names (its working set's)
        level = {lev["level"]: lev["bytes_per_s"] for lev in doc["peak"]["levels"]}
        assert r["roofline_bandwidth_bytes_per_s"] == level[r["roofline_level"]]
        assert r["roofline_flops_per_s"] == pytest.approx(bench.roofline(
            doc["peak"]["matmul_flops_per_s"], r["roofline_bandwidth_bytes_per_s"], r["arithmetic_intensity"]))
        # the fraction counts XLA's FLOPs of the compiled step (flops_per_s counts the matmuls alone)
        assert r["roofline_fraction"] == pytest.approx(
            r["particle_steps_per_s"] * r["xla_flops_per_particle_step"] / r["roofline_flops_per_s"])
        assert r["particle_steps_per_s_spread"]["min"] <= r["particle_steps_per_s"] <= r["particle_steps_per_s_spread"]["max"]
        if doc["versions"]["torch"] is None:
            assert r["speedup_vs_torch_loop"] is None
    assert doc["complete"] is True and doc["profile"] == "quick"


def test_a_bench_cut_off_keeps_the_rows_it_measured(tmp_path: Path, monkeypatch, capsys):
    """bench.json is rewritten after every row: an interrupt after the first of two rows leaves that row,
    marked incomplete (as a device command stopped at its time limit would)."""
    seen = []
    real = bench.measure

    def cut_after_one_row(key, cfg, *, progress=False, on_row=None):
        def once(doc):
            on_row(doc)
            seen.append(doc)
            raise KeyboardInterrupt

        return real(key, cfg, progress=progress, on_row=once)

    monkeypatch.setattr(bench, "measure", cut_after_one_row)
    code = cli.main(["bench", "--k", "1", "4", "--models", "1", "--datasets", "boston", "--steps", "2",
                     "--repeats", "1", "--max-rows", "32", "--loop-particles", "1", "--no-torch", "--quiet",
                     "--out", str(tmp_path)])
    assert code == 130 and "bench its measured rows" in capsys.readouterr().err
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert len(seen) == 1 and doc["complete"] is False and doc["profile"] == "quick"
    assert [(r["dataset"], r["k"]) for r in doc["rows"]] == [("boston", 1)]


def test_cli_bench_bad_dataset(tmp_path: Path, capsys):
    assert cli.main(["bench", "--datasets", "mnist", "--quiet", "--out", str(tmp_path)]) == 2
    assert "unknown bench dataset" in capsys.readouterr().err


def _doc(platform: str, rows: list[dict]) -> dict:
    return {"device": {"platform": platform, "kind": platform, "cpu_model": "test cpu"}, "rows": rows}


def _row(model: str, dataset: str, k: int, speedup: float, roof: float) -> dict:
    rate = 100.0 * k
    return {"model": model, "dataset": dataset, "k": k, "n": 64, "hidden_layers": int(model[4]),
            "particle_steps_per_s": rate, "particle_steps_per_s_spread": {"min": 0.9 * rate, "max": 1.1 * rate},
            "flops_per_s": 2e9, "speedup_vs_jax_loop": speedup, "speedup_vs_torch_loop": None,
            "roofline_fraction": roof, "roofline_bound": "memory"}


def test_verdicts_say_what_was_measured_with_the_devices():
    cpu = _doc("cpu", [_row("mlp-1x50", "boston", 200, 1.6, 0.5), _row("mlp-4x50", "boston", 200, 1.2, 0.7),
                       _row("mlp-1x50", "boston", 50, 1.9, 0.4), _row("mlp-4x50", "boston", 50, 1.0, 0.3)])
    cpu["rows"][0]["speedup_vs_torch_loop"] = 12.0
    v = verdicts.evaluate({"cpu": cpu})
    assert str(v["loop"]) == ("cpu (test cpu, None cores), k = 200: 1.2x to 1.6x the JAX loop, 12x to 12x the "
                              "PyTorch loop")
    # _row's rate grows with k: the largest k is the best k of both networks
    assert str(v["scaling"]) == "cpu: at k = 200, 1 to 1 of the best k's particle-steps/s"
    assert str(v["roofline"]) == "cpu: at most 70% of the roof"
    gpu = _doc("gpu", [_row("mlp-4x50", "protein", 10, 5.0, 0.2)])
    assert "gpu (gpu), k = 10: 5x to 5x the JAX loop, no PyTorch loop measured" in str(
        verdicts.evaluate({"cpu": cpu, "h200": gpu})["loop"]).replace("h200", "gpu")
    assert str(verdicts.evaluate({})["loop"]) == "no benchmark document"


def test_table_and_figure_of_a_document():
    doc = _doc("cpu", [_row("mlp-1x50", "boston", k, 1.0, 0.5) for k in (1, 10)]
               + [_row("mlp-4x50", "protein", k, 1.0, 0.5) for k in (1, 10)])
    table = verdicts.table(doc)
    assert len(table) == 4 and table.loc[("mlp-1x50", "boston (64)", 10), "x PyTorch loop"] == "—"
    fig = figures.throughput({"this": doc, "other": doc})
    assert len(fig.axes) == 6
    with pytest.raises(ValueError, match="no benchmark"):
        figures.throughput({})


def test_load_records(tmp_path: Path):
    assert bench.load_records(tmp_path / "none") == {}
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "bench.json").write_text(json.dumps(_doc("gpu", [])))
    assert list(bench.load_records(tmp_path)) == ["h200"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "bench.json").write_text("{}")
    with pytest.raises(ValueError, match="bad/bench.json is not a bench.json"):
        bench.load_records(tmp_path)


def test_uci_cell_flops_hand_count():
    # Yacht-sized: 6 inputs, 1 layer of 50; 3 validation fits on 200 rows + the final fit on 250 rows,
    # 10 particles, 4 iterations: 10 * 4 * (3 * step(200) + step(250)).
    ws = (6, 50, 1)
    want = 10 * 4 * (3 * bench.step_flops(ws, 200)["total"] + bench.step_flops(ws, 250)["total"])
    assert bench.uci_cell_flops(6, 200, 250, 1, 50, 10, 4, 3) == want


_MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(Path(__file__).resolve().parents[3] / "shared" / "data" / "uci")


@pytest.mark.skipif(not Path(_MIRROR).is_dir() and not os.environ.get("CI"), reason=f"no UCI mirror at {_MIRROR}")
def test_cli_bench_uci_cell(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("BOOTENS_DATA_DIR", _MIRROR)
    # One real Yacht cell, 4 particles, 2 L-BFGS steps: the grid one value at a time and in one batch of the
    # whole grid give the same selection and scores (float32 here: to its rounding).
    code = cli.main(["bench", "--case", "uci-cell", "--quick", "--datasets", "yacht", "--models", "1", "--k", "4",
                     "--steps", "2", "--grid-batches", "1", "40", "--quiet", "--out", str(tmp_path)])
    assert code == 0
    doc = json.loads((tmp_path / "uci-cell.json").read_text())
    assert doc["case"] == "uci-cell" and doc["device"]["platform"] == jax.devices()[0].platform
    one, batch = doc["rows"]
    assert (one["grid_batch_used"], batch["grid_batch_used"]) == (1, one["grid_size"])
    assert one["grid_padding"] == batch["grid_padding"] == 0
    for r in (one, batch):
        assert r["cold_s"] >= r["warm_s"] > 0 and r["compile_s"] == pytest.approx(r["cold_s"] - r["warm_s"])
        assert r["flops_per_s"] == pytest.approx(r["flops"] / r["warm_s"])
        assert 0 < r["roofline_fraction"] == pytest.approx(r["flops_per_s"] / r["roofline_flops_per_s"])
    assert batch["noise_var"] == one["noise_var"]
    assert batch["test_rmse"] == pytest.approx(one["test_rmse"], rel=1e-4)


def test_cli_bench_uci_cell_bad_input(tmp_path: Path, capsys):
    assert cli.main(["bench", "--case", "uci-cell", "--datasets", "mnist", "--quiet", "--out", str(tmp_path)]) == 2
    assert "uci-cell datasets must be among" in capsys.readouterr().err
    assert cli.main(["bench", "--case", "uci-cell", "--models", "2", "--quiet", "--out", str(tmp_path)]) == 2
    assert "hidden layers must be 1 or 4" in capsys.readouterr().err


def test_cli_bench_groups_bad_input(tmp_path: Path, capsys):
    # one cell a run: two datasets or two depths are refused, and so are an unknown dataset and depth
    assert cli.main(["bench", "--case", "groups", "--datasets", "yacht", "boston", "--quiet",
                     "--out", str(tmp_path)]) == 2
    assert "one dataset and one --models value" in capsys.readouterr().err
    assert cli.main(["bench", "--case", "groups", "--datasets", "mnist", "--quiet", "--out", str(tmp_path)]) == 2
    assert "dataset must be among" in capsys.readouterr().err
    assert cli.main(["bench", "--case", "groups", "--models", "2", "--quiet", "--out", str(tmp_path)]) == 2
    assert "hidden layers must be 1 or 4" in capsys.readouterr().err
    assert not (tmp_path / "groups.json").exists()

def test_cli_bench_particle_batch(tmp_path: Path, capsys):
    # 7 particles in groups of 3 (two groups and a remainder) against all at once: one row per network,
    # optimizer and batch (the 1-layer MLP and the linear model in 16 trigonometric features of 64 points), the
    # all-at-once row is the unit of speed, and the particles agree to float64 rounding.
    code = cli.main(["bench", "--case", "particle-batch", "--datasets", "boston", "--models", "1", "--k", "7",
                     "--max-rows", "30", "--steps", "3", "--repeats", "2", "--particle-batches", "3",
                     "--features", "16", "--out", str(tmp_path)])
    assert code == 0
    doc = json.loads((tmp_path / "particle-batch.json").read_text())
    assert doc["case"] == "particle-batch" and doc["device"]["platform"] == jax.devices()[0].platform
    rows = {(r["network"], r["optimizer"], r["particle_batch"]): r for r in doc["rows"]}
    nets = ("1 hidden layer", "linear, 16 trigonometric features")
    assert set(rows) == {(n, o, b) for n in nets for o in ("adam", "lbfgs-zoom") for b in (None, 3)}
    for (net, name, batch), r in rows.items():
        base = rows[(net, name, None)]["seconds"]["median"]
        assert r["speedup"] == pytest.approx(base / r["seconds"]["median"])
        assert (r["k"], r["n"], r["steps"]) == ((7, 30, 3) if net == nets[0] else (7, 64, 3))
        assert r["max_abs_diff"] < 1e-10
    assert "batch    3" in capsys.readouterr().out
    assert cli.main(["bench", "--case", "particle-batch", "--features", "-1", "--quiet",
                     "--out", str(tmp_path)]) == 2
    assert "features must be >= 0" in capsys.readouterr().err
    assert cli.main(["bench", "--case", "particle-batch", "--datasets", "mnist", "--quiet",
                     "--out", str(tmp_path)]) == 2
    assert "unknown dataset shape" in capsys.readouterr().err
    assert cli.main(["bench", "--case", "particle-batch", "--particle-batches", "0", "--quiet",
                     "--out", str(tmp_path)]) == 2
    assert "every batch >= 1" in capsys.readouterr().err



def test_cli_bench_linesearch(tmp_path: Path, capsys):
    # The batched zoom line search against optax's under vmap, 6 particles, 4 iterations, float32: a row each,
    # optax's the unit of speed, the same search steps, the particles the same up to float32 rounding.
    code = cli.main(["bench", "--case", "linesearch", "--datasets", "boston", "--models", "1", "--k", "6",
                     "--max-rows", "30", "--steps", "4", "--repeats", "1", "--out", str(tmp_path)])
    assert code == 0
    doc = json.loads((tmp_path / "linesearch.json").read_text())
    assert doc["case"] == "linesearch"
    rows = {r["linesearch"]: r for r in doc["rows"]}
    assert set(rows) == {"optax", "batched"}
    assert rows["optax"]["speedup"] == 1.0 and rows["optax"]["max_abs_diff"] == 0.0
    b = rows["batched"]
    assert b["speedup"] == pytest.approx(rows["optax"]["seconds"]["median"] / b["seconds"]["median"])
    assert (b["k"], b["n"], b["steps"], b["dtype"]) == (6, 30, 4, "float32")
    assert b["ms_per_iteration"] == pytest.approx(1e3 * b["seconds"]["median"] / 4)
    assert b["search_steps"] == rows["optax"]["search_steps"] >= 1.0
    assert b["max_abs_diff"] < 1e-3
    assert "batched" in capsys.readouterr().out
    assert cli.main(["bench", "--case", "linesearch", "--datasets", "mnist", "--quiet", "--out", str(tmp_path)]) == 2
    assert "unknown dataset shape" in capsys.readouterr().err
    assert cli.main(["bench", "--case", "linesearch", "--k", "0", "--quiet", "--out", str(tmp_path)]) == 2
    assert "every k >= 1" in capsys.readouterr().err

def test_particle_batch_record_and_table():
    # The committed CPU measurement reads back as a record of its own and as a table, one row per measurement.
    root = Path(__file__).resolve().parents[3] / "results" / "paper" / "bench"
    recs = bench.load_records(root, "particle-batch.json")
    assert "cpu-2core" in recs and "cpu-2core" not in bench.load_records(root)
    doc = recs["cpu-2core"]
    t = verdicts.particle_batch_table(doc)
    assert len(t) == len(doc["rows"])
    row = t.loc[("1 hidden layer", "Adam", "all")]
    assert row["× all at once"] == 1.0 and row["max |Δ particles|"] == "0.0e+00"
    best = max(r["speedup"] for r in doc["rows"])
    assert max(t["× all at once"]) == round(best, 2)


def test_cache_bandwidth_has_one_entry_per_level_and_the_roof_picks_the_level_that_holds_the_set():
    levels = bench.measure_cache_bandwidth(jax.random.key(0), 2, {1: 32 * 1024, 2: 512 * 1024}, memory_mib=3)
    assert [lev["level"] for lev in levels] == ["L1", "L2", "memory"]
    assert all(lev["bytes_per_s"] > 0 and lev["bytes_per_s"] == lev["spread"]["max"] for lev in levels)
    assert all(lev["footprint"] <= lev["capacity"] for lev in levels[:-1])
    assert bench.roof_level(1000, levels)["level"] == "L1"
    assert bench.roof_level(100_000, levels)["level"] == "L2"
    assert bench.roof_level(10**9, levels)["level"] == "memory"


def _noise(spread: dict) -> float:
    """How far apart repeated measurements of one quantity fell, relative to the best: (max - min) / max."""
    return (spread["max"] - spread["min"]) / spread["max"]


def test_every_committed_throughput_record_stays_under_its_roof():
    # A roof is a bound: no row may run faster than the roof of its device, beyond what the repeated
    # measurements of that roof's own bandwidth and matmul peak scatter by (their (max - min) / max, from the
    # record) -- the roof is the best of its repeats, so a roof measured low by that much can be passed by as
    # much.
    root = Path(__file__).resolve().parents[3] / "results" / "paper" / "bench"
    recs = bench.load_records(root)
    assert recs
    for label, doc in recs.items():
        peak = doc["peak"]
        levels = {lev["level"]: lev for lev in peak.get("levels", [])}
        for r in doc["rows"]:
            spread = levels[r["roofline_level"]]["spread"] if "roofline_level" in r else peak["bandwidth"]["spread"]
            allowance = max(_noise(spread), _noise(peak["matmul"]["spread"]))
            assert r["roofline_fraction"] <= 1.0 + allowance, (label, r["model"], r["dataset"], r["k"],
                                                               r["roofline_fraction"], allowance)


def test_bandwidth_is_measured_over_the_arrays_asked_for():
    bw = bench.measure_bandwidth(jax.random.key(0), 3, 2)
    assert bw["mib"] == 3 and math.isfinite(bw["bytes_per_s"]) and bw["bytes_per_s"] > 0
    assert bw["spread"]["max"] == bw["bytes_per_s"] and len(bw["spread"]) == 5


def test_matmul_peak_is_the_best_of_its_sizes():
    peak = bench.measure_matmul_peak(jax.random.key(0), (8, 16), 2)
    assert [e["size"] for e in peak["sizes"]] == [8, 16]
    assert peak["flops_per_s"] == max(e["flops_per_s"] for e in peak["sizes"]) > 0
    assert peak["spread"]["max"] == peak["flops_per_s"]
