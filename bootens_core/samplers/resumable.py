"""NumPyro's NUTS in chunks that survive an interruption: the sampler's state and every chunk's draws on disk.

A reference chain that needs days on a CPU is run as a sequence of chunks. :func:`resumable_nuts` builds the
sampler (NumPyro's ``NUTS`` kernel, driven through its public ``init``/``sample``: the same kernel, defaults
and keys as :func:`~bootens_core.samplers.nuts`, so its chains are that function's chains);
:func:`run_resumable` advances every chain ``chunk_draws`` transitions at a time -- through the warm-up
first, then through the kept draws -- and after each chunk saves to a directory:

- ``state-<T>.npz``: the sampler state of every chain after ``T`` transitions (NumPyro's ``HMCState``: the
  position, its gradient, the step size, the adapted inverse mass matrix and the adaptation's own state, the
  chain's PRNG key), under the names of its fields;
- ``chunk-<i>.npz`` (kept draws only): ``record(theta)`` of every new draw (e.g. the predictive function on
  an x grid, float32: never the parameters themselves), the acceptance probability, the leapfrog steps, the
  divergences and the potential energy of every transition;
- ``manifest.json``: the run's identity (the sampler's settings, the key, a hash of the starting points, the
  caller's own settings), the warm-up and draw chunks done with their statistics (tree-depth hits,
  divergences, seconds, the caller's note, e.g. the code's commit) and the name of the current state file.

Every file is written under a temporary name and renamed; the manifest is renamed last and is the only record
of what is done, so an interrupt at any moment leaves the previous chunk's run intact: a chunk file that the
manifest does not list (its chunk was cut off before the manifest named it) is ignored and written again.
Each chain carries its PRNG key in its state, so the draws do not depend on where the run was cut: a run
resumed from its directory gives the same draws, bit for bit on one machine, as a run never interrupted.

One process at a time runs a directory (it holds the lock file ``.lock``; a second one is refused, since it
would take the first one's unfinished files for leftovers); :func:`read_run` reads the kept draws back at any
time (checking every chunk's sha256 against the manifest).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._common import _check_initial, _count
from .nuts import nuts_settings

__all__ = [
    "FORMAT",
    "LOCK",
    "MANIFEST",
    "NUTSChunk",
    "ResumableNUTS",
    "RunProgress",
    "RunRecord",
    "read_run",
    "resumable_nuts",
    "run_resumable",
    "tree_depth_hits",
]

#: The format name (and version) a run directory's manifest carries.
FORMAT = "bootens-nuts-chunks/1"
#: The manifest's file name inside a run directory.
MANIFEST = "manifest.json"
#: The lock file a running :func:`run_resumable` holds (an advisory ``flock``): one process per directory.
LOCK = ".lock"


class NUTSChunk(NamedTuple):
    """What advancing every chain by ``n`` transitions gives: arrays of leading axes ``(n_chains, n)``.

    Attributes:
        record: ``record(theta)`` of the state after each transition, float32, ``(n_chains, n, *shape)``.
        accept_prob: the transition's mean acceptance probability (NumPyro's ``accept_prob``).
        num_steps: leapfrog steps of the transition's tree.
        diverging: whether the transition diverged.
        potential_energy: ``-log p`` of the state after the transition.
    """

    record: np.ndarray
    accept_prob: np.ndarray
    num_steps: np.ndarray
    diverging: np.ndarray
    potential_energy: np.ndarray


class ResumableNUTS(NamedTuple):
    """A NUTS sampler of one log density whose chains can be advanced a chunk at a time.

    Attributes:
        init: ``init(key, positions) -> state``: the state of every chain (NumPyro's ``HMCState``, numpy
            leaves with a leading chain axis) at ``positions`` ``(n_chains, m)``; chain ``c`` is initialised
            with ``jax.random.split(key, n_chains)[c]``, as NumPyro's ``MCMC.run`` does.
        advance: ``advance(state, n) -> (state, chunk)``: every chain ``n`` transitions further (warm-up
            transitions while ``state.i < n_warmup``) and the :class:`NUTSChunk` of those transitions.
        template: ``template(n_chains, m) -> state``: a state of the right structure, shapes and dtypes
            (zeros: for reading a state back, never for sampling).
        settings: the sampler's settings as JSON values (``n_warmup``, ``target_accept``, ``max_tree_depth``,
            ``dtype``, ``chain_method``: the resolved one).
        record_shape: the shape of ``record(theta)``.
    """

    init: Callable[[jax.Array, Any], Any]
    advance: Callable[[Any, int], tuple[Any, NUTSChunk]]
    template: Callable[[int, int], Any]
    settings: dict
    record_shape: tuple[int, ...]


def resumable_nuts(
    log_density: Callable[[jax.Array], jax.Array],
    record: Callable[[jax.Array], jax.Array],
    n_params: int,
    *,
    n_warmup: int,
    target_accept: float = 0.8,
    max_tree_depth: int = 10,
    dtype: Any = None,
    chain_method: str = "vectorized",
) -> ResumableNUTS:
    """NumPyro's NUTS on ``log_density``, as :func:`~bootens_core.samplers.nuts` runs it, a chunk at a time.

    Args:
        log_density: ``log p(theta)`` (unnormalised) of a vector ``theta`` of length ``n_params``, in
            ``dtype``.
        record: what is kept of each draw, ``record(theta)`` (e.g. the predictive function on a grid); stored
            as float32.
        n_params: the length ``m`` of ``theta``.
        n_warmup, target_accept, max_tree_depth, dtype, chain_method: as in
            :func:`~bootens_core.samplers.nuts_model` (``chain_method`` "auto" is resolved here).

    Returns:
        the :class:`ResumableNUTS` sampler.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        from numpyro.infer import NUTS

    n_warmup, max_tree_depth, target_accept, method, dtype = nuts_settings(
        n_warmup, max_tree_depth, target_accept, chain_method, dtype)
    n_params = _count("n_params", n_params, 1)
    # As in samplers.nuts: NumPyro's state is in JAX's default float dtype, the model is evaluated in dtype.
    state_dtype = jnp.result_type(float)
    record_shape = tuple(jax.eval_shape(record, jax.ShapeDtypeStruct((n_params,), dtype)).shape)

    @jax.jit
    def potential(theta: jax.Array) -> jax.Array:
        return -log_density(theta.astype(dtype)).astype(state_dtype)

    kernel = NUTS(potential_fn=potential, target_accept_prob=target_accept, max_tree_depth=max_tree_depth)
    primed: list[bool] = []

    def init_chain(key_data: jax.Array, position: jax.Array) -> Any:
        # NumPyro's kernel builds its sample function in init (from n_warmup and the settings above, not
        # from the position): every state this sampler advances comes from, or is primed by, this call.
        state = kernel.init(key_data, n_warmup, position, model_args=(), model_kwargs={})
        primed.append(True)
        return jax.tree.map(np.asarray, state)

    def init(key: jax.Array, positions: Any) -> Any:
        pos = jnp.asarray(positions, dtype)
        if pos.ndim != 2 or pos.shape[1] != n_params:
            raise ValueError(f"positions must have shape (n_chains, {n_params}), got {pos.shape}")
        _check_initial(np.asarray(jax.jit(jax.vmap(log_density))(pos)))
        keys = _key_data(jax.random.split(key, pos.shape[0]))
        pos = pos.astype(state_dtype)
        states = [init_chain(keys[c], pos[c]) for c in range(pos.shape[0])]
        return jax.tree.map(lambda *leaves: np.stack(leaves), *states)

    def template(n_chains: int, m: int) -> Any:
        one = init_chain(jnp.zeros(2, jnp.uint32), jnp.zeros(m, state_dtype))
        return jax.tree.map(lambda a: np.zeros((n_chains, *a.shape), a.dtype), one)

    def one_transition(state: Any, _: None) -> tuple[Any, tuple]:
        state = kernel.sample(state, (), {})
        out = (record(state.z.astype(dtype)).astype(jnp.float32), state.accept_prob, state.num_steps,
               state.diverging, state.potential_energy)
        return state, out

    @partial(jax.jit, static_argnums=1)
    def scan_one(state: Any, n: int) -> tuple[Any, tuple]:
        return jax.lax.scan(one_transition, state, None, length=n)

    @partial(jax.jit, static_argnums=1)
    def scan_all(state: Any, n: int) -> tuple[Any, tuple]:
        return jax.vmap(lambda s: jax.lax.scan(one_transition, s, None, length=n))(state)

    def advance(state: Any, n: int) -> tuple[Any, NUTSChunk]:
        n = _count("n", n, 1)
        if not primed:
            init_chain(jnp.asarray(state.rng_key[0]), jnp.asarray(state.z[0]))
        if method == "vectorized":
            new, outs = scan_all(state, n)
            new, outs = jax.tree.map(np.asarray, (new, outs))
        else:
            parts = [jax.tree.map(np.asarray, scan_one(jax.tree.map(lambda a, c=c: a[c], state), n))
                     for c in range(np.shape(state.z)[0])]
            new, outs = jax.tree.map(lambda *leaves: np.stack(leaves), *parts)
        return new, NUTSChunk(*outs)

    settings = {"n_warmup": n_warmup, "target_accept": target_accept, "max_tree_depth": max_tree_depth,
                "dtype": np.dtype(dtype).name, "chain_method": method}
    return ResumableNUTS(init, advance, template, settings, record_shape)


def tree_depth_hits(num_steps: Any, max_tree_depth: int) -> np.ndarray:
    """Where a transition's tree reached the depth limit: ``2**max_tree_depth - 1`` leapfrog steps (a tree
    of depth ``d`` has ``2**d - 1`` steps; NumPyro stops doubling there whether or not it turned)."""
    return np.asarray(num_steps) >= 2 ** int(max_tree_depth) - 1


# ------------------------------------------------------------------------------------------------ the run


class RunProgress(NamedTuple):
    """Where a run stands.

    Attributes:
        warmup_done: warm-up transitions done per chain.
        draws_done: kept draws saved per chain.
        chunks: chunk files of kept draws saved.
        last_chunk_s: seconds of the last chunk (warm-up or draws) run by this call; None before the first.
        session_s: seconds since this call began.
        stopped: why the call returned: "done" (``n_draws`` reached), "stopped" (``keep_going`` said so), or
            "running" (passed to the callbacks while the run goes on).
    """

    warmup_done: int
    draws_done: int
    chunks: int
    last_chunk_s: float | None
    session_s: float
    stopped: str


class RunRecord(NamedTuple):
    """The kept draws of a run directory (:func:`read_run`): arrays of leading axes ``(n_chains, draws)``.

    Attributes:
        manifest: the manifest (identity, chunks, statistics).
        record: ``record(theta)`` of every kept draw, float32.
        accept_prob, num_steps, diverging, potential_energy: as in :class:`NUTSChunk`.
    """

    manifest: dict
    record: np.ndarray
    accept_prob: np.ndarray
    num_steps: np.ndarray
    diverging: np.ndarray
    potential_energy: np.ndarray


def _key_data(key: jax.Array) -> jax.Array:
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else jnp.asarray(key)


@contextlib.contextmanager
def _locked(directory: Path):
    """Hold the directory's lock file for the duration (a second process is refused at once, not queued)."""
    import fcntl

    with open(directory / LOCK, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{directory}: another process is running this run (it holds {LOCK}); let it "
                             "finish or stop it first (read_run reads the draws meanwhile)") from None
        yield


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_atomic(path: Path, write: Callable[[Any], None]) -> None:
    """``write(file)`` into a temporary file beside ``path``, flushed to disk, then renamed to ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_json(path: Path, doc: dict) -> None:
    _write_atomic(path, lambda fh: fh.write((json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()))


def _state_arrays(state: Any) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(p).lstrip("."): np.asarray(a) for p, a in leaves}


def _load_state(path: Path, template: Any) -> Any:
    """The state saved in ``path``, in the structure of ``template``; a ValueError if it does not fit."""
    want = _state_arrays(template)
    try:
        with np.load(path, allow_pickle=False) as z:
            got = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"{path}: the sampler state cannot be read ({exc})") from None
    bad = [k for k in want if k not in got or got[k].shape != want[k].shape or got[k].dtype != want[k].dtype]
    if bad or set(got) != set(want):
        fields = bad or sorted(set(got) ^ set(want))
        raise ValueError(f"{path}: the saved sampler state does not fit this sampler (fields {fields})")
    treedef = jax.tree.structure(template)
    return jax.tree.unflatten(treedef, [got[k] for k in want])


def _flat(d: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _identity(sampler: ResumableNUTS, key: jax.Array, positions: np.ndarray, caller: Mapping) -> dict:
    pos = np.ascontiguousarray(positions, np.float64)
    digest = hashlib.sha256(repr(pos.shape).encode() + pos.tobytes()).hexdigest()
    ident = {
        "sampler": dict(sampler.settings),
        "key": np.asarray(_key_data(key)).astype(np.uint64).ravel().tolist(),
        "n_chains": int(pos.shape[0]),
        "n_params": int(pos.shape[1]),
        "positions_sha256": digest,
        "record_shape": list(sampler.record_shape),
        "caller": dict(caller),
    }
    # As JSON reads it back (tuples become lists), so that a run's identity equals the saved one.
    return json.loads(json.dumps(ident))


def _check_identity(directory: Path, saved: dict, ident: dict) -> None:
    a, b = _flat(saved), _flat(ident)
    diff = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    if diff:
        shown = "; ".join(f"{k}: {a.get(k, '<absent>')!r} there, {b.get(k, '<absent>')!r} here"
                          for k in diff[:6])
        more = "; ..." if len(diff) > 6 else ""
        raise ValueError(
            f"{directory} holds a run of other settings ({shown}{more}): resume it with its own settings, or "
            "give another directory"
        )


def _read_manifest(directory: Path) -> dict | None:
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a manifest of a resumable NUTS run (format {FORMAT!r})")
    return doc


def _verify_chunks(directory: Path, manifest: dict) -> None:
    for entry in manifest["chunks"]:
        path = directory / entry["file"]
        if not path.is_file():
            raise ValueError(f"{path}: the manifest lists this chunk but the file is missing")
        if _sha256(path) != entry["sha256"]:
            raise ValueError(f"{path}: the file is not the chunk the manifest lists (sha256 differs: damaged "
                             "or replaced); restore it, or remove the run directory and start again")


def run_resumable(
    key: jax.Array,
    directory: str | os.PathLike[str],
    sampler: ResumableNUTS,
    positions: Any,
    *,
    chunk_draws: int,
    n_draws: int | None = None,
    identity: Mapping | None = None,
    keep_going: Callable[[RunProgress], bool] | None = None,
    on_chunk: Callable[[RunProgress, NUTSChunk], None] | None = None,
    note: Mapping | None = None,
) -> RunProgress:
    """Run (or resume) ``sampler`` from ``positions`` in ``directory``, ``chunk_draws`` transitions a chunk.

    A fresh directory (absent, or without a manifest and without chunk or state files) starts the chains with
    ``sampler.init(key, positions)``; a directory holding a run continues it from its last saved chunk after
    checking that it was made with the same identity (the sampler's settings, ``key``, ``positions`` and
    ``identity``), else one ValueError lists what differs. The warm-up runs in chunks too (the last one
    shorter if ``chunk_draws`` does not divide it), then chunks of kept draws, each saved as it finishes (see
    the module docstring). The draws do not depend on ``chunk_draws``, which may change between calls.

    Args:
        key: the sampler's PRNG key (used at a fresh start; part of the identity).
        directory: the run directory.
        sampler: from :func:`resumable_nuts`.
        positions: ``(n_chains, m)`` starting points.
        chunk_draws: transitions per chunk and chain.
        n_draws: stop once this many draws per chain are kept (None: only ``keep_going`` stops the run).
        identity: the caller's settings that define the target (JSON values: model, data, seed, ...).
        keep_going: asked before every chunk; the run stops when it returns False (e.g. a time budget).
        on_chunk: called after every saved chunk, with the progress and the chunk.
        note: JSON values stored with every chunk's entry in the manifest (e.g. the code's commit).

    Returns:
        the :class:`RunProgress` when the call returns (``stopped`` says why).
    """
    start = time.monotonic()
    chunk_draws = _count("chunk_draws", chunk_draws, 1)
    if n_draws is not None:
        n_draws = _count("n_draws", n_draws, 0)
    directory = Path(directory)
    positions = np.asarray(positions, np.dtype(sampler.settings["dtype"]))
    if positions.ndim != 2:
        raise ValueError(f"positions must have shape (n_chains, m), got {positions.shape}")
    ident = _identity(sampler, key, positions, identity or {})
    n_warmup = int(sampler.settings["n_warmup"])
    max_depth = int(sampler.settings["max_tree_depth"])
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory):
        for stray in directory.glob(".*.tmp-*"):  # files of a write that was cut off
            stray.unlink(missing_ok=True)

        manifest = _read_manifest(directory)
        if manifest is None:
            leftovers = sorted(p.name for p in directory.iterdir() if p.name.startswith(("chunk-", "state-")))
            if leftovers:
                raise ValueError(f"{directory} holds {', '.join(leftovers[:3])} but no {MANIFEST}: not a run "
                                 "this function can resume; give another directory or remove those files")
            state = sampler.init(key, positions)
            manifest = {"format": FORMAT, "identity": ident, "warmup_done": 0, "draws_done": 0, "warmup": [],
                        "chunks": [], "state": None, "state_sha256": None}
            manifest = _save_state(directory, manifest, state)
        else:
            _check_identity(directory, manifest["identity"], ident)
            _verify_chunks(directory, manifest)
            listed = {manifest["state"], *(e["file"] for e in manifest["chunks"])}
            # Written by a chunk cut off before the manifest named its files:
            for stray in directory.iterdir():
                if stray.name.startswith(("chunk-", "state-")) and stray.name not in listed:
                    stray.unlink()
            state_path = directory / manifest["state"]
            if not state_path.is_file() or _sha256(state_path) != manifest["state_sha256"]:
                raise ValueError(f"{state_path}: the sampler state the manifest names is missing or damaged")
            state = _load_state(state_path, sampler.template(ident["n_chains"], ident["n_params"]))

        last: float | None = None

        def progress(stopped: str) -> RunProgress:
            return RunProgress(manifest["warmup_done"], manifest["draws_done"], len(manifest["chunks"]), last,
                               time.monotonic() - start, stopped)

        while True:
            warming = manifest["warmup_done"] < n_warmup
            if not warming and n_draws is not None and manifest["draws_done"] >= n_draws:
                return progress("done")
            if keep_going is not None and not keep_going(progress("running")):
                return progress("stopped")
            n = min(chunk_draws, n_warmup - manifest["warmup_done"]) if warming else chunk_draws
            if not warming and n_draws is not None:
                n = min(n, n_draws - manifest["draws_done"])
            t0 = time.monotonic()
            state, chunk = sampler.advance(state, n)
            seconds = time.monotonic() - t0
            hits = tree_depth_hits(chunk.num_steps, max_depth)
            entry = {
                "transitions": n,
                "seconds": round(seconds, 3),
                "divergences": int(chunk.diverging.sum()),
                "tree_depth_hits": int(hits.sum()),
                "mean_num_steps": float(chunk.num_steps.mean()),
                "mean_accept_prob": float(chunk.accept_prob.mean()),
                "step_size": np.asarray(state.adapt_state.step_size, np.float64).ravel().tolist(),
                "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "note": dict(note or {}),
            }
            if warming:
                manifest = {**manifest, "warmup_done": manifest["warmup_done"] + n,
                            "warmup": [*manifest["warmup"], entry]}
            else:
                name = f"chunk-{len(manifest['chunks']):06d}.npz"
                _write_atomic(directory / name, lambda fh, c=chunk: np.savez(fh, **c._asdict()))
                entry = {"file": name, "sha256": _sha256(directory / name),
                         "first_draw": manifest["draws_done"], **entry}
                manifest = {**manifest, "draws_done": manifest["draws_done"] + n,
                            "chunks": [*manifest["chunks"], entry]}
            manifest = _save_state(directory, manifest, state)
            last = seconds
            if on_chunk is not None:
                on_chunk(progress("running"), chunk)


def _save_state(directory: Path, manifest: dict, state: Any) -> dict:
    """Save ``state`` as a new state file, then the manifest naming it (the commit point), then remove the
    state file it replaces; returns the new manifest."""
    name = f"state-{manifest['warmup_done'] + manifest['draws_done']:09d}.npz"
    _write_atomic(directory / name, lambda fh: np.savez(fh, **_state_arrays(state)))
    old = manifest["state"]
    manifest = {**manifest, "state": name, "state_sha256": _sha256(directory / name)}
    _write_json(directory / MANIFEST, manifest)
    if old is not None and old != name:
        (directory / old).unlink(missing_ok=True)
    return manifest


def read_run(directory: str | os.PathLike[str]) -> RunRecord:
    """The kept draws of the run in ``directory``, chunks in order (each checked against the manifest's
    sha256: a damaged or missing chunk is a ValueError naming it); chunk files the manifest does not list
    are not read."""
    directory = Path(directory)
    manifest = _read_manifest(directory)
    if manifest is None:
        raise FileNotFoundError(f"{directory}: no {MANIFEST}: not a resumable NUTS run")
    _verify_chunks(directory, manifest)
    n_chains = manifest["identity"]["n_chains"]
    shape = tuple(manifest["identity"]["record_shape"])
    parts: dict[str, list[np.ndarray]] = {f: [] for f in NUTSChunk._fields}
    for entry in manifest["chunks"]:
        with np.load(directory / entry["file"], allow_pickle=False) as z:
            for f in NUTSChunk._fields:
                parts[f].append(z[f])
    if not manifest["chunks"]:
        none = (n_chains, 0)
        empty = NUTSChunk(np.zeros((*none, *shape), np.float32), np.zeros(none), np.zeros(none, np.int64),
                          np.zeros(none, bool), np.zeros(none))
        return RunRecord(manifest, *empty)
    arrays = [np.concatenate(parts[f], axis=1) for f in NUTSChunk._fields]
    if arrays[0].shape[:2] != (n_chains, manifest["draws_done"]):
        raise ValueError(f"{directory}: the chunks hold {arrays[0].shape[:2]} draws, the manifest says "
                         f"{(n_chains, manifest['draws_done'])}")
    return RunRecord(manifest, *arrays)
