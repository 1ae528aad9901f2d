"""Execute the book's chapters, several at a time, into Jupyter Book's execution cache.

    .venv/bin/python .ci/execute_book.py --jobs 2        # then: jupyter-book build .  (renders, executes nothing)

``make book`` runs this before ``jupyter-book build``. Jupyter Book 1.x executes the notebooks one after the
other. A chapter alone spreads its XLA programs over every core, but gains well under twice from a second
one (measured on a 2-core CPU: 200 particles trained 1.3-1.65x as fast on two cores as on one; compiles use
one), and two chapters side by side on both cores slow each other by about as much as they gain. Here
every chapter of ``_toc.yml`` is executed in a pool of ``--jobs`` processes, each held to a core of its own
(when there are at least as many cores), the longest first (by the cell times recorded in the committed
notebook), each exactly as Jupyter Book's own executor would run it (``jupyter_cache``'s
``single_nb_execution``: ``book/`` as the working directory, the timeout and ``allow_errors`` of
``_config.yml``), and stored in the execution cache that ``_config.yml`` names (``execute.cache``). The
build, in ``execute_notebooks: cache`` mode, finds every chapter there and renders it.

The performance chapter, which times code, runs alone on every core once the others are done: a chapter
beside it would take cores from its measurements.

``make test`` runs the unit tests in what the build leaves idle: ``--core-free FILE`` creates FILE as soon
as a core has no chapter left to execute (at the latest when every chapter but those run alone is done, or
one failed), and the unit tests start then, at the lowest priority (``nice``): beside the last chapters on
the other cores and beside the performance chapter (which keeps about 1.4 of 2 cores busy) they take only
the processor time these leave. ``--running FILE`` exists while those chapters may still be executing; a
test that reads a chapter's run from the book's result cache waits for it while it does.

The cache is emptied first: every chapter is executed every time, as with ``execute_notebooks: force`` (the
cache is keyed by the notebook's code alone, so a kept entry would hide a change of the library). A chapter
that raises stops nothing else; the script prints its traceback and exits with status 1 once all are done.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
# Chapters that measure wall time: executed one at a time, with nothing beside them.
ALONE = ("performance",)


def chapters(root: Path = ROOT) -> list[Path]:
    """The notebooks ``root/_toc.yml`` lists (root and chapters), in its order."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    entries = [toc["root"], *(e["file"] for e in toc.get("chapters", []))]
    return [root / f"{e}.ipynb" for e in entries if (root / f"{e}.ipynb").exists()]


def recorded_seconds(path: Path) -> float:
    """Seconds the committed notebook's cells took when it was last executed (0 when it records none)."""
    total = 0.0
    for cell in json.loads(path.read_text())["cells"]:
        ex = cell.get("metadata", {}).get("execution", {})
        try:
            a = dt.datetime.fromisoformat(ex["iopub.execute_input"].replace("Z", "+00:00"))
            b = dt.datetime.fromisoformat(ex["shell.execute_reply"].replace("Z", "+00:00"))
        except (KeyError, ValueError):
            continue
        total += max(0.0, (b - a).total_seconds())
    return total


def _hold_to_a_core(counter: Any) -> None:
    """Pool initializer: the i-th worker (and the kernels it starts) runs on the i-th usable core."""
    with counter.get_lock():
        i = counter.value
        counter.value += 1
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[i % len(cores)]})


def _signal(path: Path | None) -> None:
    """Create the file ``path`` (and its folder), if one is given."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def _execute(path: str, timeout: int | None, allow_errors: bool) -> tuple[Any, float, str | None]:
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.read(path, as_version=4)
    result = single_nb_execution(nb, cwd=str(Path(path).parent), timeout=timeout, allow_errors=allow_errors,
                                 meta_override=True)
    return result.nb, result.time, (result.exc_string if result.err is not None else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="chapters executed at once (default 2)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the book's folder (default: this repository)")
    ap.add_argument("--core-free", type=Path, metavar="FILE",
                    help="create FILE as soon as a core has no chapter left to execute")
    ap.add_argument("--running", type=Path, metavar="FILE",
                    help="a file that exists while chapters but those run alone may still be executing")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")

    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    config = yaml.safe_load((root / "_config.yml").read_text()).get("execute", {})
    if config.get("execute_notebooks") != "cache":
        raise SystemExit("execute_book: _config.yml must set execute.execute_notebooks: cache (the build would "
                         "execute every chapter again)")
    cache_dir = root / config.get("cache", "_build/.jupyter_cache")
    timeout, allow_errors = config.get("timeout", 30), bool(config.get("allow_errors", False))
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache = get_cache(str(cache_dir))
    books = sorted(chapters(root), key=recorded_seconds, reverse=True)  # the longest first
    for path in books:
        cache.add_nb_to_project(str(path))

    start, failed, done = time.time(), [], 0

    def store(path: Path, fut: Any) -> None:
        nonlocal done
        done += 1
        name = path.relative_to(root)
        try:
            nb, seconds, error = fut.result()
        except Exception as exc:  # the kernel could not start, the notebook could not be read, ...
            nb, seconds, error = None, float("nan"), f"{type(exc).__name__}: {exc}"
        if error is not None:
            failed.append(str(name))
            print(f"execute_book: [{done}/{len(books)}] {name} FAILED after {seconds:.0f} s\n{error}",
                  file=sys.stderr, flush=True)
            return
        cache.cache_notebook_bundle(CacheBundleIn(nb, str(path), data={"execution_seconds": seconds}),
                                    check_validity=False, overwrite=True)
        print(f"execute_book: [{done}/{len(books)}] {name} in {seconds:.0f} s "
              f"({time.time() - start:.0f} s elapsed)", flush=True)

    shared = [p for p in books if p.stem not in ALONE]
    spawn = multiprocessing.get_context("spawn")  # fresh interpreters: no fork of a threaded process
    pin = 1 < args.jobs <= len(os.sched_getaffinity(0))
    print(f"execute_book: {len(books)} chapters, {args.jobs} at a time{', a core each' if pin else ''} "
          f"(then alone: {', '.join(p.stem for p in books if p not in shared) or 'none'})", flush=True)
    init = {"initializer": _hold_to_a_core, "initargs": (spawn.Value("i", 0),)} if pin else {}
    _signal(args.running)
    try:
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=spawn, **init) as pool:
            futures = {pool.submit(_execute, str(p), timeout, allow_errors): p for p in shared}
            left = len(futures)
            for fut in itertools.chain([None], as_completed(futures)):  # lazily: as each finishes
                if fut is not None:
                    store(futures[fut], fut)
                    left -= 1
                if left < args.jobs:  # fewer chapters left than workers: one has nothing to do
                    _signal(args.core_free)
    finally:
        _signal(args.core_free)
        if args.running is not None:
            args.running.unlink(missing_ok=True)
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        for path in (p for p in books if p not in shared):
            store(path, pool.submit(_execute, str(path), timeout, allow_errors))
    if failed:
        print(f"execute_book: {len(failed)} chapter(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"execute_book: all {len(books)} chapters in {time.time() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
