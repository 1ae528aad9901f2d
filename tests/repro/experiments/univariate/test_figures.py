"""experiments.univariate.figures: Figure 1 builds from a result, comes back closed, and renders to PNG."""

from __future__ import annotations

import io

import jax
import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from bootens_core.repro.experiments import univariate


@pytest.fixture(scope="module")
def uni():
    cfg = univariate.Config.quick()
    return univariate.run(jax.random.key(cfg.seed), cfg)


def test_stages_figure(uni):
    before = set(plt.get_fignums())
    fig = univariate.figures.stages(uni)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == len(uni["stages"])
    assert [ax.get_title() for ax in fig.axes] == [f"step {t}" for t in uni["stages"]]
    assert set(plt.get_fignums()) == before  # closed: a notebook shows it once, from the return value
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue().startswith(b"\x89PNG")
