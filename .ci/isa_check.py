"""Execute chapters under another XLA CPU instruction set and compare every output with the committed one.

    .venv/bin/python .ci/isa_check.py --isa AVX --out _build/isa-AVX                 # every chapter
    .venv/bin/python .ci/isa_check.py --isa AVX --out _build/isa-AVX univariate linear
    .venv/bin/python .ci/isa_check.py --compare-only --out _build/isa-AVX            # compare what is there
    .venv/bin/python .ci/isa_check.py --isa AVX --out _build/isa-AVX --keep-results _build/isa-AVX/results linear

XLA compiles for the CPU it runs on (``--xla_cpu_max_isa`` caps the instruction set it may use), so this
shows, on one machine, what a machine with an older CPU computes. Each chapter runs in a fresh result cache
(nothing computed under the default instruction set is reused; ``--keep-results`` keeps it, with the runs the
chapter computed, for a comparison at Monte-Carlo precision), with ``book/`` as its working directory,
and its executed copy is written to ``OUT/<chapter>.ipynb``. The report (``OUT/report.md``, also printed)
lists per chapter: the checked cells (tag ``nbval-check-output``) whose output differs — what nbval would
fail — and, for every other output, how many numbers moved and the largest absolute and relative change.
Exit status 1 if a checked output differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHECK_TAG = "nbval-check-output"
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def chapters() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [Path(e["file"]).name for e in toc["chapters"] if (ROOT / f"{e['file']}.ipynb").exists()]


def execute(chapter: str, isa: str, out: Path, timeout: int, keep: Path | None = None) -> float:
    """Run ``book/<chapter>.ipynb`` under ``--xla_cpu_max_isa=isa`` into ``out/<chapter>.ipynb``; seconds. The
    chapter's fresh result cache is removed afterwards, or kept as ``keep/<chapter>`` when ``keep`` is given."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_cpu_max_isa")]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_cpu_max_isa={isa}"])
    if keep is not None:
        shutil.rmtree(keep / chapter, ignore_errors=True)
        (keep / chapter).mkdir(parents=True)
        env["BOOTENS_CACHE_DIR"] = str(keep / chapter)
    else:
        env["BOOTENS_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"bootens-isa-{isa}-")
    env.pop("MPLBACKEND", None)
    # nbclient writes next to the input; run a temporary copy inside book/ so relative paths hold.
    tmp = ROOT / "book" / f".isa-{chapter}.ipynb"
    shutil.copy(ROOT / "book" / f"{chapter}.ipynb", tmp)
    start = time.time()
    try:
        subprocess.run([sys.executable, "-m", "jupyter", "execute", f"--timeout={timeout}", "--inplace", str(tmp)],
                       env=env, check=True, cwd=ROOT / "book", capture_output=True, text=True)
        shutil.move(tmp, out / f"{chapter}.ipynb")
    except subprocess.CalledProcessError as exc:
        sys.stderr.write(exc.stderr[-4000:])
        raise SystemExit(f"isa_check: {chapter} failed under {isa}")
    finally:
        tmp.unlink(missing_ok=True)
        if keep is None:
            shutil.rmtree(env["BOOTENS_CACHE_DIR"], ignore_errors=True)
    return time.time() - start


def _outputs(cell: dict) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream" and o.get("name") == "stdout":
            parts.append("".join(o["text"]))
        elif "data" in o:
            plain = "".join(o["data"].get("text/plain", ""))
            if plain and not plain.startswith("<"):
                parts.append(plain)
            elif "text/html" in o["data"]:  # e.g. a pandas Styler: its numbers are in the HTML table
                html = "".join(o["data"]["text/html"])
                html = re.sub(r"<style.*?</style>", " ", html, flags=re.S)
                parts.append(re.sub(r"<[^>]+>", " ", html))
    return "".join(parts)


def _is_checked(cell: dict) -> bool:
    return CHECK_TAG in cell.get("metadata", {}).get("tags", []) or "NBVAL_CHECK_OUTPUT" in "".join(cell["source"])


def compare(stored: Path, executed: Path) -> dict:
    """Checked cells that differ, and the numbers that moved in the other outputs."""
    a = [c for c in json.loads(stored.read_text())["cells"] if c["cell_type"] == "code"]
    b = [c for c in json.loads(executed.read_text())["cells"] if c["cell_type"] == "code"]
    if len(a) != len(b):
        return {"error": f"{len(a)} code cells committed, {len(b)} executed"}
    checked, moved = [], []
    for i, (ca, cb) in enumerate(zip(a, b)):
        ta, tb = _outputs(ca), _outputs(cb)
        if _is_checked(ca):
            if ta != tb:
                checked.append({"cell": i, "committed": ta, "executed": tb})
            continue
        na, nb = NUMBER.findall(ta), NUMBER.findall(tb)
        if len(na) != len(nb):
            if ta != tb:
                moved.append({"cell": i, "numbers": None, "text_changed": True})
            continue
        diffs = [(float(x), float(y)) for x, y in zip(na, nb) if x != y]
        if diffs:
            abs_d = max(abs(x - y) for x, y in diffs)
            rel_d = max(abs(x - y) / max(abs(x), abs(y)) for x, y in diffs)
            worst = max(diffs, key=lambda d: abs(d[0] - d[1]) / max(abs(d[0]), abs(d[1])))
            moved.append({"cell": i, "numbers": len(diffs), "of": len(na), "max_abs": abs_d, "max_rel": rel_d,
                          "worst": worst})
    return {"checked_differ": checked, "moved": moved, "code_cells": len(a)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("chapters", nargs="*", help="chapters (default: every executable chapter of _toc.yml)")
    p.add_argument("--isa", default="AVX", help="XLA CPU instruction set cap: SSE4_2, AVX, AVX2, AVX512, ...")
    p.add_argument("--out", required=True, help="folder for the executed notebooks and report.md")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    p.add_argument("--compare-only", action="store_true", help="execute nothing; compare what OUT holds")
    p.add_argument("--keep-results", metavar="DIR", help="keep each chapter's result cache as DIR/<chapter> "
                   "(its runs under the other instruction set; removed by default)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.chapters or chapters()
    lines = [f"# Chapters under `--xla_cpu_max_isa={args.isa}` against the committed outputs", ""]
    failed = False
    for name in names:
        seconds = None
        if not args.compare_only:
            seconds = execute(name, args.isa, out, args.timeout,
                              Path(args.keep_results) if args.keep_results else None)
            print(f"isa_check: {name} executed in {seconds:.0f} s", file=sys.stderr)
        if not (out / f"{name}.ipynb").exists():
            lines.append(f"## {name}: not executed")
            continue
        r = compare(ROOT / "book" / f"{name}.ipynb", out / f"{name}.ipynb")
        head = f"## {name}" + (f" ({seconds:.0f} s)" if seconds is not None else "")
        lines.append(head)
        if "error" in r:
            lines.append(f"- cannot compare: {r['error']}")
            failed = True
            continue
        if r["checked_differ"]:
            failed = True
            for c in r["checked_differ"]:
                lines.append(f"- **checked cell {c['cell']} differs** (nbval fails):")
                lines.append(f"  - committed: `{c['committed'].strip()}`")
                lines.append(f"  - executed:  `{c['executed'].strip()}`")
        else:
            lines.append("- checked cells: identical")
        if not r["moved"]:
            lines.append(f"- unchecked outputs: no number moved ({r['code_cells']} code cells)")
        for m in r["moved"]:
            if m["numbers"] is None:
                lines.append(f"- cell {m['cell']}: text changed (not number for number)")
            else:
                x, y = m["worst"]
                lines.append(f"- cell {m['cell']}: {m['numbers']} of {m['of']} numbers moved, largest change "
                             f"{m['max_abs']:.3g} (relative {m['max_rel']:.2g}; e.g. {x:g} -> {y:g})")
        lines.append("")
    text = "\n".join(lines)
    (out / "report.md").write_text(text + "\n")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
