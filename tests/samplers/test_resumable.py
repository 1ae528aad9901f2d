"""The resumable NUTS run: its chains are NumPyro's (``samplers.nuts``), an interrupted and resumed run gives
the draws of an uninterrupted one bit for bit, and a directory of other settings or a damaged chunk is refused
with one clear error."""

from __future__ import annotations

import fcntl
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bootens_core import samplers
from bootens_core.samplers import resumable

N_CHAINS, N_WARMUP, CHUNK, N_DRAWS, DEPTH = 2, 4, 4, 8, 4
# A correlated Gaussian in 3 dimensions; the record is a "predictive" of 5 values per draw.
_L = np.array([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [-0.3, 0.2, 0.5]])
_GRID = np.linspace(-1.0, 1.0, 5)


def _log_density(theta):
    z = jax.scipy.linalg.solve_triangular(jnp.asarray(_L), theta, lower=True)
    return -0.5 * jnp.sum(z**2)


def _record(theta):
    return theta[0] + theta[1] * jnp.asarray(_GRID) + theta[2] * jnp.asarray(_GRID) ** 2


def _sampler(max_tree_depth: int = DEPTH) -> resumable.ResumableNUTS:
    return resumable.resumable_nuts(_log_density, _record, 3, n_warmup=N_WARMUP, target_accept=0.8,
                                    max_tree_depth=max_tree_depth, chain_method="sequential")


KEY = jax.random.key(3)
POSITIONS = np.asarray(jax.random.normal(jax.random.key(4), (N_CHAINS, 3)), np.float64)


class _Interrupt(Exception):
    pass


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    where = tmp_path_factory.mktemp("resumable") / "run"
    progress = resumable.run_resumable(KEY, where, _sampler(), POSITIONS, chunk_draws=CHUNK, n_draws=N_DRAWS,
                                       identity={"problem": "gaussian-3"})
    return where, progress, resumable.read_run(where)


def _same_draws(a: resumable.RunRecord, b: resumable.RunRecord) -> None:
    for field in ("record", "accept_prob", "num_steps", "diverging", "potential_energy"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def test_chains_are_numpyros_nuts_chains(uninterrupted):
    """The truth for the chains: NumPyro's own MCMC (``samplers.nuts``) with the same key, start and
    settings; the record is ``_record`` of its draws."""
    _, progress, run = uninterrupted
    assert progress == progress._replace(warmup_done=N_WARMUP, draws_done=N_DRAWS, chunks=2, stopped="done")
    draws, info, log_dens, _, _ = samplers.nuts(KEY, _log_density, POSITIONS, n_warmup=N_WARMUP,
                                                n_draws=N_DRAWS, max_tree_depth=DEPTH,
                                                chain_method="sequential")
    want = np.asarray(jax.vmap(jax.vmap(_record))(jnp.asarray(draws)), np.float32)
    assert run.record.shape == (N_CHAINS, N_DRAWS, _GRID.size) and run.record.dtype == np.float32
    np.testing.assert_allclose(run.record, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(-run.potential_energy, log_dens, rtol=1e-12)
    assert run.diverging.sum(axis=1).tolist() == info["n_divergent"]
    np.testing.assert_allclose(run.num_steps.mean(axis=1), info["mean_num_steps"])
    hits = resumable.tree_depth_hits(run.num_steps, DEPTH)
    assert sum(c["tree_depth_hits"] for c in run.manifest["chunks"]) == hits.sum()
    assert run.num_steps.max() <= 2**DEPTH - 1


def test_an_interrupted_run_resumes_to_the_same_draws(uninterrupted, tmp_path):
    """Interrupted after its first chunk of draws, then resumed by a fresh sampler (as a new process would):
    the draws, the statistics and the final sampler state equal the uninterrupted run's, bit for bit."""
    whole, _, run = uninterrupted
    where = tmp_path / "run"

    def stop_after_first_chunk(p, chunk):
        if p.draws_done == CHUNK:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        resumable.run_resumable(KEY, where, _sampler(), POSITIONS, chunk_draws=CHUNK, n_draws=N_DRAWS,
                                identity={"problem": "gaussian-3"}, on_chunk=stop_after_first_chunk)
    assert resumable.read_run(where).record.shape[1] == CHUNK
    progress = resumable.run_resumable(KEY, where, _sampler(), POSITIONS, chunk_draws=CHUNK, n_draws=N_DRAWS,
                                       identity={"problem": "gaussian-3"})
    assert (progress.draws_done, progress.chunks, progress.stopped) == (N_DRAWS, 2, "done")
    resumed = resumable.read_run(where)
    _same_draws(resumed, run)
    state = resumed.manifest["state"]
    assert state == run.manifest["state"]
    with np.load(where / state) as a, np.load(whole / state) as b:
        assert sorted(a.files) == sorted(b.files) and "adapt_state.inverse_mass_matrix" in a.files
        for name in a.files:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_chunk_cut_off_before_the_manifest_is_ignored(uninterrupted, tmp_path, monkeypatch):
    """A crash after a chunk's files are written but before the manifest names them (here: the manifest
    write fails), plus a half-written copy of that chunk file and a stray temporary file: the resumed run
    ignores them, removes them and gives the uninterrupted draws."""
    _, _, run = uninterrupted
    where = tmp_path / "run"
    write_json = resumable._write_json

    def crash_on_the_last_chunk(path, doc):
        if doc["draws_done"] == N_DRAWS:
            raise _Interrupt
        write_json(path, doc)

    monkeypatch.setattr(resumable, "_write_json", crash_on_the_last_chunk)
    with pytest.raises(_Interrupt):
        resumable.run_resumable(KEY, where, _sampler(), POSITIONS, chunk_draws=CHUNK, n_draws=N_DRAWS,
                                identity={"problem": "gaussian-3"})
    monkeypatch.undo()
    unlisted = where / "chunk-000001.npz"
    assert unlisted.is_file() and json.loads((where / resumable.MANIFEST).read_text())["draws_done"] == CHUNK
    assert resumable.read_run(where).record.shape[1] == CHUNK  # the unlisted chunk is not read
    unlisted.write_bytes(unlisted.read_bytes()[: unlisted.stat().st_size // 2])  # and half-written
    (where / ".chunk-000001.npz.tmp-12345").write_bytes(b"partial")
    resumable.run_resumable(KEY, where, _sampler(), POSITIONS, chunk_draws=CHUNK, n_draws=N_DRAWS,
                            identity={"problem": "gaussian-3"})
    _same_draws(resumable.read_run(where), run)
    names = sorted(p.name for p in where.iterdir())
    assert names == [resumable.LOCK, "chunk-000000.npz", "chunk-000001.npz", "manifest.json",
                     run.manifest["state"]]


def test_a_damaged_chunk_is_refused(uninterrupted, tmp_path):
    whole, _, _ = uninterrupted
    where = tmp_path / "run"
    shutil.copytree(whole, where)
    chunk = where / "chunk-000000.npz"
    chunk.write_bytes(chunk.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"chunk-000000\.npz: the file is not the chunk the manifest lists"):
        resumable.read_run(where)
    with pytest.raises(ValueError, match=r"chunk-000000\.npz: the file is not the chunk"):
        resumable.run_resumable(KEY, where, _sampler(), POSITIONS, chunk_draws=CHUNK, n_draws=N_DRAWS + CHUNK,
                                identity={"problem": "gaussian-3"})
    chunk.unlink()
    with pytest.raises(ValueError, match="the manifest lists this chunk but the file is missing"):
        resumable.read_run(where)


@pytest.mark.parametrize("change, named", [
    ({"max_tree_depth": DEPTH + 1}, "sampler.max_tree_depth"),
    ({"key": jax.random.key(5)}, "key"),
    ({"positions": POSITIONS + 1.0}, "positions_sha256"),
    ({"identity": {"problem": "gaussian-4"}}, "caller.problem"),
])
def test_a_directory_of_other_settings_is_refused(uninterrupted, tmp_path, change, named):
    whole, _, _ = uninterrupted
    where = tmp_path / "run"
    shutil.copytree(whole, where)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in where.iterdir())
    args = {"key": KEY, "positions": POSITIONS, "identity": {"problem": "gaussian-3"}, **change}
    with pytest.raises(ValueError, match=rf"holds a run of other settings \({named}: .* there, .* here"):
        resumable.run_resumable(args["key"], where, _sampler(change.get("max_tree_depth", DEPTH)),
                                args["positions"], chunk_draws=CHUNK, n_draws=N_DRAWS + CHUNK,
                                identity=args["identity"])
    assert sorted((p.name, p.stat().st_mtime_ns) for p in where.iterdir()) == before  # nothing touched


def test_files_without_a_manifest_are_refused(tmp_path):
    (tmp_path / "chunk-000000.npz").write_bytes(b"not ours")
    with pytest.raises(ValueError, match=r"holds chunk-000000\.npz but no manifest\.json"):
        resumable.run_resumable(KEY, tmp_path, _sampler(), POSITIONS, chunk_draws=CHUNK, n_draws=N_DRAWS)


def test_keep_going_stops_between_chunks_and_the_warm_up_resumes(uninterrupted, tmp_path):
    """Stopped inside the warm-up (after one of two warm-up chunks of 2), the run is resumed with another
    chunk size: the draws do not depend on how the run was cut."""
    _, _, run = uninterrupted
    where = tmp_path / "run"
    seen = []
    p = resumable.run_resumable(KEY, where, _sampler(), POSITIONS, chunk_draws=2, n_draws=N_DRAWS,
                                keep_going=lambda p: p.warmup_done < 2, on_chunk=lambda p, c: seen.append(p),
                                identity={"problem": "gaussian-3"})
    assert (p.warmup_done, p.draws_done, p.stopped) == (2, 0, "stopped")
    assert len(seen) == 1 and seen[0].last_chunk_s is not None
    assert json.loads((where / resumable.MANIFEST).read_text())["warmup_done"] == 2
    resumable.run_resumable(KEY, where, _sampler(), POSITIONS, chunk_draws=2, n_draws=N_DRAWS,
                            identity={"problem": "gaussian-3"})
    again = resumable.read_run(where)
    assert len(again.manifest["chunks"]) == N_DRAWS // 2
    np.testing.assert_allclose(again.record, run.record, rtol=1e-12, atol=1e-12)


def test_a_directory_another_process_runs_is_refused(uninterrupted, tmp_path):
    """A second process on a running directory would remove the first one's unfinished files: refused at
    once while the lock is held (here by this process through another open file), read_run still reads."""
    whole, _, run = uninterrupted
    where = tmp_path / "run"
    shutil.copytree(whole, where)
    with open(where / resumable.LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match="another process is running this run"):
            resumable.run_resumable(KEY, where, _sampler(), POSITIONS, chunk_draws=CHUNK,
                                    n_draws=N_DRAWS + CHUNK, identity={"problem": "gaussian-3"})
        _same_draws(resumable.read_run(where), run)
