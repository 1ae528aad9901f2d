"""The performance chapter's rules and tables: the benchmark's targets (:func:`evaluate`), the benchmark as a
table (:func:`table`), the profile's calls (:func:`profile_table`) and the committed CI timings
(:func:`ci_timings_table`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..report import Text

__all__ = ["evaluate", "table", "particle_batch_table", "linesearch_table", "profile_table", "ci_timings_table"]


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
            "roofline (bound)": f"{r['roofline_fraction']:.0%} ({r['roofline_bound']})",
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

def evaluate(docs: dict[str, dict[str, Any]]) -> dict[str, Text]:
    """The issue's targets against the measured documents (by label).

    ``cpu``: at k = 200 on a CPU, at least 30x the particle-steps/s of the loop of single-particle trainings.
    ``gpu``: on a GPU, the 4-layer network of Protein's shape at >= 50% of its roofline (largest k measured).
    A target without a document of its device, or without the row it needs (a benchmark cut off before the
    row: ``complete`` false), says "not measured".
    """
    cpu = [(lab, r) for lab, d in docs.items() if d["device"].get("platform") == "cpu"
           for r in d["rows"] if r["k"] == 200]
    gpu = [(lab, r) for lab, d in docs.items() if d["device"].get("platform") == "gpu"
           for r in d["rows"] if r["model"].startswith("mlp-4x") and r["dataset"] == "protein"]
    out = {}
    if cpu:
        x = np.array([r["speedup_vs_jax_loop"] for _, r in cpu])
        met = int((x >= 30).sum())
        out["cpu"] = Text(
            f"{'met' if met == len(x) else 'not met'}: at k = 200 on CPU the ensemble runs at "
            f"{x.min():.2g}x to {x.max():.2g}x (median {np.median(x):.2g}x) the loop of single-particle "
            f"trainings, target 30x ({met} of {len(x)} rows reach it)"
        )
    else:
        out["cpu"] = Text("not measured: no CPU benchmark with k = 200")
    if gpu:
        best = {}
        for lab, r in gpu:
            if lab not in best or r["k"] > best[lab]["k"]:
                best[lab] = r
        parts = [f"{lab}: {r['roofline_fraction']:.0%} of its roofline at k = {r['k']}" for lab, r in best.items()]
        ok = all(r["roofline_fraction"] >= 0.5 for r in best.values())
        out["gpu"] = Text(f"{'met' if ok else 'not met'} (target 50%): " + "; ".join(parts))
    else:
        held = [lab for lab, d in docs.items() if d["device"].get("platform") == "gpu"]
        if held:
            cut = [lab for lab in held if docs[lab].get("complete") is False]
            out["gpu"] = Text(
                "not measured: no 4-layer Protein row in the GPU benchmark record"
                + ("s " if len(held) > 1 else " ") + ", ".join(held)
                + (f" ({', '.join(cut)}: cut off before it)" if cut else "")
            )
        else:
            out["gpu"] = Text("not measured: no GPU benchmark record (results/paper/bench/) yet")
    return out


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
