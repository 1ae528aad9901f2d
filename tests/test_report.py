"""bootens_core.report: the verdict rules the book prints."""

from __future__ import annotations

import numpy as np
import pytest

from bootens_core import report

K = 200
UNI_OK = {
    "mean_error_sd": 0.05,
    "mean_error_sd_mc_scale": 1 / np.sqrt(K),
    "sd_ratio": 1.02,
    "sd_ratio_mc_scale": 1 / np.sqrt(2 * (K - 1)),
    "ks_pvalue": 0.4,
}


def test_text_displays_as_itself():
    t = report.Text("reproduced")
    assert str(t) == repr(t) == t._repr_markdown_() == "reproduced"


def test_univariate_reproduced():
    assert str(report.univariate_verdict(UNI_OK)) == "reproduced"


@pytest.mark.parametrize(
    "change",
    [
        {"mean_error_sd": 4.01 / np.sqrt(K)},
        {"sd_ratio": 1 + 4.01 / np.sqrt(2 * (K - 1))},
        {"sd_ratio": 1 - 4.01 / np.sqrt(2 * (K - 1))},
        {"ks_pvalue": 9e-4},
    ],
)
def test_univariate_not_reproduced(change):
    assert str(report.univariate_verdict({**UNI_OK, **change})) == "NOT reproduced"


LIN = {
    "kl_final": 6.1,
    "paper_setting_kl_final": 494.0,
    "self_distance_mean": 6.0,
    "self_distance_sd": 0.25,
    "map_cov_z": 0.3,
    "map_subspace_kl_z": -0.2,
    "map_mean_chi2_pvalue": 0.5,
}


@pytest.mark.parametrize(
    "change, kl, map_",
    [
        ({}, "reproduced with a deviation (Adagrad h = 0.1, 20 000 steps)", "reproduced"),
        ({"paper_setting_kl_final": 6.5}, "reproduced", "reproduced"),
        ({"kl_final": 6.0 + 3 * 0.25 + 0.01}, "NOT reproduced", "reproduced"),
        (
            {"map_cov_z": -4.5},
            "reproduced with a deviation (Adagrad h = 0.1, 20 000 steps)",
            "NOT reproduced",
        ),
        (
            {"map_subspace_kl_z": 4.5},
            "reproduced with a deviation (Adagrad h = 0.1, 20 000 steps)",
            "NOT reproduced",
        ),
        (
            {"map_mean_chi2_pvalue": 1e-4},
            "reproduced with a deviation (Adagrad h = 0.1, 20 000 steps)",
            "NOT reproduced",
        ),
    ],
)
def test_linear_verdicts(change, kl, map_):
    v = report.linear_verdicts({**LIN, **change})
    assert str(v["kl"]) == kl and str(v["map"]) == map_
