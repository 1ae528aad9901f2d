"""What every chapter's verdicts share.

:class:`Verdict` (a verdict's text, evidence and margin), :class:`Text` (glue-able text),
:class:`Provenance`, :func:`verdict_table`, and the pieces of a rule: :func:`distance` (a margin in
Monte-Carlo noise units), :func:`p_to_z`, :func:`all_pass`, :func:`sig` and :func:`pm` (numbers as a table
shows them). Each experiment's own rules live beside it (``experiments/<name>/verdicts.py``; the performance chapter's in
``performance/verdicts.py``). Keeping rules
out of notebooks makes them testable and identical wherever they are shown.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "Text",
    "Verdict",
    "Provenance",
    "verdict_table",
    "distance",
    "holm",
    "p_to_z",
    "all_pass",
    "sig",
    "pm",
]


class Text:
    """Text that displays as itself in every mime type (``glue`` of a plain ``str`` shows its quotes)."""

    def __init__(self, text: str):
        self.text = str(text)

    def __repr__(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text

    def _repr_markdown_(self) -> str:
        return self.text


class Verdict(Text):
    """A verdict: its text, the evidence behind it, and how far it is from going the other way.

    The text names the outcome and nothing measured (a checked notebook output can then not move with the
    last digits of a computation); the numbers go to ``evidence``. ``margin`` is the distance of the deciding
    statistic from the nearest threshold of the rule, in units of that statistic's Monte-Carlo noise (for a
    z-score, 1; for a p-value, its normal quantile): a verdict with a margin of a few units does not change on
    a rerun with other random draws or another machine's rounding. ``None`` where the rule has no noise scale.
    """

    def __init__(self, text: str, evidence: str = "", margin: float | None = None):
        super().__init__(text)
        self.evidence = evidence
        self.margin = None if margin is None else float(margin)


class Provenance:
    """Where, when and with what a committed record was made, shown as one collapsed block.

    In a rendered chapter (HTML) it is a ``<details>`` element whose one-line summary names the record, the
    device and the date, and which unfolds into every field of its ``provenance.json`` (commit, device,
    versions, wall time, ...). As text it is that one line. ``prov`` is the provenance mapping of a record
    (``store.load(...).provenance`` or the second item of ``store.load_record``).
    """

    def __init__(self, prov: Mapping[str, Any], label: str):
        if not isinstance(prov, Mapping):
            raise TypeError(f"Provenance needs the provenance mapping of a record, got {type(prov).__name__}")
        self.prov = dict(prov)
        self.label = str(label)

    def summary(self) -> str:
        """The one line: label, device, date and short commit (what is known of them). A record assembled from
        stored cells (``cell_devices``: device -> cells) names where its cells ran before the machine that
        assembled it."""
        device = self.prov.get("device") or {}
        kind = device.get("kind") if isinstance(device, Mapping) else device
        parts = [str(kind) if kind else "device not recorded"]
        cells = self.prov.get("cell_devices")
        if isinstance(cells, Mapping) and cells:
            ran = ", ".join(f"{name} ({n})" for name, n in cells.items())
            parts = [f"cells on {ran}; assembled on {parts[0]}"]
        when = str(self.prov.get("finished_utc") or self.prov.get("date") or "")[:10]
        if when:
            parts.append(when)
        commit = str(self.prov.get("git_commit") or "")
        if commit:
            parts.append(f"commit {commit[:7]}")
        return f"Provenance of the {self.label}: " + ", ".join(parts)

    def fields(self) -> list[tuple[str, str]]:
        """Every field as (readable label, value), in the record's order; nested mappings give labels such as
        ``versions: jax`` and ``device: kind``; ``wall_time_s`` reads ``wall time (s)``. Local paths (the cell
        store of the machine that assembled a record) are left out, and a commit recorded with ``-dirty`` says
        in words that the working tree had changes."""
        out: list[tuple[str, str]] = []

        def label(name: str) -> str:
            words = name.replace("_", " ")
            for end, unit in ((" s", " (s)"), (" utc", " (UTC)"), (" bytes", " (bytes)")):
                if words.endswith(end):
                    return words[: -len(end)] + unit
            return words

        def walk(prefix: str, value: Any, raw: str) -> None:
            if isinstance(value, Mapping):
                for k, v in value.items():
                    walk(f"{prefix}: {label(str(k))}" if prefix else label(str(k)), v, str(k))
            elif isinstance(value, float):
                out.append((prefix, f"{value:.1f}" if raw.endswith("_s") else f"{value:.6g}"))
            elif isinstance(value, str) and value.startswith(("/", "~")):
                return  # a folder of the machine that made the record: nothing a reader can open
            elif raw == "git_commit" and str(value).endswith("-dirty"):
                out.append((prefix, f"{str(value)[:-len('-dirty')]}, with changes not yet committed then"))
            else:
                out.append((prefix, str(value)))

        walk("", self.prov, "")
        return out

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
            for k, v in self.fields()
        )
        return (f"<details class='bootens-provenance'><summary>{html.escape(self.summary())}</summary>"
                f"<table>{rows}</table></details>")


def holm(pvalues: Sequence[float], level: float = 0.05) -> list[bool]:
    """Holm's step-down rejections at family-wise ``level``: the sorted p-values ``p_(i)`` (i = 1..m) are
    rejected while ``p_(i) <= level / (m - i + 1)``; non-finite p-values are never rejected and not counted in
    m. One per position of ``pvalues``."""
    idx = [i for i, p in enumerate(pvalues) if np.isfinite(p)]
    m = len(idx)
    reject = [False] * len(pvalues)
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        if pvalues[i] > level / (m - rank):
            break
        reject[i] = True
    return reject


def distance(value: float, threshold: float, scale: float | None) -> float | None:
    """|value - threshold| in units of ``scale`` (None without a usable scale)."""
    if scale is None or not np.isfinite(scale) or scale <= 0:
        return None
    return abs(float(value) - float(threshold)) / float(scale)


def p_to_z(p: float) -> float:
    """The normal quantile of a p-value: a rerun moves it by about one unit, whatever p is."""
    from scipy import stats

    return float(stats.norm.isf(min(max(float(p), 1e-300), 1.0 - 1e-16)))


def all_pass(conds: list[tuple[bool, float | None]]) -> tuple[bool, float | None]:
    """Combine conditions that must all hold. Margin: if all hold, the closest one to failing; otherwise
    the failing condition farthest from its threshold (all failing ones would have to flip)."""
    ok = all(c for c, _ in conds)
    relevant = [d for c, d in conds] if ok else [d for c, d in conds if not c]
    if any(d is None for d in relevant):
        return ok, None
    return ok, (min(relevant) if ok else max(relevant))


def _fmt_margin(m: float | None) -> str:
    return "—" if m is None else ("> 99" if m > 99 else f"{m:.1f}")


def verdict_table(verdicts: dict[str, Verdict], labels: dict[str, str] | None = None) -> pd.DataFrame:
    """Verdicts with their evidence and margin (in Monte-Carlo noise units of the deciding statistic)."""
    labels = labels or {}
    rows = {labels.get(k, k): {"verdict": str(v), "evidence": getattr(v, "evidence", ""),
                              "margin (noise units)": _fmt_margin(getattr(v, "margin", None))}
            for k, v in verdicts.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits, positional (0.00123, 3.04, 1230)."""
    if not np.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    rounded = float(f"{float(x):.{digits - 1}e}")
    decimals = max(digits - 1 - int(np.floor(np.log10(abs(rounded)))), 0)
    return f"{rounded:.{decimals}f}"


def pm(mean: float, std: float) -> str:
    """``mean ± std`` to the digits a table shows; ``diverged`` for a non-finite mean."""
    if not np.isfinite(mean):
        return "diverged"
    return f"{mean:.3g} ± {std:.2g}" if abs(mean) >= 100 else f"{mean:.2f} ± {std:.2f}"
