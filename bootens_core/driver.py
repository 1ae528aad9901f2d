"""The host-side loop shared by every long computation of the library: one compiled function called on a
schedule of chunks, with a progress bar between calls.

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

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax

__all__ = ["Chunk", "run_chunks"]


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
