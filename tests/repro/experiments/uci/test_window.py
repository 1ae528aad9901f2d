"""uci.window: the stages of a device window, its plan, the TF32 cells, and results/paper/device.sh end to
end on a CPU with a tiny budget and tiny cells."""

from __future__ import annotations

import csv
import os
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from bootens_core.repro import cellpack
from bootens_core.repro.experiments.uci import window
from bootens_core.repro.experiments.uci.config import UCIConfig

ROOT = Path(__file__).resolve().parents[4]
RESULTS = ROOT / "results" / "paper"
MIRROR = os.environ.get("BOOTENS_DATA_DIR") or str(ROOT.parent / "shared" / "data" / "uci")


def _gpu_rows(record: Path) -> set[tuple[str, int, str]]:
    with open(record / "cells.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        (
            r["dataset"],
            int(r["split"]),
            r["method"] + (f"-{r['hidden_layers']}" if r["method"] != "gp" else ""),
        )
        for r in rows
        if r["device"] not in ("", "cpu")
    }


def test_tf32_cells_of_the_committed_records():
    got = window.tf32_cells(RESULTS)
    # results/paper/README.md: the first H200 windows (TF32) left Boston's and Concrete's 4-layer splits 0-1 and
    # Yacht's 4-layer split 0 in uci/ (their Concrete 1-layer splits 0-1 were made again on a CPU); every later
    # GPU cell there is float32
    assert got["uci"] == {
        ("boston", 0, "ensemble-4"),
        ("boston", 1, "ensemble-4"),
        ("concrete", 0, "ensemble-4"),
        ("concrete", 1, "ensemble-4"),
        ("yacht", 0, "ensemble-4"),
    }
    # the MC dropout cells an H200 made in TF32 came back in packs that were not committed; every GPU row left in
    # the record is one of them (Wine's 4-layer column, split 5 included, was made again in float32 on a CPU;
    # Naval's and Protein's 4-layer cells leave the set as they are made again)
    gpu = _gpu_rows(RESULTS / "uci-mcd-sghmc")
    tf32_left = {("naval", s, "mcd-4") for s in (0, 1)} | {("protein", s, "mcd-4") for s in range(5)}
    assert gpu <= tf32_left
    assert got["uci-mcd-sghmc"] == gpu
    assert got["uci-fanin"] == set()  # made on H100s and an H200 with float32 products, packs committed


def test_float32_commits_before_the_field_are_between_the_setting_and_the_field():
    if not (ROOT / ".git").exists():
        pytest.skip("no git history")
    for commit in window.FLOAT32_BEFORE_FIELD:

        def ancestor(a, b):
            return subprocess.run(["git", "merge-base", "--is-ancestor", a, b], cwd=ROOT).returncode == 0

        if subprocess.run(["git", "cat-file", "-e", commit], cwd=ROOT).returncode != 0:
            pytest.skip("a shallow history")
        assert ancestor("0876b39", commit)  # float32 products set by the command
        assert not ancestor("89d0172", commit)  # before cells wrote the setting


def test_stage_configs_follow_their_stage():
    base = UCIConfig()
    by = {s.name: window.stage_config(s, base) for s in window.STAGES}
    assert by["fanin-4"].network.scale_by_fan_in and not by["prior-4"].network.scale_by_fan_in
    assert by["prior-4"].max_splits == 3 and by["ensemble-1"].max_splits == 0
    assert by["ensemble-1"].methods == ("ensemble-1",)
    fine = by["sigma-fine"]
    assert set(fine.datasets) == {"kin8nm", "power"}
    assert set(fine.datasets) <= set(base.datasets) and fine.methods == ("ensemble-1",)
    grid = np.asarray(fine.noise_grid)
    assert len(grid) == 9 and grid[0] == 0.01 and grid[-1] == 0.1
    np.testing.assert_allclose(grid[1:] / grid[:-1], 10 ** (1 / 8), rtol=1e-4)  # steps of 10^(1/8)
    assert by["ensemble-1"].noise_grid == base.noise_grid and by["ensemble-1"].datasets == base.datasets


def test_plan_counts_within_pending_and_refuses_bad_input(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path))
    small = window.plan(window.STAGES, UCIConfig(), RESULTS, 1.0, 1)
    assert all(s.expected == 0 for s in small)  # no paper-scale cell fits in a second
    big = window.plan(window.STAGES, UCIConfig(), RESULTS, 1e7, 4)
    assert all(s.expected == s.pending for s in big)  # everything fits in months
    assert [s.pending for s in small] == [s.pending for s in big]
    with pytest.raises(ValueError, match="positive number of seconds"):
        window.plan(window.STAGES, UCIConfig(), RESULTS, 0.0, 1)
    with pytest.raises(ValueError, match="at least one process"):
        window.plan(window.STAGES, UCIConfig(), RESULTS, 10.0, 0)


TINY = [
    "--profile",
    "quick",
    "--datasets",
    "yacht",
    "--set",
    "n_particles=3",
    "--set",
    "lbfgs.steps=1",
    "--set",
    "lbfgs.iters_per_step=2",
    "--set",
    "noise_grid=[0.01, 0.1]",
    "--set",
    "max_splits=1",
    "--default-cell-s",
    "5",
]


@pytest.mark.skipif(not Path(MIRROR).is_dir(), reason=f"no UCI mirror at {MIRROR}")
def test_device_script_runs_end_to_end_on_a_cpu(tmp_path):
    records = tmp_path / "records"
    (records / "packs").mkdir(parents=True)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "WINDOW_S": "300",  # the workers exit when their cells are done; a loaded CI needs the room to start
        "PROCESSES": "2",
        "BENCH_S": "0", "PRECISION_S": "0",
        "BOOTENS_DATA_DIR": MIRROR,
        "BOOTENS_CACHE_DIR": str(tmp_path / "cache"),
        "JAX_PLATFORMS": "cpu",
        "PYTHON": os.environ.get("PYTHON", str(Path(os.sys.executable))),
    }
    args = ["--records", str(records), *TINY, "--stages", "ensemble-1", "tf32"]
    run = subprocess.run(
        ["bash", str(RESULTS / "device.sh"), "test-commit", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "the cost model expects" in run.stdout
    with tarfile.open(out / "window.tar") as tar:
        names = set(tar.getnames())
    assert {"worker-0.log", "worker-1.log", "ensemble-1-0.tar.gz"} <= names
    with tarfile.open(out / "window.tar") as tar:
        tar.extractall(out / "unpacked", filter="data")
    ran = {}
    for pack in (out / "unpacked").glob("*.tar.gz"):
        manifest, members = cellpack.read_pack(pack)
        ran[pack.name] = len(members)
        for rec in members.values():
            assert rec["provenance"]["git_commit"] == "test-commit" and rec["dataset"] == "yacht"
    # the first stage's one cell is shard 0's (of 2), estimated at the given 5 s: it fits and runs
    assert ran["ensemble-1-0.tar.gz"] == 1, ran


@pytest.mark.parametrize("caller", [None, "true"])
def test_the_planning_parent_does_not_preallocate_but_its_workers_do(tmp_path, monkeypatch, caller):
    # on one GPU the parent's default share (75%) left the workers' shares no room: the parent plans with
    # preallocation off; each worker gets its fraction and preallocates it, unless the caller said otherwise
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "unset")  # main() sets it; monkeypatch restores it
    if caller is None:
        monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
    else:
        monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", caller)
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "cache"))
    seen = []

    class Worker:
        def __init__(self, cmd, stdout, stderr, env):
            seen.append((os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"), env))

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(window.subprocess, "Popen", Worker)
    records = tmp_path / "records"
    records.mkdir()
    code = window.main(["--budget", "1", "--processes", "2", "--out", str(tmp_path / "out"),
                        "--records", str(records), *TINY, "--stages", "ensemble-1"])
    assert code == 0 and len(seen) == 2
    for parent, env in seen:
        assert parent == "false"
        assert env.get("XLA_PYTHON_CLIENT_PREALLOCATE") == caller
        assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.400"
