"""One L-BFGS iteration of a UCI ensemble (``bootens bench --case uci-dataset``): peaks, the split, the document."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import pytest

from bootens_core.repro import cli
from bootens_core.repro.performance import bench, iteration, verdicts


def test_vendor_peaks_by_device_kind():
    assert iteration.vendor_peak("NVIDIA H100 80GB HBM3") == (67e12, 3.35e12)
    assert iteration.vendor_peak("NVIDIA H200") == (67e12, 4.8e12)
    assert iteration.vendor_peak("cpu") is None


def test_split_of_an_iteration_by_hand():
    # 10 ms a step: one evaluation 4 ms, the two-loop 1 ms, one trial step 6 ms (so 1 ms of first-round
    # bookkeeping), a group of 25 of 100 particles evaluated in 1.5 ms. 1.2 evaluations per particle: 0.2 * 100
    # particle evaluations = 0.8 group evaluations = 1.2 ms further; the remaining 4 - 1.2 = 2.8 ms is the further
    # rounds' bookkeeping.
    secs = {"eval": 4e-3, "two_loop": 1e-3, "one_trial": 6e-3, "group_eval": 1.5e-3, "step": 10e-3}
    parts, diffs = iteration.split_iteration(secs, 1.2, 100, 25)
    assert parts["model_eval_s"] == pytest.approx(5.2e-3)
    assert parts["two_loop_s"] == pytest.approx(1e-3)
    assert parts["line_search_bookkeeping_s"] == pytest.approx(1e-3 + 2.8e-3)
    assert sum(parts.values()) == pytest.approx(secs["step"])
    assert diffs == pytest.approx({"first_round_s": 1e-3, "further_rounds_s": 4e-3, "further_evals_est_s": 1.2e-3})
    with pytest.raises(ValueError, match="evaluations per particle"):
        iteration.split_iteration(secs, 0.5, 100, 25)


def test_the_document_is_rewritten_after_every_row(monkeypatch):
    # Stubs for the measurement: what is checked is the document's life, not the numbers.
    monkeypatch.setattr(iteration, "_peaks", lambda key, repeats: {"flops_per_s": 1.0, "bytes_per_s": 1.0})
    monkeypatch.setattr(iteration, "uci_problem", lambda key, cfg, ds, h, **kw: (ds, h, kw["direction"]))
    monkeypatch.setattr(iteration, "_row", lambda p, *a: {"dataset": p[0], "hidden_layers": p[1], "direction": p[2]})
    from bootens_core.repro.experiments.uci.config import UCIConfig

    seen = []
    doc = iteration.measure_uci_dataset(jax.random.key(0), UCIConfig.quick(), ["boston", "yacht"], [1, 4],
                                        on_row=seen.append)
    assert [len(d["rows"]) for d in seen] == [1, 2, 3, 4] and not any(d["complete"] for d in seen)
    assert doc["complete"] and doc["case"] == "uci-dataset"
    assert [(r["dataset"], r["hidden_layers"], r["direction"]) for r in doc["rows"]] == [
        ("boston", 1, "compact"), ("boston", 4, "compact"), ("yacht", 1, "compact"), ("yacht", 4, "compact")]
    # both L-BFGS directions: a row each, side by side
    doc = iteration.measure_uci_dataset(jax.random.key(0), UCIConfig.quick(), ["boston"], [1],
                                        directions=("compact", "two-loop"))
    assert [r["direction"] for r in doc["rows"]] == ["compact", "two-loop"]
    assert doc["settings"]["directions"] == ["compact", "two-loop"]


def test_bad_settings_are_named():
    from bootens_core.repro.experiments.uci.config import UCIConfig

    cfg = UCIConfig.quick()
    with pytest.raises(ValueError, match="datasets must be among"):
        iteration.measure_uci_dataset(jax.random.key(0), cfg, ["mnist"], [1])
    with pytest.raises(ValueError, match="hidden layers must be 1 or 4"):
        iteration.measure_uci_dataset(jax.random.key(0), cfg, ["boston"], [2])
    with pytest.raises(ValueError, match="steps >= 1"):
        iteration.measure_uci_dataset(jax.random.key(0), cfg, ["boston"], [1], steps=0)
    with pytest.raises(ValueError, match="L-BFGS directions are compact and two-loop"):
        iteration.measure_uci_dataset(jax.random.key(0), cfg, ["boston"], [1], directions=["three-loop"])


_MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(Path(__file__).resolve().parents[3] / "shared" / "data" / "uci")


def _elementwise_bound(ws: tuple[int, ...], n: int) -> int:
    """At most 8 FLOPs per activation and per parameter for the work XLA counts beside the matmuls: an
    activation's bias add, ReLU, the ReLU's derivative and its share of the bias gradient (4), a parameter's
    prior term (difference, square, scale, its gradient: 4); the output's residual and square likewise."""
    units = sum(ws[1:])
    params = sum(a * b + b for a, b in zip(ws[:-1], ws[1:], strict=True))
    return 8 * (n * units + params)


@pytest.mark.skipif(not Path(_MIRROR).is_dir() and not os.environ.get("CI"), reason=f"no UCI mirror at {_MIRROR}")
def test_cli_bench_uci_dataset(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("BOOTENS_DATA_DIR", _MIRROR)
    # Boston's first 32 fit rows, the 1-layer network, 4 particles: every field, the FLOPs against a hand count,
    # the split of the time.
    code = cli.main(["bench", "--case", "uci-dataset", "--datasets", "boston", "--models", "1", "--k", "4",
                     "--max-rows", "32", "--steps", "2", "--warmup", "2", "--repeats", "3", "--lbfgs-directions",
                     "compact", "two-loop", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "boston" in out and "two-loop" in out
    doc = json.loads((tmp_path / "uci-dataset.json").read_text())
    assert doc["case"] == "uci-dataset" and doc["complete"] and doc["device"]["platform"] == jax.devices()[0].platform
    assert doc["peak"]["flops_per_s"] > 0 and doc["peak"]["bytes_per_s"] > 0
    r, r_two_loop = doc["rows"]
    assert (r["direction"], r_two_loop["direction"]) == ("compact", "two-loop")
    # the same ensemble: the same evaluation, only the direction's program differs
    assert r_two_loop["xla"]["eval"] == r["xla"]["eval"]
    assert r_two_loop["xla"]["two_loop"] != r["xla"]["two_loop"]
    assert set(iteration.ROW_KEYS) <= set(r)
    assert (r["dataset"], r["hidden_layers"], r["n_rows"], r["in_dim"], r["particles"]) == ("boston", 1, 32, 13, 4)
    assert r["grid_values"] == [1e-4] and r["dtype"] == "float32"  # one sigma^2 on a CPU: the grid's first
    assert r["compile_s"] > 0 and r["search_evals_per_particle"] >= 1
    # XLA's count of one evaluation of the ensemble: the matmuls of the hand count and some elementwise work.
    ws = bench.widths(13, 1)
    hand = 4 * bench.step_flops(ws, 32)["total"]
    assert r["hand_matmul_flops_per_evaluation"] == hand
    assert hand <= r["xla"]["eval"]["flops"] <= hand + 4 * _elementwise_bound(ws, 32)
    # An iteration: at least its evaluations and its two-loop.
    e = r["search_evals_per_particle"]
    assert r["flops_per_iteration"] >= e * r["xla"]["eval"]["flops"] * 0.99 + r["xla"]["two_loop"]["flops"] * 0.99
    assert 0 < r["flop_fraction"] <= 1
    assert r["flop_fraction"] == pytest.approx(r["flops_per_iteration"] / r["seconds_per_iteration"]
                                               / doc["peak"]["flops_per_s"])
    # XLA's bytes on a CPU are mostly cache traffic: against main memory's bandwidth the fraction may pass 1.
    assert r["bandwidth_fraction"] > 0
    # The parts sum to the iteration; the measured ones are non-negative, the difference within the spread of
    # the timings it is made of.
    parts = r["split"]
    assert set(parts) == set(iteration.PART_KEYS)
    assert sum(parts.values()) == pytest.approx(r["seconds_per_iteration"], rel=1e-9)
    assert parts["model_eval_s"] > 0 and parts["two_loop_s"] > 0
    noise = sum(p["spread"]["q75"] - p["spread"]["q25"] for p in r["parts"].values())
    assert parts["line_search_bookkeeping_s"] >= -noise
    # The chapter's table of the record: one row per direction, the numbers of the row as written
    t = verdicts.uci_dataset_table(doc)
    assert list(t.index) == [("1 hidden layer, boston (32 rows)", "compact"),
                             ("1 hidden layer, boston (32 rows)", "two-loop")]
    row = t.loc[("1 hidden layer, boston (32 rows)", "compact")]
    assert row["problems"] == 4
    assert row["ms per iteration [min, max]"].startswith(f"{r['seconds_per_iteration'] * 1e3:.3g} [")
    assert row["of FLOP / bandwidth peak"] == f"{r['flop_fraction']:.1%} / {r['bandwidth_fraction']:.1%}"
    assert row["GFLOP / GB"] == f"{r['flops_per_iteration'] / 1e9:.3g} / {r['bytes_per_iteration'] / 1e9:.3g}"
    assert row["roof"] == f"{r['roof_level']}: {r['roofline_fraction']:.0%}"
    assert row["model share"] == f"{parts['model_eval_s'] / r['seconds_per_iteration']:.0%}"


def test_cli_bench_uci_dataset_bad_input(tmp_path: Path, capsys):
    assert cli.main(["bench", "--case", "uci-dataset", "--datasets", "mnist", "--quiet", "--out", str(tmp_path)]) == 2
    assert "datasets must be among" in capsys.readouterr().err
    assert cli.main(["bench", "--case", "uci-dataset", "--models", "2", "--quiet", "--out", str(tmp_path)]) == 2
    assert "hidden layers must be 1 or 4" in capsys.readouterr().err
