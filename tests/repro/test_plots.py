"""bootens_core.repro.plots: the style wrapper and the drawing helpers the chapters share.

(Each experiment's figures are exercised beside it, in ``experiments/<name>/``, on that experiment's result.)
"""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

from bootens_core.repro import plots


def render(fig: Figure) -> bytes:
    """The PNG bytes of ``fig`` (the experiments' figure tests check that each renders)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def test_styled_draws_in_the_book_style_and_returns_the_figure_closed():
    seen = {}

    @plots.styled
    def draw():
        seen["font.size"] = plt.rcParams["font.size"]
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, 1])
        return fig

    before = set(plt.get_fignums())
    fig = draw()
    assert seen["font.size"] == plots.STYLE["font.size"]
    assert set(plt.get_fignums()) == before  # closed: a notebook shows it once, from the return value
    assert len(fig.axes) == 1


def test_data_ylim_pads_the_data_range_by_one_and_a_half_times_itself():
    assert plots.data_ylim({"y": np.array([1.0, 3.0, 2.0])}) == pytest.approx((-2.0, 6.0))


def test_function_panels_one_panel_per_entry_with_shared_axes():
    xg = np.linspace(-1, 1, 7)
    result = {"x": np.array([0.0, 0.5]), "y": np.array([1.0, 2.0]), "x_grid": xg}
    panels = [("step 0", np.zeros((3, 7)), "C0"), ("reference", np.ones((4, 7)), "C1")]
    fig = plots.styled(lambda: plots.function_panels(result, panels, panel_width=2.0, height=2.0, alpha=0.1, ms=2.0))()
    assert [ax.get_title() for ax in fig.axes] == ["step 0", "reference"]
    assert len(fig.axes[0].lines) == 3 + 1 and len(fig.axes[1].lines) == 4 + 1  # functions, then the data
    assert fig.axes[0].get_ylim() == pytest.approx((-0.5, 3.5))


def test_band_draws_the_mean_and_the_central_95_percent():
    f = np.vstack([np.full(5, v) for v in np.linspace(0, 1, 201)])
    fig, ax = plt.subplots()
    plots.band(ax, np.arange(5), f, "C0", "mean")
    assert ax.lines[0].get_ydata() == pytest.approx(np.full(5, 0.5))
    lo_hi = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert lo_hi.min() == pytest.approx(0.025) and lo_hi.max() == pytest.approx(0.975)
    plt.close(fig)
