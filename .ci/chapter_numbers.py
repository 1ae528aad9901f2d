"""The numbers and verdicts the chapters show, from their executed notebooks, and what changed between two sets.

    python .ci/chapter_numbers.py dump book/*.ipynb > after.json             # the working tree's chapters
    python .ci/chapter_numbers.py dump --rev main book/*.ipynb > before.json  # the chapters of a git revision
    python .ci/chapter_numbers.py compare before.json after.json               # a Markdown table of what moved

A chapter's numbers are its glued values (``glue(name, value)``: the headline numbers and verdicts its prose
cites) and the text of its checked outputs (cells tagged ``nbval-check-output``: verdicts and numbers at their
Monte-Carlo precision). ``compare`` lists every one that differs, chapter by chapter, and those only in one set.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

PREFIX = "application/papermill.record/"


def _text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    return "".join(data.get("text/plain", "") or data.get(PREFIX + "text/plain", ""))


def numbers(notebook: dict) -> dict[str, str]:
    """``{"glue NAME": text, "checked cell N (first line)": text}`` of one executed notebook."""
    out: dict[str, str] = {}
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    for i, cell in enumerate(code):
        for o in cell.get("outputs", []):
            name = o.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                out[f"glue {name}"] = _text(o).strip()
        if "nbval-check-output" in cell.get("metadata", {}).get("tags", []):
            first = "".join(cell["source"]).strip().splitlines()[0][:60] if cell["source"] else ""
            out[f"checked cell {i} ({first})"] = "\n".join(
                t for t in (_text(o).strip() for o in cell.get("outputs", []) if "scrapbook" not in
                            o.get("metadata", {})) if t)
    return out


def _read(path: str, rev: str | None) -> dict:
    if rev is None:
        return json.loads(Path(path).read_text())
    return json.loads(subprocess.check_output(["git", "show", f"{rev}:{path}"]))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="the numbers of executed notebooks, as JSON on stdout")
    d.add_argument("notebooks", nargs="+")
    d.add_argument("--rev", default=None, help="read the notebooks of this git revision")
    c = sub.add_parser("compare", help="a Markdown table of the numbers that differ")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        doc = {Path(p).stem: numbers(_read(p, args.rev)) for p in args.notebooks}
        json.dump(doc, sys.stdout, indent=1, ensure_ascii=False)
        print()
        return 0
    before, after = (json.loads(Path(p).read_text()) for p in (args.before, args.after))
    print("| chapter | what | before | after |\n|---|---|---|---|")
    same = 0
    for chapter in sorted(set(before) | set(after)):
        b, a = before.get(chapter, {}), after.get(chapter, {})
        for key in sorted(set(b) | set(a)):
            if b.get(key) == a.get(key):
                same += 1
                continue
            print(f"| {chapter} | {_cell(key)} | {_cell(b.get(key, '(absent)'))} | {_cell(a.get(key, '(absent)'))} |")
    print(f"\n{same} numbers unchanged.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
