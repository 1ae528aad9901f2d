"""repro.noise.subsets: subsets of the reference's rows against the rest, seeded, with clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from bootens_core.repro import noise


def test_each_subset_is_n_rows_and_the_rest_is_its_complement():
    draws = np.arange(40.0).reshape(20, 2)
    seen = noise.subsets(draws, 5, lambda a, b: (a.copy(), b.copy()), repeats=30, seed=3)
    assert len(seen) == 30
    for a, b in seen:
        assert a.shape == (5, 2) and b.shape == (15, 2)
        rows = sorted(map(tuple, np.concatenate([a, b])))
        assert rows == sorted(map(tuple, draws))  # every row once: a subset and its complement
    # seeded: the same subsets again, others with another seed
    again = noise.subsets(draws, 5, lambda a, b: a[:, 0].tolist(), repeats=30, seed=3)
    assert again == [a[:, 0].tolist() for a, _ in seen]
    assert again != noise.subsets(draws, 5, lambda a, b: a[:, 0].tolist(), repeats=30, seed=4)


def test_every_row_is_drawn_about_equally_often():
    """400 subsets of 10 of 40 rows: each row is in a subset with probability 1/4 (binomial sd about 0.022)."""
    draws = np.arange(40.0)
    counts = np.zeros(40)
    for a in noise.subsets(draws, 10, lambda a, b: a, repeats=400, seed=0):
        counts[a.astype(int)] += 1
    assert np.all(np.abs(counts / 400 - 0.25) < 5 * np.sqrt(0.25 * 0.75 / 400))


@pytest.mark.parametrize("n, repeats, match", [(1, 5, "2 <= n"), (11, 5, "2 n <= the reference's 20 draws"),
                                               (5, 0, "repeats must be >= 1")])
def test_bad_sizes_are_refused(n, repeats, match):
    with pytest.raises(ValueError, match=match):
        noise.subsets(np.zeros((20, 3)), n, lambda a, b: 0, repeats=repeats)


def test_unit_is_the_mean_of_the_first_statistic_and_the_rms_of_the_second():
    draws = np.random.default_rng(0).normal(size=(60, 3))

    def stat(a, b):
        return float(abs(a.mean() - b.mean())), float(np.log(a.std() / b.std()))

    u = noise.unit(draws, 10, stat, repeats=50, seed=2)
    each = noise.subsets(draws, 10, stat, repeats=50, seed=2)
    assert u.first == [a for a, _ in each] and u.second == [b for _, b in each]
    assert u.mean == pytest.approx(np.mean(u.first)) and u.rms == pytest.approx(np.sqrt(np.mean(np.square(u.second))))
    assert (u.n, u.repeats) == (10, 50)
    # the rule's size: further subsets judged in the unit's terms, counted by hand
    size = noise.rule_size(draws, 10, stat, 2.0, repeats=40, seed=3)
    ref, test = noise.unit(draws, 10, stat), noise.unit(draws, 10, stat, 40, 3)
    a = np.asarray(test.first) > 2 * ref.mean
    b = np.abs(test.second) > 2 * ref.rms
    assert size == {"first": a.mean(), "second": b.mean(), "either": (a | b).mean(), "repeats": 40}


def test_halves_pairs_every_split_of_the_chains_once():
    """Five chains: the splits into halves of two that hold chain 0 (the complement's last chain left out),
    each compared once; the unit is the mean of the first statistic and the rms of the second."""
    rng = np.random.default_rng(4)
    chains = rng.normal(size=(5, 7, 3))
    seen = []

    def statistic(a, b):
        seen.append((a.shape, b.shape))
        return float(a.mean() - b.mean()), float(a.std() / b.std())

    u = noise.halves(chains, statistic)
    want = []
    for first in ((0, 1), (0, 2), (0, 3), (0, 4)):
        other = [c for c in range(5) if c not in first][:2]
        want.append(statistic(chains[list(first)].reshape(-1, 3), chains[other].reshape(-1, 3)))
    assert u.repeats == 4 and u.n == 14 and seen[:4] == [((14, 3), (14, 3))] * 4
    assert u.first == [w[0] for w in want] and u.second == [w[1] for w in want]
    assert u.mean == np.mean([w[0] for w in want]) and u.rms == np.sqrt(np.mean(np.square([w[1] for w in want])))
    assert noise.halves(chains, statistic, max_partitions=2).repeats == 2


def test_pooled_names_what_it_needs():
    assert noise.pooled(np.zeros((2, 3, 4))).shape == (6, 4)
    with pytest.raises(ValueError, match=r"need \(chains, draws, n_x\) probabilities, got shape \(3, 4\)"):
        noise.pooled(np.zeros((3, 4)), "probabilities")
    with pytest.raises(ValueError, match=r"chains >= 2"):
        noise.halves(np.zeros((1, 3, 4)), lambda a, b: (0.0, 0.0))
