"""bootens_core.repro.plots: the UCI figures build from a result, come back closed, and render to PNG.

(Each experiment's figures are exercised beside it, in ``experiments/<name>/``, on that experiment's result.)
"""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from bootens_core.repro.experiments import uci


def render(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _uci_result(values):
    from bootens_core.repro.store import Result

    lines = ["dataset,split,method,hidden_layers,test_rmse,test_mnll,coverage95"]
    for (ds, meth, layers), splits in values.items():
        lines += [f"{ds},{k},{meth},{layers},{r},{m},{c}" for k, (r, m, c) in enumerate(splits)]
    return Result("uci", {}, {}, {}, files={"cells.csv": "\n".join(lines) + "\n"})


def test_uci_splits_one_row_per_dataset_and_clips_outliers():
    res = _uci_result({
        ("boston", "ensemble", 1): [(3.0, 2.5, 0.94), (3.2, 2.6, 0.95), (1e20, 2.7, 1.0)],
        ("boston", "gp", 0): [(2.9, 2.4, 0.95), (3.1, 2.5, 0.93), (3.0, "nan", 0.96)],
        ("yacht", "ensemble", 1): [(0.5, 1.0, 0.9), (0.6, 1.1, 0.92), (0.7, 1.2, 0.97)],
    })
    before = set(plt.get_fignums())
    fig = uci.figures.splits(res)
    assert set(plt.get_fignums()) == before
    assert len(fig.axes) == 2 * 3
    ax = fig.axes[0]
    assert ax.get_title() == "boston: test RMSE"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ensemble-1", "gp"]
    # the diverged split is drawn at the top edge with its value, and the y-range stays readable
    assert ax.get_ylim()[1] < 100
    assert any(t.get_text() == "1e+20" for t in ax.texts)
    assert any(t.get_text() == "nan" for t in fig.axes[1].texts)
    assert render(fig).startswith(b"\x89PNG")


def test_uci_lbfgs_figure():
    import numpy as np

    loss = 100 * np.exp(-np.arange(50) / 10) + 5
    check = {"fixed": loss, "train": loss, "zoom": loss - 1, "scipy": loss - 2, "direction_rel_err": np.full(50, 1e-16),
             "dataset": "boston", "split": 0, "hidden_layers": 1, "n_params": 751}
    fig = uci.figures.lbfgs(check)
    assert len(fig.axes) == 2
    assert fig.axes[0].get_yscale() == "log" and fig.axes[1].get_yscale() == "log"
    assert render(fig).startswith(b"\x89PNG")


def test_uci_pit_figure_one_panel_per_dataset_and_method():
    recs = []
    for ds in ("boston", "yacht"):
        for meth, layers in (("ensemble", 1), ("deep", 1)):
            for s in range(2):
                recs.append({"dataset": ds, "method": meth, "hidden_layers": layers, "split": s,
                             "pit_counts": [s + 1] * 10})
    recs.append({"dataset": "yacht", "method": "gp", "hidden_layers": 0, "split": 0})  # no calibration fields
    fig = uci.figures.pit(recs)
    axes = fig.axes
    assert len(axes) == 4
    assert [ax.get_title() for ax in axes] == ["boston: ensemble-1", "deep-1", "yacht: ensemble-1", "deep-1"]
    heights = [p.get_height() for p in axes[0].containers[0]]
    assert heights == pytest.approx([0.1] * 10)  # pooled shares
