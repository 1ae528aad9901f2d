"""experiments.univariate (Figure 1): determinism, and the particles at each stage against their exact law."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from bootens_core.repro import store
from bootens_core.repro.experiments.univariate.config import UnivariateConfig
from bootens_core.repro.experiments import univariate

CFG = UnivariateConfig.quick()


@pytest.fixture(scope="module")
def result():
    return univariate.run(jax.random.key(CFG.seed), CFG, use_cache=False)


def _assert_identical(a, b):
    assert a.summary == b.summary
    assert set(a.arrays) == set(b.arrays)
    for k in a.arrays:
        np.testing.assert_array_equal(a.arrays[k], b.arrays[k], err_msg=k)


def test_same_key_same_result(result):
    again = univariate.run(jax.random.key(CFG.seed), CFG, use_cache=False)
    _assert_identical(result, again)


def test_other_seed_other_particles(result):
    cfg = dataclasses.replace(CFG, seed=CFG.seed + 1)
    other = univariate.run(jax.random.key(cfg.seed), cfg, use_cache=False)
    assert not np.allclose(other["particles"], result["particles"])
    assert not np.allclose(other["x"], result["x"])


def test_cached_run_equals_fresh_run(result):
    first = univariate.run(jax.random.key(CFG.seed), CFG)  # computes and stores (fresh test cache)
    second = univariate.run(jax.random.key(CFG.seed), CFG)  # loads
    _assert_identical(result, first)
    _assert_identical(result, second)


def test_a_published_result_is_what_a_later_run_reads(result, publish, tmp_path, monkeypatch):
    """conftest's ``publish``: a result a test computed lands under its cache key in BOOTENS_BOOK_CACHE, and a
    run with that directory as its cache reads it (the same provenance: nothing recomputed); without the
    variable nothing is written."""
    monkeypatch.delenv("BOOTENS_BOOK_CACHE", raising=False)
    publish(result)
    assert not any(tmp_path.iterdir())
    monkeypatch.setenv("BOOTENS_BOOK_CACHE", str(tmp_path / "book"))
    publish(result)
    publish(result)  # an entry that exists is left alone
    monkeypatch.setenv("BOOTENS_CACHE_DIR", str(tmp_path / "book"))
    read = univariate.run(jax.random.key(CFG.seed), CFG)
    _assert_identical(result, read)
    assert read.provenance == result.provenance
    other = dataclasses.replace(CFG, seed=CFG.seed + 1)
    assert univariate.run(jax.random.key(other.seed), other).provenance["cache_key"] != result.provenance["cache_key"]


def test_chapter_run_reads_a_run_the_book_stored(result, publish, chapter_run, tmp_path, monkeypatch):
    """conftest's ``chapter_run``: a run already under its cache key in BOOTENS_BOOK_CACHE (the book build
    computed it first) is read, not computed again (a computed run would carry a provenance of its own)."""
    monkeypatch.setenv("BOOTENS_BOOK_CACHE", str(tmp_path / "book"))
    publish(result)
    read = chapter_run("univariate", CFG)
    _assert_identical(result, read)
    assert read.provenance == result.provenance


def test_chapter_run_waits_for_a_run_the_book_is_still_computing(result, publish, chapter_run, tmp_path,
                                                                  monkeypatch):
    """While ``$BOOTENS_BOOK_RUNNING`` exists (make test runs the unit tests beside the book's last chapters),
    ``chapter_run`` waits for the run to appear in BOOTENS_BOOK_CACHE instead of computing it again."""
    import threading
    import time

    running = tmp_path / "running"
    running.touch()
    monkeypatch.setenv("BOOTENS_BOOK_CACHE", str(tmp_path / "book"))
    monkeypatch.setenv("BOOTENS_BOOK_RUNNING", str(running))

    def the_book_finishes():
        time.sleep(3)
        publish(result)
        time.sleep(1)
        running.unlink()

    book = threading.Thread(target=the_book_finishes)
    start = time.monotonic()
    book.start()
    read = chapter_run("univariate", CFG)
    waited = time.monotonic() - start
    book.join()
    assert read.provenance == result.provenance and waited >= 3  # the book's, after it appeared
    _assert_identical(result, read)


def test_arrays_and_stages(result):
    stages = result["stages"]
    np.testing.assert_array_equal(stages, CFG.stages)
    assert result["particles"].shape == (len(stages), CFG.n_particles)
    assert result["loss"].shape == (CFG.steps, CFG.n_particles)
    assert result["x"].shape == result["y"].shape == (CFG.n_data,)


def test_posterior_is_the_closed_form(result):
    """Conjugate one-weight model: precision sum(x^2)/sigma^2 + 1/alpha^2, mean sum(x y)/sigma^2 over the
    precision."""
    x, y = result["x"], result["y"]
    prec = np.sum(x**2) / CFG.noise_var + 1 / CFG.prior_var
    np.testing.assert_allclose(
        result["posterior"], [np.sum(x * y) / CFG.noise_var / prec, prec**-0.5], rtol=1e-12
    )
    s = result.summary
    assert s["contraction_per_step"] == pytest.approx(abs(1 - CFG.step_size * prec), rel=1e-12)


def test_particles_follow_their_exact_law_at_every_stage(result):
    """At each stage the k particles are iid from N(law_mean, law_sd^2) (gradient ascent keeps the population
    Gaussian): the sample mean within 5 law_sd/sqrt(k), the sample sd within 5 law_sd/sqrt(2(k-1))."""
    k = CFG.n_particles
    for i, t in enumerate(result["stages"]):
        p = result["particles"][i]
        m, sd = result["law_mean"][i], result["law_sd"][i]
        assert abs(p.mean() - m) < 5 * sd / np.sqrt(k), t
        assert abs(p.std(ddof=1) - sd) < 5 * sd / np.sqrt(2 * (k - 1)), t
    # Stage 0 is the prior; the last stage is the posterior.
    assert result["law_sd"][0] == pytest.approx(np.sqrt(CFG.prior_var))
    np.testing.assert_allclose(
        [result["law_mean"][-1], result["law_sd"][-1]], result["posterior"], rtol=1e-10
    )


def test_summary_is_consistent_with_the_arrays(result):
    s, final = result.summary, result["particles"][-1]
    mean_p, sd_p = result["posterior"]
    assert s["mean_error_sd"] == pytest.approx(abs(final.mean() - mean_p) / sd_p, rel=1e-12)
    assert s["sd_ratio"] == pytest.approx(final.std(ddof=1) / sd_p, rel=1e-12)
    assert 0 <= s["ks_pvalue"] <= 1


def test_typed_summary_is_the_summary_json(result, tmp_path):
    """The typed summary holds exactly the keys the run writes, with their values, also read back from disk;
    the verdict reads it as it reads the dict."""
    typed = univariate.Summary.of(result)
    assert dataclasses.asdict(typed) == result.summary
    again = univariate.Summary.of(store.load(store.save(result, tmp_path / "r")))
    assert again == typed
    assert str(univariate.verdicts.evaluate(typed)) == str(univariate.verdicts.evaluate(result.summary))
    older = {k: v for k, v in result.summary.items() if k not in ("ks_statistic", "optimizer")}
    with pytest.raises(ValueError, match="no ks_statistic, optimizer: not a Summary"):
        univariate.Summary.of(older)
