"""The performance chapter's rules and tables: what the benchmark documents say (:func:`evaluate`), the benchmark as a
table (:func:`table`), the profile's calls (:func:`profile_table`) and the committed CI timings
(:func:`ci_timings_table`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..report import Text

__all__ = ["evaluate", "table", "particle_batch_table", "groups_table", "linesearch_table", "uci_dataset_table",
           "profile_table", "ci_timings_table"]


def table(doc: dict[str, Any]) -> pd.DataFrame:
    """``bench.json`` as a table: one row per model x dataset shape x k; rates are medians over the timed
    repeats with [min, max]."""
    out = []
    for r in doc["rows"]:
        s = r["particle_steps_per_s_spread"]
        torch_x = r.get("speedup_vs_torch_loop")
        out.append({
            "model": r["model"], "dataset (n)": f"{r['dataset']} ({r['n']})", "k": r["k"],
            "particle-steps/s [min, max]": f"{r['particle_steps_per_s']:.3g} [{s['min']:.3g}, {s['max']:.3g}]",
            "GFLOP/s": round(r["flops_per_s"] / 1e9, 2),
            "x JAX loop": round(r["speedup_vs_jax_loop"], 2),
            "x PyTorch loop": "—" if torch_x is None else round(torch_x, 2),
            "group": "all" if r.get("particle_batch") is None else r["particle_batch"],
            "roofline (bound)": f"{r['roofline_fraction']:.0%} ({r['roofline_bound']}"
                                + (f", {r['roofline_level']})" if r.get("roofline_level") else ")"),
        })
    return pd.DataFrame(out).set_index(["model", "dataset (n)", "k"])


def particle_batch_table(doc: dict[str, Any]) -> pd.DataFrame:
    """``particle-batch.json`` (``bootens bench --case particle-batch``) as a table: per network, optimizer and
    particle batch ("all" = one vmap over every particle) the median seconds of the timed calls with their
    interquartile range, the speed-up against all at once measured in the same run, and the largest difference
    of the final particles from all at once."""
    out = []
    for r in doc["rows"]:
        s = r["seconds"]
        out.append({
            # records made before rows named their network hold only hidden_layers
            "network": r.get("network")
            or f"{r['hidden_layers']} hidden layer{'s' if r['hidden_layers'] != 1 else ''}",
            "optimizer": {"adam": "Adam", "lbfgs-zoom": "L-BFGS, zoom line search"}.get(r["optimizer"],
                                                                                      r["optimizer"]),
            "particle batch": "all" if r["particle_batch"] is None else str(r["particle_batch"]),
            "seconds [IQR]": f"{s['median']:.3g} [{s['q25']:.3g}, {s['q75']:.3g}]",
            "× all at once": round(r["speedup"], 2),
            "max |Δ particles|": f"{r['max_abs_diff']:.1e}",
        })
    return pd.DataFrame(out).set_index(["network", "optimizer", "particle batch"])



def groups_table(doc: dict[str, Any]) -> pd.DataFrame:
    """``groups.json`` (``bootens bench --case groups``) as a table: per computation and way (the library's
    particle groups, or every particle in one vmap) and repeat, the wall, compile and compute seconds and the
    test scores, with the ratio of the median compute seconds (all at once over grouped: above 1 when the
    groups are faster) on each way's rows."""
    ratio = {s["what"]: s["speedup"] for s in doc["summary"]}
    out = []
    for r in doc["rows"]:
        out.append({
            "computation": r["what"], "particles": r["way"], "repeat": r["repeat"],
            "wall s": round(r["wall_s"], 1), "compile s": round(r["compile_s"], 1),
            "compute s": round(r["compute_s"], 1),
            "groups used": ", ".join(f"{k} at once" if g is None else f"{k} in groups of {g}"
                                     for k, g in r.get("groups", [])) or "—",
            "test RMSE": f"{r['rmse']:.4g}", "test MNLL": f"{r['mnll']:.4g}",
            "all at once ÷ grouped (compute)": round(ratio[r["what"]], 2),
        })
    return pd.DataFrame(out).set_index(["computation", "particles", "repeat"])


def linesearch_table(doc: dict[str, Any]) -> pd.DataFrame:
    """``linesearch.json`` (``bootens bench --case linesearch``) as a table: per network and number of
    particles, each line search's milliseconds per L-BFGS iteration with the interquartile range of the timed
    calls, its speed-up over optax's search under ``vmap`` measured in the same run, the mean line-search
    steps per particle and iteration, and the largest difference of the final particles from optax's."""
    names = {"optax": "optax's, under vmap", "batched": "batched per branch"}
    out = []
    for r in doc["rows"]:
        s, per = r["seconds"], 1e3 / r["steps"]
        layers = r["hidden_layers"]
        out.append({
            "network": f"{layers} hidden layer{'s' if layers != 1 else ''}, {r['dataset']} shape ({r['n']} rows)",
            "k": r["k"],
            "line search": names.get(r["linesearch"], r["linesearch"]),
            "ms per iteration [IQR]": f"{r['ms_per_iteration']:.3g} [{s['q25'] * per:.3g}, {s['q75'] * per:.3g}]",
            "× optax's": round(r["speedup"], 2),
            "search steps": round(r["search_steps"], 3),
            "max |Δ particles|": f"{r['max_abs_diff']:.1e}",
        })
    return pd.DataFrame(out).set_index(["network", "k", "line search"])


def uci_dataset_table(doc: dict[str, Any]) -> pd.DataFrame:
    """``uci-dataset.json`` (``bootens bench --case uci-dataset``) as a table: per dataset, depth and L-BFGS
    direction, one L-BFGS iteration of a whole dataset's problems (splits x sigma^2 x particles) — its median
    milliseconds with the range of the timed repeats, XLA's FLOPs and bytes for it, the fractions of the
    device's FLOP and bandwidth peaks they reach, which roof bounds it (the lower of the two at its arithmetic
    intensity) and its fraction of that roof, and the share of the iteration spent evaluating the model."""
    out = []
    for r in doc["rows"]:
        s, ms = r["seconds_spread"], 1e3
        layers = r["hidden_layers"]
        out.append({
            "network": (f"{layers} hidden layer{'s' if layers != 1 else ''}, "
                        f"{r['dataset']} ({r['n_rows']} rows)"),
            "direction": r["direction"],
            "problems": r["particles"],
            "ms per iteration [min, max]": f"{r['seconds_per_iteration'] * ms:.3g} [{s['min'] * ms:.3g}, "
                                           f"{s['max'] * ms:.3g}]",
            "GFLOP / GB": f"{r['flops_per_iteration'] / 1e9:.3g} / {r['bytes_per_iteration'] / 1e9:.3g}",
            "of FLOP / bandwidth peak": f"{r['flop_fraction']:.1%} / {r['bandwidth_fraction']:.1%}",
            "roof": f"{r['roof_level']}: {r['roofline_fraction']:.0%}",
            "model share": f"{r['split']['model_eval_s'] / r['seconds_per_iteration']:.0%}",
        })
    return pd.DataFrame(out).set_index(["network", "direction"])


def _device_name(doc: dict[str, Any]) -> str:
    dev = doc["device"]
    if dev.get("platform") == "cpu":
        return f"{dev.get('cpu_model') or 'CPU'}, {dev.get('cpu_count')} cores"
    return str(dev.get("kind") or dev.get("platform"))


def evaluate(docs: dict[str, dict[str, Any]]) -> dict[str, Text]:
    """What the measured documents (by label) say at the largest ``k`` of each, with the device of every
    ratio named: ``loop`` (the ensemble against the JAX and PyTorch loops of single-particle trainings, both
    measured on the same device in the same run), ``scaling`` (particle-steps/s at the largest ``k`` against
    the best ``k`` of each network and shape) and ``roofline`` (the largest fraction of the roof in each
    document). Facts only: no threshold is applied."""
    loop, scaling, roof = [], [], []
    for lab, d in docs.items():
        rows = d["rows"]
        if not rows:
            continue
        kmax = max(r["k"] for r in rows)
        top = [r for r in rows if r["k"] == kmax]
        x = [r["speedup_vs_jax_loop"] for r in top]
        t = [r["speedup_vs_torch_loop"] for r in top if r.get("speedup_vs_torch_loop") is not None]
        torch = (f", {min(t):.3g}x to {max(t):.3g}x the PyTorch loop" if t else ", no PyTorch loop measured")
        loop.append(f"{lab} ({_device_name(d)}), k = {kmax}: {min(x):.2g}x to {max(x):.2g}x the JAX loop{torch}")
        drops = []
        for r in top:
            same = [q for q in rows if q["model"] == r["model"] and q["dataset"] == r["dataset"]]
            best = max(same, key=lambda q: q["particle_steps_per_s"])
            drops.append(r["particle_steps_per_s"] / best["particle_steps_per_s"])
        scaling.append(f"{lab}: at k = {kmax}, {min(drops):.2g} to {max(drops):.2g} of the best k's particle-steps/s")
        roof.append(f"{lab}: at most {max(r['roofline_fraction'] for r in rows):.0%} of the roof")
    none = "no benchmark document"
    return {"loop": Text("; ".join(loop) or none), "scaling": Text("; ".join(scaling) or none),
            "roofline": Text("; ".join(roof) or none)}


def profile_table(doc: dict[str, Any]) -> pd.DataFrame:
    """The calls of a profile (:func:`.profiling.measure`): wall, compile and compute seconds and
    the number of XLA compilations, per stage and call."""
    rows = [{"stage": c["stage"], "call": c["call"], "on": c["detail"], "wall s": round(c["wall_s"], 2),
             "compile s": round(c["compile_s"], 2), "compute s": round(c["compute_s"], 2),
             "XLA compiles": c["compiles"]} for c in doc["calls"]]
    return pd.DataFrame(rows).set_index(["stage", "call"])


def ci_timings_table(records: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Committed CI timing records (``results/ci/<label>.json``: ``stages`` in seconds, ``total_s``,
    ``machine``, ``commit``, ``date``), one row per record (its label names the machine and the commit), in
    order of date; an empty table when there are none. A stage a record lacks is left empty. Seconds only:
    the table must fit the page as records accumulate."""
    if not records:
        return pd.DataFrame()
    rows = {}
    for label, rec in records.items():
        row = {f"{name.removeprefix('test-')} (s)": round(float(sec)) for name, sec in rec["stages"].items()}
        row["total (s)"] = round(float(rec["total_s"]))
        rows[label] = row
    order = sorted(records, key=lambda label: str(records[label].get("date", "")))
    return pd.DataFrame.from_dict(rows, orient="index").loc[order].astype("Int64")
