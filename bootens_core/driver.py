"""The host side shared by every long computation of the library: one compiled function called on a
schedule of chunks, with a progress bar between calls (:func:`run_chunks`), the cache that keeps those
compiled functions (:class:`ProgramCache`), and a count of the compilations that happen
(:class:`CompileCounter`).

Algorithm 1 (:func:`bootens_core.ensemble.train`), Metropolis-Hastings and SGHMC
(:mod:`bootens_core.samplers`) each compile one function that advances a carried state by a number of steps
given as data (a ``lax.scan`` or ``lax.fori_loop`` inside) and returns what it kept. Cut into chunks, the
same compiled function is called repeatedly, so the results do not depend on the chunking; between calls the
driver waits for the device and advances the bar. Without a progress bar the chunks run back to back, with no
waiting in between.

Example::

    chunks = [Chunk(args=(jnp.int32(100),), steps=100)] * 10
    state, outputs = run_chunks(jitted_advance, state, chunks, progress="MH", total=1000)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, NamedTuple

import jax

__all__ = ["Chunk", "run_chunks", "ProgramCache", "CompileCounter"]


class Chunk(NamedTuple):
    """One call of a chunked computation: the arguments after the carried state, and the number of steps the
    call advances (what the progress bar counts)."""

    args: tuple[Any, ...]
    steps: int


def run_chunks(
    fn: Callable[..., tuple[Any, Any]],
    carry: Any,
    chunks: Iterable[Chunk],
    *,
    progress: bool | str = False,
    label: str = "steps",
    total: int | None = None,
    unit: str = "step",
) -> tuple[Any, list[Any]]:
    """Call ``carry, out = fn(carry, *chunk.args)`` for every chunk in order; return the last carry and the
    list of outputs.

    ``progress``: show a tqdm bar (a string replaces ``label``) over ``total`` steps (default: the chunks'
    sum), advanced by ``chunk.steps`` after each call once the device has finished it. The bar is closed
    however the loop ends (an error, an interrupt).
    """
    chunks = list(chunks)
    bar = None
    if progress and chunks:
        from tqdm.auto import tqdm

        n = sum(c.steps for c in chunks) if total is None else int(total)
        bar = tqdm(total=n, desc=progress if isinstance(progress, str) else label, unit=unit)
    outputs = []
    try:
        for chunk in chunks:
            carry, out = fn(carry, *chunk.args)
            outputs.append(out)
            if bar is not None:
                jax.block_until_ready(carry)
                bar.update(chunk.steps)
    finally:
        if bar is not None:
            bar.close()
    return carry, outputs


class ProgramCache:
    """A small LRU of compiled functions, keyed by what decides the program.

    The key names the model and optimizer by :func:`bootens_core.models.program_key` and
    :meth:`bootens_core.ensemble.Optimizer.program_key` (signatures, shapes, static settings), never by object
    identity alone, so that two equal models built separately share one compilation; data, learning
    problems and noise variances are arguments of the compiled functions, not part of the key. A key that
    cannot be hashed (e.g. holding an unhashable function) is built every time and not kept.
    """

    def __init__(self, size: int = 32) -> None:
        self.size = int(size)
        self.hits = 0
        self.misses = 0
        self._store: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The function stored under ``key``, else ``build()`` (then stored, evicting the least recent)."""
        try:
            fn = self._store[key]
        except TypeError:
            self.misses += 1
            return build()
        except KeyError:
            self.misses += 1
            fn = self._store[key] = build()
            while len(self._store) > self.size:
                self._store.popitem(last=False)
            return fn
        self.hits += 1
        self._store.move_to_end(key)
        return fn

    def __len__(self) -> int:
        return len(self._store)


_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_counters: list[CompileCounter] = []
_counters_lock = threading.Lock()
_listening = False


def _on_duration(event: str, duration: float, **_: Any) -> None:
    if event in _COMPILE_EVENTS:
        me = threading.get_ident()
        with _counters_lock:
            for counter in _counters:
                if counter.thread is None or counter.thread == me:
                    counter.seconds += duration
                    counter.compiles += event == _BACKEND_COMPILE


class CompileCounter:
    """Context manager counting XLA compilations (``compiles``) and the seconds spent tracing, lowering and
    compiling (``seconds``) while it is open, from ``jax.monitoring``'s compile duration events.

    With ``per_thread`` only the compilations of the thread that opened it count (JAX compiles in the thread
    that calls the function being compiled), so work running at once in other threads is not added.
    """

    def __init__(self, per_thread: bool = False) -> None:
        self.compiles = 0
        self.seconds = 0.0
        self.per_thread = bool(per_thread)
        self.thread: int | None = None

    def __enter__(self) -> CompileCounter:
        global _listening
        with _counters_lock:
            if not _listening:
                jax.monitoring.register_event_duration_secs_listener(_on_duration)
                _listening = True
            self.thread = threading.get_ident() if self.per_thread else None
            _counters.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        with _counters_lock:
            if self in _counters:
                _counters.remove(self)
