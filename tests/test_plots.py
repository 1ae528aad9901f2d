"""bootens_core.plots: every figure builds from a result, comes back closed, and renders to PNG.

(The linear-regression figures are exercised in ``experiments/test_linear.py`` on that experiment's result.)
"""

from __future__ import annotations

import io

import jax
import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from bootens_core import plots
from bootens_core.config import UnivariateConfig
from bootens_core.experiments import univariate


def render(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


@pytest.fixture(scope="module")
def uni():
    cfg = UnivariateConfig.quick()
    return univariate.run(jax.random.key(cfg.seed), cfg)


def test_univariate_figure(uni):
    before = set(plt.get_fignums())
    fig = plots.univariate(uni)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == len(uni["stages"])
    assert [ax.get_title() for ax in fig.axes] == [f"step {t}" for t in uni["stages"]]
    assert set(plt.get_fignums()) == before  # closed: a notebook shows it once, from the return value
    assert render(fig).startswith(b"\x89PNG")
