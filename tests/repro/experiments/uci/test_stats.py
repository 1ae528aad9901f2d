"""The UCI chapter's statistics against the truth: scipy's tests and hand computations.

Our means against the paper's (Welch-type t-test with the paper's SE from its SD), paired comparisons of
methods on the same splits (scipy.stats.ttest_rel), Holm's family-wise count, the per-dataset ranking and the
rule that judges the paper's comparative claim.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from bootens_core.repro.experiments import uci


# --------------------------------------------------------------------------------------------------------------
# Our mean against the paper's


def _welch_by_hand(values, pm, psd, pn):
    v = np.asarray(values, float)
    n = v.size
    se = v.std(ddof=1) / math.sqrt(n)
    se_p = max(psd, 0.005) / math.sqrt(pn)
    var = se**2 + se_p**2 + 0.005**2 / 3
    df = var**2 / (se**4 / (n - 1) + se_p**4 / (pn - 1))
    t = (v.mean() - pm) / math.sqrt(var)
    return t, df, 2 * stats.t.sf(abs(t), df)


@pytest.mark.parametrize(
    ("values", "pm", "psd", "pn"),
    [
        ([3.1, 3.4, 2.9, 3.6, 3.0, 3.3, 2.8, 3.5, 3.2, 3.05], 3.17, 0.65, 10),
        ([0.21, 0.25, 0.19, 0.27, 0.24], 3.82, 4.44, 10),  # Yacht SGHMC MNLL: the old ±1 std band passed this
        ([0.0011, 0.0013, 0.0012, 0.0010], 0.00, 0.00, 10),  # Naval: the paper prints 0.00 ± 0.00
        ([1.90, 1.88, 1.91], 1.89, 0.03, 5),  # Protein: 5 splits in the paper
    ],
)
def test_compare_with_paper_is_the_welch_test_written_out(values, pm, psd, pn):
    got = uci.compare_with_paper(values, pm, psd, pn)
    t, df, p = _welch_by_hand(values, pm, psd, pn)
    assert got["t"] == pytest.approx(t, rel=1e-12)
    assert got["df"] == pytest.approx(df, rel=1e-12)
    assert got["p"] == pytest.approx(p, rel=1e-10)
    assert got["se"] == pytest.approx(np.std(values, ddof=1) / math.sqrt(len(values)), rel=1e-12)
    assert got["paper_se"] == pytest.approx(max(psd, 0.005) / math.sqrt(pn), rel=1e-12)
    expected = "no significant difference" if p >= 0.05 else ("better" if np.mean(values) < pm else "worse")
    assert got["verdict"] == expected
    assert got["margin"] == pytest.approx(abs(stats.norm.isf(p / 2) - stats.norm.isf(0.025)), rel=1e-9)


def _tost_by_hand(values, pm, psd, pn, level=0.05):
    """Two one-sided tests at ``level`` written out: each one-sided p below ``level``."""
    t, df, _ = _welch_by_hand(values, pm, psd, pn)
    v = np.asarray(values, float)
    diff = v.mean() - pm
    sed = diff / t if t else math.sqrt((v.std(ddof=1) / math.sqrt(v.size))**2 + (max(psd, 0.005) / math.sqrt(pn))**2
                                       + 0.005**2 / 3)
    delta = max(psd, 0.01)
    p_low = stats.t.sf((diff + delta) / sed, df)  # H0: diff <= -delta
    p_high = stats.t.cdf((diff - delta) / sed, df)  # H0: diff >= +delta
    return max(p_low, p_high) < level, diff, sed, df


@pytest.mark.parametrize(
    ("values", "pm", "psd", "pn", "expected"),
    [
        # within a tenth of the paper's SD, ten splits of small spread: equivalent (and p large)
        ([3.1, 3.2, 3.15, 3.25, 3.18, 3.12, 3.22, 3.16, 3.2, 3.19], 3.17, 0.65, 10, "equivalent"),
        # a non-rejection that is not equivalence: p far above 5%, but three noisy splits leave the interval
        # wider than the margin
        ([2.2, 4.4, 3.0], 3.17, 0.65, 10, "inconclusive"),
        # significantly different yet well inside the margin: equivalence wins (the difference is negligible)
        ([3.40, 3.41, 3.39, 3.40, 3.42, 3.38, 3.40, 3.41, 3.39, 3.40], 3.17, 1.5, 10, "equivalent"),
        # significantly lower, beyond the margin
        ([2.0, 2.1, 1.9, 2.05], 3.17, 0.65, 10, "differs (ours lower)"),
        ([4.5, 4.4, 4.6, 4.5], 3.17, 0.65, 10, "differs (ours higher)"),
        # the paper prints 0.00: untestable whatever ours is
        ([0.0011, 0.0013, 0.0012, 0.0010], 0.00, 0.00, 10, "untestable"),
        ([0.02, 0.021, 0.019], 0.0, 0.0, 10, "untestable"),
        ([1.0, float("nan"), 1.1], 1.0, 0.1, 10, "failed"),
        ([1.0, 1.1], 1.0, 0.1, 10, "too few splits"),
    ],
)
def test_equivalence_verdict_is_tost_within_the_papers_sd(values, pm, psd, pn, expected):
    got = uci.compare_with_paper(values, pm, psd, pn)
    assert got["equivalence"] == expected
    if expected in ("failed", "too few splits", "untestable"):
        return
    equivalent, diff, sed, df = _tost_by_hand(values, pm, psd, pn)
    assert equivalent == (expected == "equivalent")
    assert got["equivalence_margin"] == max(psd, 0.01)
    half = stats.t.ppf(0.975, df) * sed
    assert got["ci95"] == pytest.approx((diff - half, diff + half), rel=1e-9)
    # the bound is the smallest margin TOST would accept: equivalent exactly when it is below the margin
    assert (got["equivalence_bound"] < got["equivalence_margin"]) == equivalent
    if expected == "inconclusive":
        assert got["p"] >= 0.05 and got["verdict"] == "no significant difference"


def test_compare_with_paper_approaches_scipys_welch_when_rounding_is_negligible():
    # With SDs of order 1 the rounding term (0.005^2/3) is a 1e-5 relative change: scipy's Welch test agrees.
    rng = np.random.default_rng(3)
    ours = rng.normal(3.0, 0.7, size=10)
    got = uci.compare_with_paper(ours, 3.5, 0.8, 10)
    ref = stats.ttest_ind_from_stats(ours.mean(), ours.std(ddof=1), 10, 3.5, 0.8, 10, equal_var=False)
    assert got["t"] == pytest.approx(ref.statistic, rel=1e-4)
    assert got["p"] == pytest.approx(ref.pvalue, rel=1e-3)


def test_compare_with_paper_decides_the_cases_the_old_band_got_wrong():
    # Yacht SGHMC MNLL: ours about 0.23, the paper 3.82 ± 4.44 (SD, 10 splits): 3.6 SE of the paper away.
    yacht = uci.compare_with_paper([0.23, 0.20, 0.26, 0.22, 0.25, 0.21, 0.24, 0.23, 0.22, 0.24], 3.82, 4.44, 10)
    assert yacht["verdict"] == "better"
    same = uci.compare_with_paper([3.17, 3.18, 3.16], 3.17, 0.65, 10)
    assert same["verdict"] == "no significant difference" and same["p"] > 0.9


@pytest.mark.parametrize(
    ("values", "expected"),
    [([1.0, math.nan], "failed"), ([math.inf, 1.0], "failed"), ([], "failed"), ([1.0], "too few splits")],
)
def test_compare_with_paper_failed_and_too_few(values, expected):
    got = uci.compare_with_paper(values, 1.0, 0.1, 10)
    assert got["verdict"] == expected and got["margin"] is None and math.isnan(got["p"])


def test_compare_with_paper_gives_no_verdict_on_two_splits():
    # Boston, 4 layers, two splits made on a GPU: RMSE 21.91 and 18.70 against the paper's 3.17 ± 0.60. The
    # Welch-type test has about one degree of freedom there (5% critical value 12.7, scipy's t quantile), so
    # at two splits it would call them alike; with a third split of the same spread it sees the difference.
    assert stats.t.ppf(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    two = uci.compare_with_paper([21.91, 18.70], 3.17, 0.60, 10)
    assert two["verdict"] == "too few splits" and math.isnan(two["p"]) and two["sd"] == pytest.approx(2.2698, abs=1e-4)
    assert uci.MIN_SPLITS == 3
    three = uci.compare_with_paper([21.91, 18.70, 20.30], 3.17, 0.60, 10)
    assert three["verdict"] == "worse" and three["p"] < 0.05


def test_holm_step_down():
    assert uci.holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert uci.holm([0.01, 0.02], level=0.05) == [True, True]  # 0.01 <= 0.025, 0.02 <= 0.05
    assert uci.holm([0.03, math.nan]) == [True, False]  # NaN neither rejected nor counted
    assert uci.holm([]) == []


# --------------------------------------------------------------------------------------------------------------
# Paired comparisons


def test_paired_is_scipys_ttest_rel():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 0.3, size=10)
    b = a + rng.normal(0.2, 0.1, size=10)
    got = uci.paired(a, b)
    ref = stats.ttest_rel(a, b)
    assert got["t"] == pytest.approx(ref.statistic, rel=1e-12)
    assert got["p"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert got["df"] == 9 and got["n"] == 10
    assert got["diff"] == pytest.approx(np.mean(a - b), rel=1e-12)
    assert got["se"] == pytest.approx(np.std(a - b, ddof=1) / math.sqrt(10), rel=1e-12)
    assert got["verdict"] == ("better" if ref.pvalue < 0.05 else "no significant difference")
    assert got["z"] == pytest.approx(-stats.norm.isf(ref.pvalue / 2), rel=1e-9)  # a lower: negative


def test_paired_edge_cases():
    assert uci.paired([1.0], [2.0])["verdict"] == "too few splits"
    # two pairs: one degree of freedom, no verdict (RMSE 21.9, 18.7 against 3.3, 3.0 would be "no difference")
    assert uci.paired([21.9, 18.7], [3.3, 3.0])["verdict"] == "too few splits"
    assert stats.ttest_rel([21.9, 18.7], [3.3, 3.0]).pvalue > 0.05
    same = uci.paired([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert (same["p"], same["verdict"]) == (1.0, "no significant difference")
    shifted = uci.paired([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])  # every difference +1: no spread, certainly worse
    assert (shifted["p"], shifted["verdict"]) == (0.0, "worse")


def _cells(table):
    """Cell records from {(dataset, method id): [values per split]} (RMSE = the value, MNLL = value + 1)."""
    out = []
    for (ds, mid), vals in table.items():
        family, _, layers = mid.partition("-")
        for s, v in enumerate(vals):
            if v is None:
                continue
            out.append({"dataset": ds, "method": family, "hidden_layers": int(layers or 0), "split": s,
                        "test_rmse": v, "test_mnll": v + 1.0, "coverage95": 0.95})
    return out


def test_paired_comparisons_use_common_finite_splits():
    ens = [1.0, 1.2, math.nan, 0.9, 1.1]
    gp = [1.3, 1.1, 1.0, 1.4, None]  # split 4 not run
    recs = _cells({("yacht", "ensemble-1"): ens, ("yacht", "gp"): gp, ("boston", "mcd-1"): [1.0, 2.0]})
    rows = uci.paired_comparisons(recs, metrics=("rmse",))
    assert len(rows) == 1  # boston has no ensemble
    r = rows[0]
    assert (r["dataset"], r["ensemble"], r["baseline"], r["splits"], r["dropped"]) == ("yacht", "ensemble-1", "gp",
                                                                                     [0, 1, 3], 1)
    ref = stats.ttest_rel([1.0, 1.2, 0.9], [1.3, 1.1, 1.4])
    assert r["t"] == pytest.approx(ref.statistic) and r["p"] == pytest.approx(ref.pvalue)
    with pytest.raises(ValueError, match="appears twice"):
        uci.paired_comparisons(recs + recs[:1])


def test_report_paired_table_carries_the_tests():
    recs = _cells({("yacht", "ensemble-1"): [1.0, 1.2, 0.9, 1.1], ("yacht", "mcd-1"): [1.5, 1.6, 1.4, 1.7]})
    t = uci.verdicts.paired(recs)
    row = t.loc[("yacht", "RMSE", "Ensemble 1-layer", "MCD 1-layer")]
    ref = stats.ttest_rel([1.0, 1.2, 0.9, 1.1], [1.5, 1.6, 1.4, 1.7])
    assert row["ensemble is"] == "better" and row["p"] == f"{ref.pvalue:.3g}" and row["splits"] == 4
    assert row["t (df)"] == f"{ref.statistic:.2f} (3)"


def test_repeated_cells_pair_the_repeat_with_the_reference():
    ref = _cells({("yacht", "ensemble-1"): [1.0, 1.2, 0.9, 1.1, 0.8], ("boston", "gp"): [3.0, 3.1, 2.9]})
    rep = _cells({("yacht", "ensemble-1"): [1.1, 1.3, math.nan, 1.0, None, 2.0]})  # split 5: not in the reference
    rows = uci.repeated_cells(ref, {"GPU": rep}, metrics=("rmse",))
    assert len(rows) == 1
    r = rows[0]
    assert (r["label"], r["dataset"], r["method"], r["splits"], r["higher"]) == ("GPU", "yacht", "ensemble-1",
                                                                                 [0, 1, 3], 2)
    t = stats.ttest_rel([1.1, 1.3, 1.0], [1.0, 1.2, 1.1])  # repeat first: diff = repeat - reference
    assert r["t"] == pytest.approx(t.statistic) and r["p"] == pytest.approx(t.pvalue)
    assert r["diff"] == pytest.approx((0.1 + 0.1 - 0.1) / 3)
    with pytest.raises(ValueError, match="reference holds no boston/mcd-1"):
        uci.repeated_cells(ref, {"GPU": _cells({("boston", "mcd-1"): [1.0]})})


def test_report_repeats_table():
    ref = _cells({("yacht", "ensemble-1"): [1.0, 1.2, 0.9, 1.1]})
    rep = _cells({("yacht", "ensemble-1"): [1.3, 1.4, 1.2, 1.5]})
    t = uci.verdicts.repeats(ref, {"TF32": rep})
    row = t.loc[("TF32", "yacht", "Ensemble 1-layer", "MNLL")]
    ref_t = stats.ttest_rel([2.3, 2.4, 2.2, 2.5], [2.0, 2.2, 1.9, 2.1])
    assert row["repeat is"] == "worse" and row["higher on"] == "4 of 4" and row["p"] == f"{ref_t.pvalue:.3g}"


def test_pack_cells_reads_and_filters_packs(tmp_path):
    from bootens_core.repro import cellpack

    cells = _cells({("yacht", "ensemble-1"): [1.0, 1.1], ("yacht", "gp"): [2.0]})
    files = {f"{c['dataset']}/{c['method']}-{c['hidden_layers']}/split-{c['split']}.json":
             json.dumps(c).encode() for c in cells}
    pack = cellpack.write_pack(tmp_path / "cells.tar.gz", files, {"format": cellpack.PACK_FORMAT})
    assert len(uci.pack_cells(pack)) == 3
    got = uci.pack_cells(pack, methods=["ensemble-1"])
    assert sorted(c["split"] for c in got) == [0, 1] and {c["method"] for c in got} == {"ensemble"}
    assert uci.pack_cells(pack, datasets=["boston"]) == []
    bad = cellpack.write_pack(tmp_path / "bad.tar.gz", {"x/split-0.json": b'{"dataset": "yacht"}'},
                              {"format": cellpack.PACK_FORMAT})
    with pytest.raises(ValueError, match="bad.tar.gz, x/split-0.json: not a UCI cell record"):
        uci.pack_cells(bad)


# --------------------------------------------------------------------------------------------------------------
# Ranking


def test_ranking_on_common_splits():
    recs = _cells({("yacht", "ensemble-1"): [1.0, 3.0, 2.0, 2.0], ("yacht", "gp"): [2.0, 1.0, 0.5, None],
                   ("yacht", "mcd-1"): [3.3, 2.0, 1.0, 1.0], ("boston", "gp"): [1.0, 1.0, 1.0]})
    rows = [r for r in uci.ranking(recs) if r["metric"] == "rmse"]
    assert {r["dataset"] for r in rows} == {"yacht"}  # boston has one method: nothing to rank
    # common finite splits 0-2; ranks per split (ens, gp, mcd): (1, 2, 3), (3, 1, 2), (3, 1, 2); the tie of
    # ens and mcd in mean rank (7/3) is broken by the mean (2.0 < 2.1)
    got = {r["method"]: (r["position"], r["mean_rank"], r["mean"], r["splits"]) for r in rows}
    want = {"gp": (1, 4 / 3, 3.5 / 3, 3), "ensemble-1": (2, 7 / 3, 2.0, 3), "mcd-1": (3, 7 / 3, 6.3 / 3, 3)}
    assert got.keys() == want.keys() and all(got[m] == pytest.approx(want[m]) for m in want)
    assert all(r["left_out"] == {} for r in rows)


def test_ranking_leaves_out_a_method_with_too_few_splits():
    # A method run on one split (a failed 4-layer ensemble) must not cut the others' ranking to that split.
    recs = _cells({("yacht", "ensemble-1"): [1.0, 3.0, 2.0, 2.5], ("yacht", "gp"): [2.0, 1.0, 1.5, 1.0],
                   ("yacht", "ensemble-4"): [20.0]})
    rows = [r for r in uci.ranking(recs) if r["metric"] == "rmse"]
    assert {r["method"] for r in rows} == {"ensemble-1", "gp"}
    assert all(r["splits"] == 4 and r["left_out"] == {"ensemble-4": 1} for r in rows)
    # on the four splits: ranks (ens, gp) = (1, 2), (2, 1), (2, 1), (2, 1)
    got = {r["method"]: (r["position"], r["mean_rank"]) for r in rows}
    assert got == {"gp": (1, 1.25), "ensemble-1": (2, 1.75)}
    table = uci.verdicts.ranking(recs)
    assert table.loc[("yacht", "RMSE"), "common splits"] == 4
    assert table.loc[("yacht", "RMSE"), "left out (too few splits)"] == "Ensemble 4-layer (1 split)"
    # Three splits each but only two in common: the method with fewer splits leaves, the rest keep theirs.
    recs = _cells({("yacht", "ensemble-1"): [1.0, 3.0, 2.0, 2.5], ("yacht", "gp"): [2.0, 1.0, 1.5, 1.0],
                   ("yacht", "mcd-1"): [None, None, 1.0, 2.0, 3.0]})
    rows = [r for r in uci.ranking(recs) if r["metric"] == "rmse"]
    assert {r["method"] for r in rows} == {"ensemble-1", "gp"} and rows[0]["left_out"] == {"mcd-1": 3}


# --------------------------------------------------------------------------------------------------------------
# The comparative claim


def _claim_records(shift_by_dataset, n=8, seed=1):
    """Ensemble-1 = GP + shift + small noise, MCD-1 far worse than both, on datasets given by their shift."""
    rng = np.random.default_rng(seed)
    table = {}
    for ds, shift in shift_by_dataset.items():
        base = rng.normal(2.0, 0.5, size=n)
        table[(ds, "gp")] = list(base)
        table[(ds, "mcd-1")] = list(base + 5.0)
        table[(ds, "ensemble-1")] = list(base + shift + rng.normal(0, 0.05, size=n))
    return _cells(table)


def test_claim_supported_when_the_ensemble_is_never_worse():
    c = uci.comparative_claim(_claim_records({"yacht": -0.3, "boston": 0.0, "wine": 0.0}))
    e = c["ensembles"]["ensemble-1"]
    assert c["verdict"] == "supported" and e["holds"]
    assert len(e["pairs"]) == 6 and e["needed"] == 4
    assert all(p["baseline"] == "gp" for p in e["pairs"])  # the best baseline by mean, not MCD


def test_claim_not_supported_and_its_margin_by_hand():
    recs = _claim_records({"yacht": 1.0, "boston": 1.0, "wine": 0.0})
    c = uci.comparative_claim(recs)
    e = c["ensembles"]["ensemble-1"]
    # yacht and boston: worse on RMSE and MNLL (4 pairs), wine: competitive (2 pairs); 2 of 6 < 4 needed
    assert (e["competitive"], e["needed"], e["holds"], c["verdict"]) == (2, 4, False, "not supported")
    zc = stats.norm.isf(0.025)
    worse = sorted(abs(math.copysign(stats.norm.isf(p["p"] / 2), p["diff"]) - zc)
                   for p in e["pairs"] if not p["competitive"])
    assert c["margin"] == pytest.approx(worse[1], rel=1e-9)  # two pairs must flip to reach 4
    for p in e["pairs"]:
        gp = [r["test_" + p["metric"]] for r in recs if r["dataset"] == p["dataset"] and r["method"] == "gp"]
        ens = [r["test_" + p["metric"]] for r in recs if r["dataset"] == p["dataset"] and r["method"] == "ensemble"]
        assert p["p"] == pytest.approx(stats.ttest_rel(ens, gp).pvalue, rel=1e-10)


def test_claim_partly_and_not_tested_and_the_report():
    recs = _claim_records({"yacht": 0.0})
    four = [{**r, "hidden_layers": 4, "test_rmse": r["test_rmse"] + 2.0, "test_mnll": r["test_mnll"] + 2.0}
            for r in recs if r["method"] == "ensemble"]
    c = uci.comparative_claim(recs + four)
    assert c["verdict"] == "partly supported"
    assert c["ensembles"]["ensemble-1"]["holds"] and not c["ensembles"]["ensemble-4"]["holds"]
    assert uci.comparative_claim(_cells({("yacht", "gp"): [1.0, 2.0]}))["verdict"] == "not tested"
    # two common splits make no pair: a 4-layer ensemble far worse on two splits is not counted as competitive
    two = [{**r, "test_rmse": r["test_rmse"] + 15.0} for r in four if r["split"] < 2]
    assert "ensemble-4" not in uci.comparative_claim(recs + two)["ensembles"]
    v, table = uci.verdicts.claim(recs + four)
    assert str(v).startswith("partly supported") and v.margin == pytest.approx(c["margin"])
    assert "Ensemble 4-layer: competitive on 0 of 2" in v.evidence
    assert set(table["competitive"]) == {"yes", "no (significantly worse)"}
