"""bootens_core.repro.experiments.uci.coverage: how a column of Tables 2-3 counts, and the plan of what is left,
on hand-built records whose counts are known, and on the committed records."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bootens_core.data.uci import PAPER_SPLITS
from bootens_core.repro import config as repro_config
from bootens_core.repro.experiments.uci import coverage as cv, window
from bootens_core.repro.experiments.uci.config import UCIConfig

ROOT = Path(__file__).resolve().parents[4]
RESULTS = ROOT / "results" / "paper"
COLS = ("dataset", "split", "method", "hidden_layers", "test_rmse", "test_mnll", "wall_s", "device")
SPLITS = {"boston": 3, "yacht": 4}  # two datasets, so 6 families x 2 = 12 columns
REF = {("boston", "ensemble", 4, "rmse"): (3.0, 0.5), ("yacht", "ensemble", 4, "rmse"): (1.0, 0.2)}


def _paper_cfg(**changes):
    cfg = repro_config.as_dict(UCIConfig.paper())
    for name, value in changes.items():
        *head, last = name.split("__")
        d = cfg
        for h in head:
            d = d[h]
        d[last] = value
    return cfg


def _write(root: Path, name: str, cfg: dict, rows: list[tuple]) -> cv.Record:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    with (folder / "cells.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLS)
        w.writerows(rows)
    return cv.read_record(root, name)


def _rows(dataset, method, layers, splits, rmse=1.0, wall=10.0, device="cpu"):
    return [(dataset, k, method, layers, rmse if not callable(rmse) else rmse(k), 1.0, wall, device) for k in splits]


def _pack(path: Path, cells: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        entries = []
        for c in cells:
            p = f"{c['dataset']}/{c['method']}-{c['hidden_layers']}-h/split-{c['split']}.json"
            entries.append({"label": p, "path": p})
            data = json.dumps(c).encode()
            info = tarfile.TarInfo(p)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        data = json.dumps({"cells": entries}).encode()
        info = tarfile.TarInfo("pack.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _pcell(dataset, method, layers, split, wall, finished, device="NVIDIA H100 80GB HBM3", precision="highest",
           commit="0" * 40):
    prov = {"device": {"kind": device}, "finished_utc": finished, "elapsed_s": wall, "git_commit": commit}
    if precision is not None:
        prov["matmul_precision"] = precision
    return {"dataset": dataset, "method": method, "hidden_layers": layers, "split": split, "wall_s": wall,
            "provenance": prov}


def test_columns_count_by_the_rules_on_hand_built_records(tmp_path):
    gpu = "NVIDIA H100 80GB HBM3"
    paper = _write(tmp_path, "uci", _paper_cfg(), [
        *_rows("yacht", "ensemble", 1, range(4)),                     # complete: 4 of 4
        *_rows("boston", "ensemble", 1, range(2)),                    # 2 of 3
        *_rows("boston", "gp", 0, range(3)), *_rows("yacht", "gp", 0, range(4)),  # both complete
        # Boston 1-layer MCD on a GPU: splits 0-1 float32 by their pack, split 2 with no pack: not counted
        *_rows("boston", "mcd", 1, range(3), wall=20.0, device=gpu),
        # Yacht 4-layer MCD: three splits on the GPU with no precision on record at a commit git does not
        # know (TF32), one on the CPU: complete only if TF32 counted
        *_rows("yacht", "mcd", 4, range(3), wall=30.0, device=gpu), *_rows("yacht", "mcd", 4, [3]),
        # Yacht 4-layer ensemble, the paper's prior: RMSE 50 on 3 of 4 splits (evidence), Boston: 2 splits
        *_rows("yacht", "ensemble", 4, range(3), rmse=lambda k: 50.0 + k), *_rows("boston", "ensemble", 4, range(2),
                                                                                rmse=lambda k: 40.0 + k),
    ])
    mcd = _write(tmp_path, "uci-mcd-sghmc", _paper_cfg(), _rows("yacht", "sghmc", 1, range(4)))
    fanin = _write(tmp_path, "uci-fanin", _paper_cfg(network__scale_by_fan_in=True), [
        *_rows("yacht", "ensemble", 4, range(4)), *_rows("boston", "ensemble", 4, range(3))])
    _pack(tmp_path / "packs" / "a" / "p.tar.gz", [
        _pcell("boston", "mcd", 1, 0, 20.0, "2026-01-01T00:00:20Z"),
        _pcell("boston", "mcd", 1, 1, 20.0, "2026-01-01T00:00:40Z"),
        *[_pcell("yacht", "mcd", 4, k, 30.0, f"2026-01-01T00:0{k + 1}:00Z", precision=None) for k in range(3)]])
    packs = cv.read_packs(tmp_path / "packs")  # commit 000...: not one that made float32 products
    cols = cv.columns([paper, mcd], {"uci-fanin": fanin}, [paper], packs, reference=REF, n_splits=SPLITS)
    by = {(c.dataset, c.method, c.hidden_layers): c for c in cols}
    assert len(cols) == 12
    # Paper's setting: yacht ens-1, both GP, yacht SGHMC = 4 of 12.
    assert {k for k, c in by.items() if c.complete_paper} == {
        ("yacht", "ensemble", 1), ("boston", "gp", 0), ("yacht", "gp", 0), ("yacht", "sghmc", 1)}
    assert by[("boston", "mcd", 1)].paper_splits == (0, 1) and by[("boston", "mcd", 1)].tf32_splits == (2,)
    assert by[("yacht", "mcd", 4)].paper_splits == (3,) and by[("yacht", "mcd", 4)].tf32_splits == (0, 1, 2)
    # With deviations: Yacht's fan-in column counts (RMSE 51 +- 0.58 on 3 splits against the paper's 1.0 +- 0.2:
    # worse); Boston's does not: 2 splits of the paper's setting, 3 needed.
    y, b = by[("yacht", "ensemble", 4)], by[("boston", "ensemble", 4)]
    assert y.complete_with_deviations and not y.complete_paper
    assert y.evidence.n_splits == 3 and y.evidence.verdict == "worse" and y.evidence.mean == pytest.approx(51.0)
    assert not b.complete_with_deviations and b.evidence.verdict == "too few splits" and b.evidence.n_splits == 2
    assert "no evidence" in b.why and "2 counted" in b.why
    assert cv.count_text(cols) == "4 of 12 columns complete at the paper's setting, 5 of 12 with deviations"
    fams = {f.label: f for f in cv.family_counts(cols)}
    e4 = fams["Bootstrap ensemble 4-layer"]
    assert (e4.paper, e4.with_deviations, e4.deviation_without_evidence, e4.n_columns) == (0, 1, 1, 2)
    # Both MC dropout columns would be complete if cells without float32 products counted.
    assert fams["MC dropout 4-layer"].tf32_only == 1 and fams["MC dropout 1-layer"].tf32_only == 1
    assert fams["GP"].tf32_only == 0
    table = cv.family_table(cols)
    assert table.loc["All columns", "complete with deviations"] == "5 of 12"
    assert table.loc["Bootstrap ensemble 4-layer", "complete on"] == "yacht"
    assert table.loc["Bootstrap ensemble 4-layer", "complete with deviations"] == "1 of 2"
    assert table.loc["MC dropout 4-layer", "complete only with TF32 cells"] == "yacht"
    dev = cv.deviation_table(cols)
    assert list(dev["counts with deviations"]) == ["no", "yes"]  # Boston, Yacht
    assert list(dev["evidence"]) == ["too few splits", "worse"]
    assert list(dev["evidence splits (3 needed)"]) == ["2", "3"]
    assert sum(f.n_columns for f in fams.values()) == 12


def test_a_deviation_whose_paper_setting_agrees_does_not_count(tmp_path):
    paper = _write(tmp_path, "uci", _paper_cfg(), _rows("yacht", "ensemble", 4, range(3),
                                                        rmse=lambda k: (0.9, 1.0, 1.1)[k]))
    fanin = _write(tmp_path, "uci-fanin", _paper_cfg(network__scale_by_fan_in=True),
                   _rows("yacht", "ensemble", 4, range(4)))
    # The evidence may come from a record of the paper's prior on fewer particles, not from another prior.
    few = _write(tmp_path, "few", _paper_cfg(n_particles=20), _rows("yacht", "ensemble", 4, [3], rmse=1.0))
    cols = cv.columns([paper], {"uci-fanin": fanin}, [paper, few, fanin], (), reference=REF, n_splits=SPLITS)
    y = next(c for c in cols if (c.dataset, c.method, c.hidden_layers) == ("yacht", "ensemble", 4))
    assert y.evidence.n_splits == 4 and y.evidence.verdict == "no significant difference"  # fan-in cells: not evidence
    assert not y.complete_with_deviations and "not worse (no significant difference)" in y.why


def test_records_that_break_the_rules_are_refused(tmp_path):
    bad = _write(tmp_path, "uci", _paper_cfg(n_particles=50), _rows("yacht", "ensemble", 1, range(4)))
    with pytest.raises(cv.CoverageError, match="n_particles"):
        cv.columns([bad], {}, [], (), reference=REF, n_splits=SPLITS)
    two = _write(tmp_path, "uci-fanin", _paper_cfg(network__scale_by_fan_in=True, n_particles=20),
                 _rows("yacht", "ensemble", 4, range(4)))
    ok = _write(tmp_path, "ok", _paper_cfg(), [])
    with pytest.raises(cv.CoverageError, match="not the deviation"):
        cv.columns([ok], {"uci-fanin": two}, [], (), reference=REF, n_splits=SPLITS)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text("{}")
    with pytest.raises(cv.CoverageError, match="cells.csv not found"):
        cv.read_record(tmp_path, "x")
    (tmp_path / "x" / "cells.csv").write_text("dataset,split,method\nyacht,0,gp\n")
    with pytest.raises(cv.CoverageError, match="lacks the column.*hidden_layers"):
        cv.read_record(tmp_path, "x")


def test_device_seconds_share_the_device_among_cells_running_together(tmp_path):
    # A runs 0-100 s, B 50-150 s, C 200-260 s in one device call; D 0-100 s in another.
    _pack(tmp_path / "packs" / "s" / "p.tar.gz", [
        _pcell("boston", "ensemble", 1, 0, 100.0, "2026-01-01T00:01:40Z"),
        _pcell("boston", "ensemble", 1, 1, 100.0, "2026-01-01T00:02:30Z"),
        _pcell("boston", "ensemble", 1, 2, 60.0, "2026-01-01T00:04:20Z")])
    _pack(tmp_path / "packs" / "t" / "p.tar.gz", [_pcell("yacht", "ensemble", 1, 0, 100.0, "2026-01-01T00:01:40Z")])
    _pack(tmp_path / "packs" / "c" / "p.tar.gz", [  # two CPU processes side by side: separate cores
        _pcell("energy", "ensemble", 1, k, 100.0, "2026-01-01T00:01:40Z", device="cpu") for k in range(2)])
    packs = cv.read_packs(tmp_path / "packs")
    assert cv.device_seconds(cv.Cell("energy", 0, "ensemble", 1, 1.0, 1.0, 100.0, "cpu"), packs) == 100.0
    cell = lambda d, k, w: cv.Cell(d, k, "ensemble", 1, 1.0, 1.0, w, "NVIDIA H100 80GB HBM3")
    assert cv.device_seconds(cell("boston", 0, 100.0), packs) == pytest.approx(50 + 50 / 2)
    assert cv.device_seconds(cell("boston", 1, 100.0), packs) == pytest.approx(50 / 2 + 50)
    assert cv.device_seconds(cell("boston", 2, 60.0), packs) == pytest.approx(60)
    assert cv.device_seconds(cell("yacht", 0, 100.0), packs) == pytest.approx(100)
    assert cv.device_seconds(cell("yacht", 1, 42.0), packs) == 42.0  # no pack: its wall time


def test_plan_rows_measured_scaled_and_totals(tmp_path):
    from bootens_core.repro.experiments.uci.experiment import cost_units

    paper = _write(tmp_path, "uci", _paper_cfg(), [
        *_rows("boston", "ensemble", 1, [0], wall=10.0), *_rows("boston", "ensemble", 1, [1], wall=30.0),
        *_rows("boston", "gp", 0, range(3)), *_rows("yacht", "gp", 0, range(4))])
    cols = cv.columns([paper], {}, [], (), reference=REF, n_splits=SPLITS)
    rows = {r.label: r for r in cv.plan(cols, [paper], {}, ())}
    b = rows["Bootstrap ensemble 1-layer, Boston"]
    assert (b.left, b.of) == (1, 3) and b.seconds["cpu"] == (20.0, 30.0, False)
    assert b.cpu_hours == pytest.approx(20.0 / 3600) and b.seconds["NVIDIA H200"] is None
    y = rows["Bootstrap ensemble 1-layer, Yacht"]
    ratio = cost_units("ensemble-1", "yacht", UCIConfig.paper()) / cost_units("ensemble-1", "boston",
                                                                             UCIConfig.paper())
    assert (y.left, y.of) == (4, 4) and y.seconds["cpu"] == pytest.approx((20.0 * ratio, 30.0 * ratio, True))
    total = rows["Bootstrap ensemble 1-layer, all"]
    assert (total.left, total.of) == (5, 7) and total.cpu_hours == pytest.approx(b.cpu_hours + y.cpu_hours)
    assert total.gpu_minutes["NVIDIA H200"] is None
    assert not any(label.startswith("GP") for label in rows)  # nothing left
    assert rows["SGHMC 1-layer, all"].seconds["cpu"] is None and rows["SGHMC 1-layer, all"].cpu_hours is None
    text = cv.plan_markdown(list(rows.values()))
    assert "| Bootstrap ensemble 1-layer, Boston | 1 of 3 | 20.0 (30.0) | — | — | 0.01 | — | — |" in text
    assert "| **Bootstrap ensemble 1-layer, all** | 5 of 7 |" in text
    # a record of other settings that costs the same work (SGHMC at another step) times the column, and only
    # that: it completes nothing
    other = _write(tmp_path, "uci-sghmc-sqrt-lr", _paper_cfg(sghmc__lr_scaling="sqrt_lr"),
                   _rows("boston", "sghmc", 1, range(3), wall=40.0))
    costed = {r.label: r for r in cv.plan(cols, [paper], {}, (), cost_records=[other])}
    sg = costed["SGHMC 1-layer, Boston"]
    assert (sg.left, sg.of) == (3, 3) and sg.seconds["cpu"] == (40.0, 40.0, False)
    assert sg.cpu_hours == pytest.approx(3 * 40.0 / 3600)


def _csv_rows(name):
    with (RESULTS / name / "cells.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def _splits_by_column(name):
    out: dict[tuple[str, str, int], set[int]] = {}
    for r in _csv_rows(name):
        out.setdefault((r["dataset"], r["method"], int(r["hidden_layers"])), set()).add(int(r["split"]))
    return out


def test_committed_records_read_back():
    paper, devs, ev, packs = cv.load(RESULTS)
    cols = cv.columns(paper, devs, ev, packs)
    assert len(cols) == 6 * len(PAPER_SPLITS)
    # Independently: a column of the paper's records with every split is complete unless one of its GPU cells
    # came back in a pack made before float32 products were the default (or came back in no committed pack).
    present: dict[tuple[str, str, int], set[int]] = {}
    for name in cv.PAPER_RECORDS:
        for k, v in _splits_by_column(name).items():
            present.setdefault(k, set()).update(v)
    full = {k for k, v in present.items() if v >= set(range(PAPER_SPLITS[k[0]]))}
    ours = {(c.dataset, c.method, c.hidden_layers) for c in cols if c.complete_paper}
    assert ours <= full
    early = set()  # GPU cells of packs made before float32 products, by (dataset, method, layers)
    for pack in RESULTS.glob("packs/**/*.tar.gz"):
        with tarfile.open(pack) as tar:
            for m in tar.getmembers():
                got = re.match(r"(\w+)/(\w+)-(\d+)-[0-9a-f]+/split-\d+\.json", m.name)
                if not got:
                    continue
                prov = json.load(tar.extractfile(m))["provenance"]
                if "matmul_precision" in prov:
                    continue
                # window.FLOAT32_BEFORE_FIELD: the commits between float32 products and their provenance field
                # (test_window checks them against the git history)
                if prov["git_commit"] not in window.FLOAT32_BEFORE_FIELD:
                    early.add((got[1], got[2], int(got[3])))
    for k in full - ours:
        gpu = [r for n in cv.PAPER_RECORDS for r in _csv_rows(n)
               if (r["dataset"], r["method"], int(r["hidden_layers"])) == k and r["device"] != "cpu"]
        assert gpu and (k in early or k[1] == "mcd"), k  # MC dropout's GPU cells came back in no committed pack
    # Counts: each with its denominator, the deviation counted only with evidence that holds.
    text = cv.count_text(cols)
    assert text == (f"{len(ours)} of {len(cols)} columns complete at the paper's setting, "
                    f"{sum(c.complete_with_deviations for c in cols)} of {len(cols)} with deviations")
    for c in cols:
        if c.complete_with_deviations and not c.complete_paper:
            assert c.evidence is not None and c.evidence.holds and c.evidence.n_splits >= cv.MIN_EVIDENCE_SPLITS


def test_readme_plan_is_the_commands_output():
    out = subprocess.run([sys.executable, "-m", "bootens_core.repro.experiments.uci.coverage", "--results",
                          str(RESULTS)], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    readme = (RESULTS / "README.md").read_text()
    section = readme.split("## Plan: what is left", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert table == out.strip(), ("results/paper/README.md's plan is stale: rerun "
                                  "`python -m bootens_core.repro.experiments.uci.coverage` and paste its table")


def test_command_refuses_a_missing_record(tmp_path, capsys):
    assert cv.main(["--results", str(tmp_path)]) == 2
    assert "config.json not found" in capsys.readouterr().err


def test_prior_rows_read_the_papers_prior_and_refuse_the_fan_in(tmp_path):
    _write(tmp_path, "uci", _paper_cfg(), _rows("yacht", "ensemble", 4, [0, 1, 2], rmse=21.0)
           + _rows("yacht", "ensemble", 1, [0], rmse=1.0))
    rows = cv.prior_rows(tmp_path, (("uci", "paper's setting"),))
    assert [(r.record, r.dataset, r.rmse, r.float32) for r in rows] == [("paper's setting", "yacht", (21.0,) * 3, 3)]
    _write(tmp_path, "fan", _paper_cfg(network__scale_by_fan_in=True), _rows("yacht", "ensemble", 4, [0]))
    with pytest.raises(cv.CoverageError, match="'fan' uses the fan-in prior"):
        cv.prior_rows(tmp_path, (("fan", "x"),))
