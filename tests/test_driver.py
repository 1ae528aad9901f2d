"""The chunked host loop shared by the ensemble and the samplers (:mod:`bootens_core.driver`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from bootens_core.driver import Chunk, run_chunks


def _add(carry, inc, times):
    """Advance a counter ``times`` times by ``inc``; output the values it passed through."""
    values = carry + inc * jnp.arange(1, times + 1)
    return values[-1], values


@pytest.mark.parametrize("progress", [False, True, "label"])
def test_chunks_run_in_order_and_match_one_call(progress):
    plan = [Chunk((2, 3), 3), Chunk((2, 1), 1), Chunk((2, 4), 4)]
    carry, outs = run_chunks(_add, jnp.asarray(0), plan, progress=progress)
    whole_carry, whole = _add(jnp.asarray(0), 2, 8)
    assert int(carry) == int(whole_carry) == 16
    np.testing.assert_array_equal(np.concatenate(outs), np.asarray(whole))


def test_no_chunks_returns_the_carry():
    carry, outs = run_chunks(_add, jnp.asarray(5), [], progress=True)
    assert int(carry) == 5 and outs == []


def test_an_error_in_a_chunk_propagates_and_closes_the_bar(monkeypatch):
    closed = []
    import tqdm.auto

    class Bar:
        def __init__(self, **kw):
            self.kw = kw

        def update(self, n):
            pass

        def close(self):
            closed.append(True)

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)

    def fail(carry, i):
        if i == 1:
            raise RuntimeError("chunk 1 failed")
        return carry, i

    with pytest.raises(RuntimeError, match="chunk 1 failed"):
        run_chunks(fail, 0, [Chunk((0,), 1), Chunk((1,), 1)], progress=True)
    assert closed == [True]


def test_compile_counter_per_thread():
    import threading

    import jax

    from bootens_core.driver import CompileCounter

    def compile_once(n):
        jax.jit(lambda v: v * 3 + n)(jnp.arange(n + 1.0)).block_until_ready()

    with CompileCounter() as everywhere, CompileCounter(per_thread=True) as mine:
        t = threading.Thread(target=compile_once, args=(17,))
        t.start()
        t.join()
        assert mine.compiles == 0 and everywhere.compiles >= 1
        compile_once(19)
    assert mine.compiles >= 1 and everywhere.compiles >= 2


def test_program_cache_keeps_the_most_recent():
    from bootens_core.driver import ProgramCache

    cache, built = ProgramCache(2), []

    def build(name):
        built.append(name)
        return name

    for key in ["a", "b", "a", "c", "b"]:
        assert cache.get(key, lambda k=key: build(k)) == key
    assert built == ["a", "b", "c", "b"]  # "b" was evicted by "c" ("a" had been used more recently)
    assert len(cache) == 2 and cache.hits == 1
    assert cache.get(["unhashable"], lambda: "built") == "built" and len(cache) == 2
