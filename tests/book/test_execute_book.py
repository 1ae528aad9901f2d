"""``.ci/execute_book.py``: the chapters executed several at a time into Jupyter Book's execution cache, where
the build (``execute_notebooks: cache``) finds them.

A tiny book of two notebooks in a temporary folder: one that runs and one that raises. The one that runs
must be in the cache afterwards, matched by the notebook the build reads, with its output; the one that
raises must fail the script and be absent; an entry left by an earlier build must be gone.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


# The script's worker processes (spawned) import it by name: .ci on the path, which they inherit.
sys.path.insert(0, str(ROOT / ".ci"))
eb = importlib.import_module("execute_book")


def _nb(sources, times=None):
    cells = []
    for i, src in enumerate(sources):
        meta = {}
        if times is not None:
            meta = {"execution": {"iopub.execute_input": f"2026-01-01T00:00:{10 * i:02d}.000000Z",
                                  "shell.execute_reply": f"2026-01-01T00:00:{10 * i + times[i]:06.3f}Z"}}
        cells.append({"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": meta,
                      "outputs": [], "source": src})
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                        "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def test_the_book_renders_from_the_cache_the_script_fills():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]
    assert config["execute_notebooks"] == "cache"
    assert config["cache"] == "_build/.jupyter_cache"
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    listed = {Path(e["file"]).name for e in toc["chapters"]} | {Path(toc["root"]).name}
    found = {p.stem for p in eb.chapters()}
    assert found == {n for n in listed if (ROOT / "book" / f"{n}.ipynb").exists()}
    assert found >= {"univariate", "linear", "uci", "performance"}
    assert set(eb.ALONE) <= found


def test_recorded_seconds_sum_the_cell_times(tmp_path):
    p = tmp_path / "a.ipynb"
    p.write_text(json.dumps(_nb(["1", "2"], times=[1.5, 2.25])))
    assert eb.recorded_seconds(p) == pytest.approx(3.75)
    p.write_text(json.dumps(_nb(["1"])))
    assert eb.recorded_seconds(p) == 0.0


def _book(tmp_path, mode="cache"):
    (tmp_path / "book").mkdir()
    (tmp_path / "_toc.yml").write_text(yaml.safe_dump(
        {"format": "jb-book", "root": "book/intro", "chapters": [{"file": "book/good"}, {"file": "book/bad"}]}))
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(
        {"execute": {"execute_notebooks": mode, "cache": "_build/.jupyter_cache", "timeout": 60}}))
    (tmp_path / "book" / "intro.md").write_text("# intro\n")
    good = "import os\nprint(os.path.basename(os.getcwd()), len(os.sched_getaffinity(0)))"
    (tmp_path / "book" / "good.ipynb").write_text(json.dumps(_nb([good])))
    (tmp_path / "book" / "bad.ipynb").write_text(json.dumps(_nb(["raise RuntimeError('boom')"])))


def test_chapters_run_in_the_cache_and_a_raising_one_fails(tmp_path, capsys):
    pytest.importorskip("jupyter_cache")
    import nbformat
    from jupyter_cache import get_cache

    _book(tmp_path)
    from jupyter_cache.base import CacheBundleIn

    # an earlier build's entry for the notebook that now raises: it must not survive
    bad_path = str(tmp_path / "book" / "bad.ipynb")
    stale = get_cache(str(tmp_path / "_build" / ".jupyter_cache"))
    stale.add_nb_to_project(bad_path)
    stale.cache_notebook_bundle(CacheBundleIn(nbformat.read(bad_path, as_version=4), bad_path),
                                check_validity=False, overwrite=True)
    assert stale.match_cache_notebook(nbformat.read(bad_path, as_version=4)) is not None
    free, running = tmp_path / "_build" / ".core-free", tmp_path / "_build" / ".running"
    argv = ["--jobs", "2", "--root", str(tmp_path), "--core-free", str(free), "--running", str(running)]
    assert eb.main(argv) == 1
    assert free.exists() and not running.exists()  # also when a chapter failed (make test's unit tests wait)
    err = capsys.readouterr().err
    assert "book/bad.ipynb FAILED" in err and "boom" in err and "1 chapter(s) failed: book/bad.ipynb" in err

    cache = get_cache(str(tmp_path / "_build" / ".jupyter_cache"))
    good = nbformat.read(str(tmp_path / "book" / "good.ipynb"), as_version=4)
    _, merged = cache.merge_match_into_notebook(good)
    # executed with the notebook's folder as the working directory, as Jupyter Book does, and (two at a time
    # on a machine of two cores or more) held to one core
    folder, cores = merged.cells[0].outputs[0]["text"].split()
    assert folder == "book" and cores == "1"
    with pytest.raises(KeyError):
        cache.match_cache_notebook(nbformat.read(bad_path, as_version=4))


def test_a_build_that_would_execute_again_is_refused(tmp_path):
    _book(tmp_path, mode="force")
    with pytest.raises(SystemExit, match="execute_notebooks: cache"):
        eb.main(["--root", str(tmp_path)])
    with pytest.raises(SystemExit):
        eb.main(["--jobs", "0", "--root", str(tmp_path)])


def test_a_core_is_reported_free_when_no_chapter_is_left_to_start(tmp_path):
    """Two workers, three chapters: ``--core-free`` appears once the third has started and one of the others
    has ended (not before), while ``--running`` still exists; the chapter run alone (the performance chapter)
    sees ``--core-free`` and no ``--running``."""
    pytest.importorskip("jupyter_cache")
    import nbformat
    from jupyter_cache import get_cache

    free, running = tmp_path / "core-free", tmp_path / "running"
    names = ("long", "short", "last", "performance")
    (tmp_path / "book").mkdir()
    (tmp_path / "_toc.yml").write_text(yaml.safe_dump(
        {"format": "jb-book", "root": "book/intro", "chapters": [{"file": f"book/{n}"} for n in names]}))
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(
        {"execute": {"execute_notebooks": "cache", "cache": "_build/.jupyter_cache", "timeout": 60}}))
    (tmp_path / "book" / "intro.md").write_text("# intro\n")
    # Longest first by recorded seconds: "long" and "short" start, "last" when "short" ends; "long" waits
    # until "last" has ended (a file "last" writes), then for the core "last" left to be reported free.
    ended = str(tmp_path / "last-ended")
    probe = f"print(os.path.exists({str(free)!r}), os.path.exists({str(running)!r}))"
    wait = (f"t = time.time()\nwhile not os.path.exists({ended!r}) and time.time() < t + 60:\n"
            "    time.sleep(0.1)\n"
            f"while not os.path.exists({str(free)!r}) and time.time() < t + 120:\n    time.sleep(0.1)\n")
    code = {"long": wait + probe, "short": probe, "performance": probe,
            "last": f"{probe}\nopen({ended!r}, 'w').close()"}
    recorded = {"long": 9, "short": 5, "last": 1, "performance": 0}
    for name in names:  # (the cache matches notebooks by their code: the comment tells them apart)
        src = f"# {name}\nimport os, time\n{code[name]}"
        (tmp_path / "book" / f"{name}.ipynb").write_text(json.dumps(_nb([src], times=[recorded[name]])))
    argv = ["--jobs", "2", "--root", str(tmp_path), "--core-free", str(free), "--running", str(running)]
    assert eb.main(argv) == 0
    cache = get_cache(str(tmp_path / "_build" / ".jupyter_cache"))
    seen = {}
    for name in names:
        nb = nbformat.read(str(tmp_path / "book" / f"{name}.ipynb"), as_version=4)
        _, merged = cache.merge_match_into_notebook(nb)
        seen[name] = merged.cells[0].outputs[0]["text"].split()
    # "short" and "last" print while two chapters are left; "long" prints after "last" left its core
    assert seen == {"short": ["False", "True"], "last": ["False", "True"], "long": ["True", "True"],
                    "performance": ["True", "False"]}
