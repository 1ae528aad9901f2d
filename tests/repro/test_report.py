"""bootens_core.repro.report: the verdict rules the book prints."""

from __future__ import annotations

import pytest

from bootens_core.repro import report
from bootens_core.repro.experiments import toy_relu
from bootens_core.repro.experiments import deep_relu
from bootens_core.repro.experiments import classification


def test_text_displays_as_itself():
    t = report.Text("reproduced")
    assert str(t) == repr(t) == t._repr_markdown_() == "reproduced"


# ------------------------------------------------------------------------------------------ classification


# ------------------------------------------------------------------------------------------ verdict margins


def test_verdict_is_text_with_evidence_and_margin():
    v = report.Verdict("reproduced", "x = 1", 2.5)
    assert str(v) == repr(v) == "reproduced" and v.evidence == "x = 1" and v.margin == 2.5
    table = report.verdict_table({"a": v, "b": report.Verdict("NOT reproduced")}, {"a": "claim A"})
    assert list(table.index) == ["claim A", "b"]
    assert table.loc["claim A", "margin (noise units)"] == "2.5" and table.loc["b", "margin (noise units)"] == "—"


@pytest.mark.parametrize("fn, s", [
    (toy_relu.verdicts.evaluate, {"kde_self_distance_sd": 0.11, "kde_self_distance_mean": 6.9, "kl_max_increase": 1.0012,
                                "rhat_max": 1.0234, "rhat_iid_q99": 1.0612, "kl_final_vs_exact": 12.94}),
    # deep ReLU: not converged by R-hat, by ESS, and converged (with the along-steps verdict)
    (deep_relu.verdicts.evaluate, {"rhat_max": 1.3097, "ess_min": 123.4, "mean_abs_diff_mean": 0.3712,
                                 "sd_ratio_median": 1.308, "reference_noise_mad": 0.1698,
                                 "reference_noise_log_sd": 0.0211}),
    (deep_relu.verdicts.evaluate, {"rhat_max": 1.0512, "ess_min": 23.4, "mean_abs_diff_mean": 0.3712,
                                 "sd_ratio_median": 1.308, "reference_noise_mad": 0.1698,
                                 "reference_noise_log_sd": 0.0211}),
    (deep_relu.verdicts.evaluate, {"rhat_max": 1.0051, "ess_min": 812.3, "mean_abs_diff_mean": 0.2712,
                                 "sd_ratio_median": 1.0308, "reference_noise_mad": 0.1698,
                                 "reference_noise_log_sd": 0.0211, "agreement_steps": [100, 200, 300],
                                 "mean_abs_diff_mean_along": [0.1234, 0.2712, 0.5123],
                                 "sd_ratio_median_along": [1.0123, 1.0308, 1.2345]}),
    # classification: not converged, and converged
    (classification.verdicts.evaluate, {"rhat_max": 1.2345, "ess_bulk_min": 54.3, "prob_mad_vs_mcmc": 0.0353,
                                        "width_ratio_vs_mcmc": 0.3712, "reference_noise_prob_mad": 0.0123,
                                        "reference_noise_log_width": 0.0456}),
    (classification.verdicts.evaluate, {"rhat_max": 1.0045, "ess_bulk_min": 954.3, "prob_mad_vs_mcmc": 0.0153,
                                        "width_ratio_vs_mcmc": 1.0412, "reference_noise_prob_mad": 0.0123,
                                        "reference_noise_log_width": 0.0456}),
])
def test_verdict_texts_carry_no_measured_number(fn, s):
    """A checked notebook output prints the verdict text: a measured number there would move with rounding."""
    import re

    for name, v in fn(s).items():
        values = [x for v in s.values() for x in (v if isinstance(v, list) else [v])]
        measured = {f"{x:.{d}f}" for x in values for d in (1, 2, 3) if x not in (1.1, 0.8)}
        found = set(re.findall(r"\d+\.\d+", str(v))) & measured
        assert not found, (name, str(v))
        assert v.evidence, name  # ... the numbers are in the evidence instead


def test_provenance_block_is_collapsed_and_complete():
    prov = {"device": {"kind": "NVIDIA H100", "count": 1}, "finished_utc": "2026-11-23T11:30:16Z",
            "git_commit": "f4cc185d3b6ac5829f2a7fc9b731166458a7720e", "versions": {"jax": "0.10.2"},
            "wall_time_s": 3941.26, "note": "<b>"}
    block = report.Provenance(prov, "paper-scale record")
    assert repr(block) == "Provenance of the paper-scale record: NVIDIA H100, 2026-11-23, commit f4cc185"
    page = block._repr_html_()
    assert page.startswith("<details") and page.count("<details") == 1 and "open" not in page
    assert "<summary>Provenance of the paper-scale record: NVIDIA H100, 2026-11-23, commit f4cc185</summary>" in page
    assert "<th style='text-align:left'>versions: jax</th><td>0.10.2</td>" in page
    assert "<th style='text-align:left'>device: kind</th><td>NVIDIA H100</td>" in page
    assert "<th style='text-align:left'>finished (UTC)</th>" in page and "<th style='text-align:left'>git commit</th>" in page
    assert "<th style='text-align:left'>wall time (s)</th><td>3941.3</td>" in page  # seconds to 0.1 s
    assert "<td>&lt;b&gt;</td>" in page  # text escaped
    assert repr(report.Provenance({}, "x")) == "Provenance of the x: device not recorded"
    folded = {"device": {"kind": "cpu"}, "cell_devices": {"NVIDIA H100": 7, "earlier record": 97},
              "git_commit": "c02399d43fff"}
    assert repr(report.Provenance(folded, "x")) == ("Provenance of the x: cells on NVIDIA H100 (7), earlier record "
                                                    "(97); assembled on cpu, commit c02399d")
    with pytest.raises(TypeError, match="provenance mapping"):
        report.Provenance("cpu", "x")


def test_provenance_shows_no_local_paths_and_says_what_dirty_means():
    prov = {"git_commit": "445e4bb789b5322863d86933745ab714f35216b1-dirty", "cell_store": "/work/x/.cache/uci-cells/07",
            "device": {"kind": "cpu"}, "name": "uci"}
    fields = dict(report.Provenance(prov, "record").fields())
    assert "cell store" not in fields and "/work" not in report.Provenance(prov, "record")._repr_html_()
    assert fields["git commit"] == "445e4bb789b5322863d86933745ab714f35216b1, with changes not yet committed then"
    assert fields["name"] == "uci" and fields["device: kind"] == "cpu"
