"""The ``bootens`` command: list experiments and run them into a results folder.

    bootens list
    bootens run univariate --profile quick               # -> bootens-out/univariate/
    bootens run linear --profile paper --out runs/ --force
    bootens run uci --profile paper --datasets boston yacht --methods ensemble-1 gp --workers 2
    bootens run uci --profile paper --stored-only     # summarise the cells finished so far
    bootens run uci --profile paper --time-budget 480 --shard 0/2 --pack cells-0.tar.gz   # a short GPU window
    bootens fold-cells cells-0.tar.gz cells-1.tar.gz --profile paper --into results/paper/uci
    bootens bench --quick                             # particle throughput -> bootens-out/bench/bench.json
    bootens bench --case uci-cell --profile paper --datasets yacht protein   # real ensemble cells, timed
    bootens bench --case uci-dataset --datasets boston --models 1 4   # one L-BFGS iteration, split, vs roofline
    bootens deep-relu-reference --profile paper --out results/paper/deep-relu --time-budget 3600   # resumable

``run`` writes ``OUT/<experiment>/{summary.json, arrays.npz, config.json, provenance.json}`` and prints the
summary. Results are cached (see :mod:`bootens_core.repro.store`); ``--force`` recomputes. Without ``--out``, results go
to ``bootens-out/`` in the current folder, never beside the committed record under ``results/``.

``run uci`` with ``--time-budget SECONDS``, ``--shard I/N`` or ``--pack FILE`` runs only the pending cells, in
priority order (ensembles, 4 layers and the large datasets first; then MC dropout and SGHMC; GP last), starting
a cell only when its estimated seconds fit in the budget left (counted from the command's start), and prints
one line per dataset and method of what remains with its estimated seconds (rules:
:func:`bootens_core.repro.experiments.uci.run_pending`). ``--pack`` writes the cells computed (``--pack-all``: every
stored cell of the configuration) into one ``.tar.gz``; ``fold-cells`` merges such packs into the local cell
store, refusing cells made with other settings or code (``--force`` takes them), and rewrites the record folder
``--into`` as ``--stored-only`` does.

``deep-relu-reference`` runs the deep-ReLU chapter's NUTS reference in ``OUT/nuts-reference/`` chunk by
chunk (``--chunk-draws`` transitions per chain), saving after each, until the predictive converges
(``--target-rhat``, ``--target-ess``), ``--draws`` or ``--time-budget``; run again, the same command resumes
from the last saved chunk (:mod:`bootens_core.repro.experiments.deep_relu.reference`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..extras import install_hint

__all__ = ["main", "DEFAULT_OUT", "MATMUL_PRECISION"]

# Where `run` and `bench` write without --out: apart from results/, which holds the committed record.
DEFAULT_OUT = "bootens-out"
# JAX's float32 matmul precision under the command (main): true float32 products on every device.
MATMUL_PRECISION = "highest"
# The clock of --time-budget (counted from the start of main()).
_clock = time.monotonic


def _writable_dir(path: str, flag: str = "--out") -> str | None:
    """Create ``path`` (and parents) and check that a file can be written there; return a one-line reason
    if not. Called before any computation, so a long run never ends in a traceback about its output."""
    import os
    import tempfile
    from pathlib import Path

    target = Path(path)
    try:
        if target.exists() and not target.is_dir():
            return f"{flag} {path}: exists and is not a folder"
        target.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".bootens-write-test-", dir=target)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{flag} {path}: cannot write there ({exc.strerror or exc})"
    return None


def _cmd_list(args: argparse.Namespace) -> int:
    from . import experiments

    width = max(len(n) for n in experiments.REGISTRY)
    for name, mod in sorted(experiments.REGISTRY.items()):
        print(f"{name:<{width}}  {', '.join(mod.ARTEFACTS):<32}  {mod.DESCRIPTION}")
    return 0


def _configure(mod, args: argparse.Namespace):
    """The experiment's config for ``--profile``, ``--seed``/``--datasets``/``--methods``/``--workers`` and
    ``--set``; an ``int`` exit status (after one line on stderr) when they are not valid."""
    import dataclasses

    from . import config, overrides

    cfg = config.for_profile(mod.Config, args.profile)
    given = {"seed": args.seed, "datasets": args.datasets, "methods": args.methods, "workers": args.workers}
    fields = {f.name for f in dataclasses.fields(cfg)}
    for name, value in given.items():
        if value is None:
            continue
        if name not in fields:
            print(f"bootens: {mod.NAME} does not take --{name}", file=sys.stderr)
            return 2
        if name == "methods" and hasattr(mod, "expand_methods"):
            try:
                value = mod.expand_methods(value)
            except ValueError as exc:
                print(f"bootens: {exc}", file=sys.stderr)
                return 2
        cfg = dataclasses.replace(cfg, **{name: tuple(value) if isinstance(value, list) else value})
    try:
        cfg = overrides.apply_sets(cfg, args.set or [])
    except ValueError as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    return cfg


def _stored_result(mod, root, cfg, kept=()):
    """The result of the cells finished in the cell store ``root`` (what ``--stored-only`` writes): the summary
    lists the missing ones and the wall time is the cells' own; ``cell_devices`` counts the cells per device.
    ``kept``: an earlier record's rows standing for cells not in the store (their ``device`` column says where
    they ran)."""
    from . import store

    result = mod.from_cells(root, cfg, store.provenance(), kept)
    result.provenance["wall_time_s"] = result.summary["wall_s_cells_total"]
    result.provenance["assembled_from_stored_cells"] = True
    result.provenance["cell_devices"] = mod.cell_devices(mod.result_cells(result))
    return result


def _scheduled_options(args: argparse.Namespace) -> bool:
    return any(v not in (None, False, []) for v in (args.time_budget, args.shard, args.pack, args.pack_all,
                                                     args.cell_times, args.default_cell_s,
                                                     args.skip_recorded, args.at_once))


def _run_pending(mod, cfg, key, args: argparse.Namespace) -> int:
    """``run uci`` with --time-budget / --shard / --pack: the pending cells within the budget, what remains."""
    import math
    from pathlib import Path

    from . import cellpack, config, store

    if not hasattr(mod, "run_pending"):
        print(f"bootens: --time-budget, --shard and --pack are for experiments stored cell by cell (uci), not "
              f"{mod.NAME}", file=sys.stderr)
        return 2
    if args.stored_only:
        print("bootens: --stored-only computes nothing: it takes no --time-budget, --shard or --pack",
              file=sys.stderr)
        return 2
    budget = args.time_budget
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        print(f"bootens: --time-budget takes a positive number of seconds, got {budget:g}", file=sys.stderr)
        return 2
    default_s = 600.0 if args.default_cell_s is None else args.default_cell_s
    if not (math.isfinite(default_s) and default_s > 0):
        print(f"bootens: --default-cell-s takes a positive number of seconds, got {default_s:g}",
              file=sys.stderr)
        return 2
    try:
        part = cellpack.parse_shard(args.shard) if args.shard is not None else (0, 1)
    except ValueError as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    if args.pack_all and not args.pack:
        print("bootens: --pack-all says what --pack FILE holds: give --pack too", file=sys.stderr)
        return 2
    if args.pack:
        if not args.pack.endswith((".tar.gz", ".tgz")):
            print(f"bootens: --pack {args.pack}: a cell pack is a .tar.gz (or .tgz) file", file=sys.stderr)
            return 2
        problem = _writable_dir(str(Path(args.pack).parent), "--pack")
        if problem:
            print(f"bootens: {problem}", file=sys.stderr)
            return 2
    try:
        refs = mod.reference_times(args.cell_times or [])
        recorded = mod.recorded_cells(args.skip_recorded or [], cfg)
        outcome = mod.run_pending(
            key, cfg, budget_s=budget, shard=part, references=refs, default_s=default_s, pack=args.pack,
            pack_all=args.pack_all, force=args.force, progress=not args.quiet, start=args._start,
            recorded=recorded, at_once=args.at_once,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    for note in outcome.notes:
        print(f"bootens: {note}", file=sys.stderr)
    for cell, reason in outcome.failed:
        print(f"bootens: cell {cell.label} failed, not stored: {reason}", file=sys.stderr)
    spent = _clock() - args._start
    print(f"bootens: ran {len(outcome.ran)} cell(s) of shard {part[0]}/{part[1]} in {spent:.0f} s"
          + (f" of a {budget:g} s budget" if budget is not None else "")
          + f" ({len(outcome.stored_before)} were stored already)", file=sys.stderr)
    groups: dict[tuple[str, str], list[float]] = {}
    for cell, est in outcome.remaining:
        groups.setdefault((cell.dataset, cell.method), []).append(est)
    skipped = {(c.dataset, c.method) for c in outcome.skipped}
    for (dataset, method), ests in groups.items():
        why = " (GP cells skipped: GPflow/TensorFlow not installed)" if (dataset, method) in skipped else ""
        print(f"bootens: remaining {dataset}/{method}: {len(ests)} cell(s), ~{sum(ests):.0f} s estimated{why}",
              file=sys.stderr)
    total = sum(e for _, e in outcome.remaining)
    print(f"bootens: remaining in all: {len(outcome.remaining)} cell(s), ~{total:.0f} s estimated"
          if outcome.remaining else "bootens: remaining: none", file=sys.stderr)
    if outcome.pack is not None:
        print(f"bootens: wrote {outcome.pack}", file=sys.stderr)
    try:
        result = _stored_result(mod, outcome.store_dir, cfg)
    except FileNotFoundError:
        if outcome.ran:
            # Cells are stored under a hash of their settings and of their method's source, taken when the run
            # began: finding none of them now means that source (or a setting) changed while the run went on.
            print(f"bootens: the {len(outcome.ran)} cell(s) run now are not under this checkout's cell-store key: "
                  "the package's source or the settings changed while the run went on"
                  + (f" ({outcome.pack} holds the cells)" if outcome.pack is not None else "")
                  + f"; nothing written to {args.out}", file=sys.stderr)
            return 1
        print(f"bootens: no finished cell of this configuration yet: nothing written to {args.out}",
              file=sys.stderr)
        return 1 if outcome.failed else 0
    result.provenance.update(profile=config.profile(args.profile), cells_run_now=len(outcome.ran))
    try:
        where = store.save(result, f"{args.out}/{mod.NAME}")
    except OSError as exc:
        print(f"bootens: --out {args.out}: cannot write the result ({exc.strerror or exc})", file=sys.stderr)
        return 2
    if not args.quiet:
        print(json.dumps(result.summary, indent=2, sort_keys=True, default=str))
    print(f"bootens: wrote {where}", file=sys.stderr)
    return 1 if outcome.failed else 0


def _cmd_run(args: argparse.Namespace) -> int:
    import jax

    from . import config, experiments, store

    try:
        mod = experiments.get(args.experiment)
    except KeyError as exc:
        print(f"bootens: {exc.args[0]}", file=sys.stderr)
        return 2
    cfg = _configure(mod, args)
    if isinstance(cfg, int):
        return cfg
    problem = _writable_dir(args.out)
    if problem:
        print(f"bootens: {problem}", file=sys.stderr)
        return 2
    key = jax.random.key(cfg.seed)
    if _scheduled_options(args):
        return _run_pending(mod, cfg, key, args)
    try:
        if args.stored_only:
            if not hasattr(mod, "from_cells"):
                print(f"bootens: --stored-only is for experiments stored cell by cell (uci), not {mod.NAME}",
                      file=sys.stderr)
                return 2
            # Assemble the finished cells only (e.g. while a long run is still going, or after it was cut
            # short); the summary lists the missing ones and the wall time is the cells' own.
            result = _stored_result(mod, mod.store_dir(key, cfg), cfg)
        else:
            result = mod.run(key, cfg, force=args.force, progress=not args.quiet)
    except (ValueError, FileNotFoundError) as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    result.provenance["profile"] = config.profile(args.profile)
    try:
        where = store.save(result, f"{args.out}/{mod.NAME}")
    except OSError as exc:
        print(f"bootens: --out {args.out}: cannot write the result ({exc.strerror or exc})", file=sys.stderr)
        return 2
    if not args.quiet:
        print(json.dumps(result.summary, indent=2, sort_keys=True, default=str))
    print(f"bootens: wrote {where}", file=sys.stderr)
    return 0


def _cmd_fold(args: argparse.Namespace) -> int:
    """``fold-cells PACK... --into DIR``: merge packed cells into the local cell store, rewrite the record."""
    import jax

    from . import config, experiments, store

    mod = experiments.get("uci")
    cfg = _configure(mod, args)
    if isinstance(cfg, int):
        return cfg
    problem = _writable_dir(args.into, "--into")
    if problem:
        print(f"bootens: {problem}", file=sys.stderr)
        return 2
    key = jax.random.key(cfg.seed)
    from pathlib import Path

    # The record's own cells stay in it (the cell files it was assembled from are usually not at hand): a
    # packed cell replaces the row of the same cell. Only when the record was made with these settings.
    old_config, kept, previous = Path(args.into) / "config.json", [], None
    if old_config.is_file() and (Path(args.into) / "cells.csv").is_file():
        try:
            previous = json.loads(old_config.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"bootens: {old_config}: unreadable ({exc}); give another --into or remove it", file=sys.stderr)
            return 2
    changed: list[str] = []
    try:
        if previous is not None:
            # Only the settings that decide the record's own cells must agree (packed cells are checked against
            # this configuration by their family hash): a field added later for another method family does not
            # make the record one of other settings.
            held = mod.record_cells(args.into)
            methods = sorted({mod.cell_of(r).method for r in held})
            before = mod.settings(config.from_dict(mod.Config, previous), methods)
            after = mod.settings(cfg, methods)
            changed = [k for k in after if before.get(k) != after[k]]
            kept = [] if changed else held
        report = mod.fold(args.packs, key, cfg, force=args.force, root=args.store)
        result = _stored_result(mod, report.store_dir, cfg, kept)
    except (ValueError, FileNotFoundError) as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    print(f"bootens: folded {report.written} cell(s) from {len(report.packs)} pack(s) into {report.store_dir} "
          f"({report.replaced} replaced a stored one, {report.outside} outside this selection"
          + (f", {report.forced} taken with another hash (--force)" if report.forced else "") + ")",
          file=sys.stderr)
    if changed:
        print(f"bootens: note: the configuration differs from the one in {old_config} in "
              f"{', '.join(changed)}; the record is rewritten with this one (its cells are not kept)",
              file=sys.stderr)
    elif kept:
        dropped = len({mod.cell_of(r) for r in kept} - set(mod.cells(cfg)))
        print(f"bootens: kept {result.summary['cells_kept']} cell(s) of the record in {args.into} that no pack "
              "replaced" + (f"; dropped {dropped} outside --datasets/--methods" if dropped else ""),
              file=sys.stderr)
    result.provenance["profile"] = config.profile(args.profile)
    result.provenance["folded_packs"] = [Path(p).name for p in args.packs]
    try:
        where = store.save(result, args.into)
    except OSError as exc:
        print(f"bootens: --into {args.into}: cannot write the result ({exc.strerror or exc})", file=sys.stderr)
        return 2
    if not args.quiet:
        print(json.dumps(result.summary, indent=2, sort_keys=True, default=str))
    print(f"bootens: wrote {where}", file=sys.stderr)
    return 0


def _cmd_deep_relu_reference(args: argparse.Namespace) -> int:
    """``deep-relu-reference``: the deep-ReLU chapter's NUTS reference, run or resumed in OUT/nuts-reference
    chunk by chunk until it converges, ``--draws`` or ``--time-budget``; prints the diagnostics so far."""
    import math

    import jax

    from . import config, store
    from .experiments import deep_relu
    from ..samplers import resumable
    from .experiments.deep_relu import reference

    cfg = _configure(deep_relu, args)
    if isinstance(cfg, int):
        return cfg
    budget = args.time_budget
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        print(f"bootens: --time-budget takes a positive number of seconds, got {budget:g}", file=sys.stderr)
        return 2
    if args.chunk_draws < 1 or (args.draws is not None and args.draws < 0):
        print("bootens: --chunk-draws takes a positive number of draws, --draws a non-negative one",
              file=sys.stderr)
        return 2
    problem = _writable_dir(args.out)
    if problem:
        print(f"bootens: {problem}", file=sys.stderr)
        return 2
    where = Path(args.out) / reference.DIRNAME
    if args.status:
        # Read only (no lock taken): safe beside the process running the directory.
        try:
            run = resumable.read_run(where)
        except (ValueError, FileNotFoundError) as exc:
            print(f"bootens: {exc}", file=sys.stderr)
            return 2
        diag = reference.diagnostics(run, args.target_rhat, args.target_ess)
        seconds = sum(e["seconds"] for e in run.manifest["warmup"] + run.manifest["chunks"])
        print(f"bootens: {where}: warm-up {run.manifest['warmup_done']}/"
              f"{run.manifest['identity']['sampler']['n_warmup']}, {diag.draws} draws x {diag.chains} chains "
              f"kept ({seconds:.0f} s of chunks so far)", file=sys.stderr)
        print(json.dumps({"warmup_done": run.manifest["warmup_done"], **diag._asdict(),
                          "target_rhat": args.target_rhat, "target_ess": args.target_ess}, indent=2))
        return 0
    prov = store.provenance()
    note = {"git_commit": prov["git_commit"], "device": prov["device"]["kind"],
            "versions": {k: prov["versions"].get(k) for k in ("jax", "jaxlib", "numpyro")},
            "profile": config.profile(args.profile)}
    total = cfg.nuts.warmup + args.draws if args.draws is not None else None
    bar = None
    if not args.quiet:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="deep-ReLU NUTS reference", unit="transition/chain")

    def show(p, diag) -> None:
        if bar is None:
            return
        bar.n = p.warmup_done + p.draws_done
        post = {"warm-up": f"{p.warmup_done}/{cfg.nuts.warmup}", "draws": p.draws_done,
                "chunk s": f"{p.last_chunk_s:.0f}"}
        if diag is not None:
            post.update({"R-hat max": f"{diag.rhat_max:.3f}", "ESS min": f"{diag.ess_bulk_min:.0f}"})
        bar.set_postfix(post, refresh=True)

    try:
        prog, diag = reference.run_reference(
            jax.random.key(cfg.seed), cfg, where, chunk_draws=args.chunk_draws, n_draws=args.draws,
            time_budget_s=None if budget is None else budget - (_clock() - args._start),
            target_rhat=args.target_rhat, target_ess=args.target_ess, on_chunk=show, note=note,
        )
    except ValueError as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bootens: interrupted; {where} keeps every chunk saved before the interrupt: the same command "
              "resumes from the last one", file=sys.stderr)
        return 130
    finally:
        if bar is not None:
            bar.close()
    why = {"done": f"{args.draws} draws per chain kept",
           "stopped": "converged" if diag.converged else "time budget spent"}[prog.stopped]
    print(f"bootens: {where}: warm-up {prog.warmup_done}/{cfg.nuts.warmup}, {diag.draws} draws x "
          f"{diag.chains} chains kept ({why}; {prog.session_s:.0f} s this call)", file=sys.stderr)
    print(json.dumps({"warmup_done": prog.warmup_done, **diag._asdict(),
                      "target_rhat": args.target_rhat, "target_ess": args.target_ess}, indent=2))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    import jax

    from . import config
    from .performance import bench

    if args.case == "uci-cell":
        return _bench_uci_cell(args)
    if args.case == "particle-batch":
        return _bench_particle_batch(args)
    if args.case == "linesearch":
        return _bench_linesearch(args)
    if args.case == "uci-dataset":
        return _bench_uci_dataset(args)
    if args.case == "estimator":
        return _bench_estimator(args)
    if args.case == "groups":
        return _bench_groups(args)
    if args.case == "first-fit":
        return _bench_first_fit(args)
    cfg = bench.Config.quick() if args.quick else config.for_profile(bench.Config, args.profile)
    overrides = {"ks": args.k, "hidden_layers": args.models, "datasets": args.datasets, "steps": args.steps,
                 "repeats": args.repeats, "max_rows": args.max_rows, "loop_particles": args.loop_particles}
    for name, value in overrides.items():
        if value is not None:
            cfg = dataclasses.replace(cfg, **{name: tuple(value) if isinstance(value, list) else value})
    if args.shard:
        cfg = dataclasses.replace(cfg, shard=True)
    if args.no_torch:
        cfg = dataclasses.replace(cfg, torch=False)
    problem = _writable_dir(args.out)
    if problem:
        print(f"bootens: {problem}", file=sys.stderr)
        return 2
    label = "quick" if args.quick else config.profile(args.profile)
    out = Path(args.out) / "bench.json"
    try:
        # bench.json is rewritten after every row ("complete" false until the end): a run cut off keeps
        # the rows it measured.
        doc = bench.measure(jax.random.key(cfg.seed), cfg, progress=not args.quiet,
                            on_row=lambda partial: _write_json(out, {**partial, "profile": label}))
    except ValueError as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    doc["profile"] = label
    _write_json(out, doc)
    if not args.quiet:
        for r in doc["rows"]:
            torch_x = "-" if r["speedup_vs_torch_loop"] is None else f"{r['speedup_vs_torch_loop']:.2f}"
            print(f"{r['model']:<9} {r['dataset']:<8} k={r['k']:<5} {r['particle_steps_per_s']:>10.4g} "
                  f"particle-steps/s  {r['flops_per_s']:.3g} FLOP/s  x{r['speedup_vs_jax_loop']:.2f} vs JAX loop  "
                  f"x{torch_x} vs torch loop  {r['roofline_fraction']:.0%} of roofline")
    print(f"bootens: wrote {out} ({doc['device']['kind']}, {doc['wall_s']:.0f} s)", file=sys.stderr)
    return 0


def _write_json(path: Path, doc: dict) -> Path:
    """Write ``doc`` to ``path`` atomically (a temporary file beside it, then a rename); returns ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(path)
    return path


def _bench_uci_cell(args: argparse.Namespace) -> int:
    """``bootens bench --case uci-cell``: real ensemble cells timed cold and warm -> OUT/uci-cell.json."""
    import dataclasses
    from pathlib import Path

    import jax

    from . import config
    from .performance import bench
    from .experiments.uci.config import UCIConfig

    cfg = config.for_profile(UCIConfig, "quick" if args.quick else args.profile)
    if args.k:
        cfg = dataclasses.replace(cfg, n_particles=int(args.k[0]))
    if args.steps is not None:
        cfg = config.replace(cfg, "lbfgs.steps", int(args.steps))
    problem = _writable_dir(args.out)
    if problem:
        print(f"bootens: {problem}", file=sys.stderr)
        return 2
    try:
        doc = bench.measure_uci_cell(jax.random.key(cfg.seed), cfg, args.datasets or ["yacht"],
                                     args.models or [1, 4], args.grid_batches or [1, 0], progress=not args.quiet)
    except (ValueError, FileNotFoundError) as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    doc["profile"] = "quick" if args.quick else config.profile(args.profile)
    out = _write_json(Path(args.out) / "uci-cell.json", doc)
    if not args.quiet:
        for r in doc["rows"]:
            print(f"{r['dataset']:<9} {r['hidden_layers']} layer(s)  grid batch {r['grid_batch_used']}: "
                  f"cold {r['cold_s']:.1f} s, warm {r['warm_s']:.1f} s, compile {r['compile_s']:.1f} s, "
                  f"{r['flops_per_s']:.3g} FLOP/s ({r['roofline_fraction']:.1%} of roofline), "
                  f"{r['diverged_particles']} diverged")
    print(f"bootens: wrote {out} ({doc['device']['kind']}, {doc['wall_s']:.0f} s)", file=sys.stderr)
    return 0


def _bench_case(args: argparse.Namespace, name: str, measure: Callable[[], dict],
                line: Callable[[dict], str]) -> int:
    """Run one ``bootens bench --case`` measurement: ``measure()`` -> OUT/``name``, a ``line(row)`` per row on
    stdout (unless ``--quiet``); a bad setting (``ValueError``) or an unwritable OUT is one error, status 2."""
    from pathlib import Path

    problem = _writable_dir(args.out)
    if problem:
        print(f"bootens: {problem}", file=sys.stderr)
        return 2
    try:
        doc = measure()
    except ValueError as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    out = _write_json(Path(args.out) / name, doc)
    if not args.quiet:
        for r in doc["rows"]:
            print(line(r))
    print(f"bootens: wrote {out} ({doc['device']['kind']}, {doc['wall_s']:.0f} s)", file=sys.stderr)
    return 0


def _bench_particle_batch(args: argparse.Namespace) -> int:
    """``bootens bench --case particle-batch``: particles stepped in groups against all at once ->
    OUT/particle-batch.json."""
    import jax

    from .performance import bench

    def line(r: dict) -> str:
        batch = "all" if r["particle_batch"] is None else r["particle_batch"]
        sec = r["seconds"]
        return (f"{r['dataset']:<8} {r['network']:<34} {r['optimizer']:<10} k={r['k']} batch {batch:>4}: "
                f"{sec['median']:.3f} s (IQR {sec['q25']:.3f}-{sec['q75']:.3f}), x{r['speedup']:.2f}, "
                f"max |diff| {r['max_abs_diff']:.1e}")

    return _bench_case(args, "particle-batch.json", lambda: bench.measure_particle_batches(
        jax.random.key(0), args.datasets or ["boston"], args.models or [1], int(args.k[0]) if args.k else 200,
        args.particle_batches, steps=args.steps or 20, repeats=args.repeats or 5, max_rows=args.max_rows or 0,
        features=args.features), line)


def _bench_linesearch(args: argparse.Namespace) -> int:
    """``bootens bench --case linesearch``: the ensembles' zoom line search against optax's own under vmap ->
    OUT/linesearch.json."""
    import jax

    from .performance import bench

    def line(r: dict) -> str:
        per = 1e3 / r["steps"]
        sec = r["seconds"]
        return (f"{r['dataset']:<8} {r['hidden_layers']} layer(s) k={r['k']:<5} {r['linesearch']:<8} "
                f"{r['ms_per_iteration']:8.2f} ms/iteration (IQR {sec['q25'] * per:.2f}-{sec['q75'] * per:.2f}), "
                f"x{r['speedup']:.2f}, first call {r['first_call_s']:.1f} s, {r['search_steps']:.3f} search steps, "
                f"max |diff| {r['max_abs_diff']:.1e}")

    return _bench_case(args, "linesearch.json", lambda: bench.measure_linesearch(
        jax.random.key(0), args.datasets or ["boston"], args.models or [1], args.k or [50, 200],
        steps=args.steps or 100, repeats=args.repeats or 3, max_rows=args.max_rows or 0), line)


def _bench_estimator(args: argparse.Namespace) -> int:
    """``bootens bench --case estimator``: the scikit-learn estimator against the GP, a bagged MLP and the plain
    ensemble, with their defaults (``--quick``: two problems, two splits, a small ensemble) -> OUT/estimator.json."""
    from .performance import rivals

    def line(r: dict) -> str:
        far = "" if r["far_coverage90"] != r["far_coverage90"] else f", far {r['far_coverage90']:.2f}"
        return (f"{r['problem']:<13} {r['method']:<10} split {r['split']}: RMSE {r['rmse']:.4g}, NLL {r['nll']:.3f}, "
                f"coverage90 {r['coverage90']:.2f}{far}, fit {r['fit_s']:.1f} s")

    if args.quick:
        kw = {"problems": args.datasets or ["sinusoid-gap", "friedman3"], "n_splits": 2,
              "estimator_settings": {"n_particles": 5, "steps": 30, "optimizer": "adam", "learning_rate": 0.05,
                                     "noise_grid": (0.01, 0.1, 1.0)}}
    else:
        kw = {"problems": args.datasets or list(rivals.PROBLEMS), "n_splits": 5}
    return _bench_case(args, "estimator.json", lambda: rivals.measure(**kw, progress=not args.quiet), line)


def _bench_groups(args: argparse.Namespace) -> int:
    """``bootens bench --case groups``: a UCI ensemble cell and the estimator's fit, particles in the library's
    groups against all at once, in one run -> OUT/groups.json."""
    import dataclasses

    import jax

    from . import config
    from .experiments.uci.config import UCIConfig
    from .performance import bench, profiling

    cfg = config.for_profile(UCIConfig, "quick" if args.quick else args.profile)
    if args.k:
        cfg = dataclasses.replace(cfg, n_particles=int(args.k[0]))
    if args.steps is not None:
        cfg = config.replace(cfg, "lbfgs.steps", int(args.steps))
    datasets, layers = args.datasets or ["boston"], args.models or [1]
    if len(datasets) != 1 or len(layers) != 1:
        print(f"bootens: --case groups times one cell: give one dataset and one --models value, got "
              f"{datasets} and {layers}", file=sys.stderr)
        return 2

    def line(r: dict) -> str:
        return (f"{r['what']:<44} {r['way']:<12} repeat {r['repeat']}: {r['wall_s']:8.1f} s "
                f"(compile {r['compile_s']:.1f} s, compute {r['compute_s']:.1f} s), RMSE {r['rmse']:.4g}, "
                f"MNLL {r['mnll']:.4g}")

    def measure() -> dict:
        doc = profiling.measure_groups(jax.random.key(cfg.seed), cfg, datasets[0], int(layers[0]),
                                       repeats=args.repeats or 1, progress=not args.quiet)
        doc["profile"] = "quick" if args.quick else config.profile(args.profile)
        doc["device"] = bench.device_info(doc["provenance"])
        return doc

    return _bench_case(args, "groups.json", measure, line)


def _bench_first_fit(args: argparse.Namespace) -> int:
    """``bootens bench --case first-fit``: the estimator's time to a first answer -> OUT/first-fit.json."""
    from .performance import bench, profiling

    def line(r: dict) -> str:
        top = ", ".join(f"{name} {sec:.1f} s" for name, sec in r["programs"][:3]) or "none"
        return (f"{r['what']:<26} {r['wall_s']:7.2f} s (compile {r['compile_s']:.2f} s in {r['compiles']} "
                f"compilations; largest programs: {top})")

    settings = ({"n_particles": 4, "steps": 5, "noise_grid": [0.1, 1.0]} if args.quick else {})

    def measure() -> dict:
        doc = profiling.measure_first_fit(settings)
        doc["device"] = bench.device_info(doc["provenance"])
        return doc

    return _bench_case(args, "first-fit.json", measure, line)


def _bench_uci_dataset(args: argparse.Namespace) -> int:
    """``bootens bench --case uci-dataset``: one L-BFGS iteration of paper-scale UCI ensembles, split into its
    parts and set against the roofline -> OUT/uci-dataset.json (rewritten after every row)."""
    import dataclasses
    from pathlib import Path

    import jax

    from . import config
    from .experiments.uci.config import UCIConfig
    from .performance import iteration

    label = "quick" if args.quick else (args.profile or "paper")
    cfg = config.for_profile(UCIConfig, label)
    if args.k:
        cfg = dataclasses.replace(cfg, n_particles=int(args.k[0]))
    problem = _writable_dir(args.out)
    if problem:
        print(f"bootens: {problem}", file=sys.stderr)
        return 2
    out = Path(args.out) / "uci-dataset.json"
    try:
        doc = iteration.measure_uci_dataset(
            jax.random.key(cfg.seed), cfg, args.datasets or ["boston"], args.models or [1, 4],
            max_rows=args.max_rows or 0, grid_batch=(args.grid_batches or [0])[0], steps=args.steps or 10,
            warmup=20 if args.warmup is None else args.warmup, repeats=args.repeats or 5,
            directions=args.lbfgs_directions or ["compact"],
            on_row=lambda partial: _write_json(out, {**partial, "profile": label}))
    except (ValueError, FileNotFoundError) as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    doc["profile"] = label
    _write_json(out, doc)
    if not args.quiet:
        print(f"{'dataset':<9} {'layers':>6} {'direction':>9} {'K':>5} {'rows':>5} {'GFLOP/it':>9} {'MB/it':>8} {'ms/it':>8} "
              f"{'FLOP%':>6} {'BW%':>7} {'compile s':>9} {'evals':>5}  eval / two-loop / search bookkeeping (ms)")
        for r in doc["rows"]:
            sp = r["split"]
            print(f"{r['dataset']:<9} {r['hidden_layers']:>6} {r['direction']:>9} {r['particles']:>5} {r['n_rows']:>5} "
                  f"{r['flops_per_iteration'] / 1e9:>9.3f} {r['bytes_per_iteration'] / 1e6:>8.1f} "
                  f"{1e3 * r['seconds_per_iteration']:>8.2f} {r['flop_fraction']:>6.1%} {r['bandwidth_fraction']:>7.1%} "
                  f"{r['compile_s']:>9.1f} {r['search_evals_per_particle']:>5.2f}  "
                  f"{1e3 * sp['model_eval_s']:.2f} / {1e3 * sp['two_loop_s']:.2f} / "
                  f"{1e3 * sp['line_search_bookkeeping_s']:.2f}")
        print(f"peaks: {doc['peak']['flops_per_s']:.3g} FLOP/s, {doc['peak']['bytes_per_s']:.3g} B/s "
              f"({doc['peak']['source']}); split by differences of timed part programs "
              f"(bootens_core.repro.performance.iteration)")
    print(f"bootens: wrote {out} ({doc['device']['kind']}, {doc['wall_s']:.0f} s)", file=sys.stderr)
    return 0


# What the reproduction layer needs beyond the library's own dependencies (the `repro` extra).
REPRO_MODULES = ("pandas", "matplotlib")


def _missing_repro_modules() -> list[str]:
    import importlib

    missing = []
    for name in REPRO_MODULES:
        try:
            importlib.import_module(name)  # every command imports them anyway
        except ImportError:
            missing.append(name)
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bootens`` console script."""
    start = _clock()  # --time-budget counts from here
    missing = _missing_repro_modules()
    if missing:
        print(f"bootens: the command rebuilds the paper and needs the reproduction extra (missing: "
              f"{', '.join(missing)}): {install_hint('repro', missing)}", file=sys.stderr)
        return 2
    import jax

    jax.config.update("jax_enable_x64", True)  # the experiments compute in float64 (config.require_x64)
    # float32 matrix products in float32 on every device: JAX's default on NVIDIA GPUs since Ampere is TF32
    # (10-bit mantissa), which no CPU uses, so a record's cells would be two computations. The environment
    # variable JAX_DEFAULT_MATMUL_PRECISION, when set, decides instead; provenance records the setting.
    if not os.environ.get("JAX_DEFAULT_MATMUL_PRECISION"):
        jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION)
    parser = argparse.ArgumentParser(prog="bootens", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="list the experiments and the paper artefacts they rebuild")
    p_list.set_defaults(fn=_cmd_list)
    p_run = sub.add_parser("run", help="run one experiment and write its results")
    p_run.add_argument("experiment", help="experiment name (see `bootens list`)")
    p_run.add_argument("--profile", choices=["quick", "paper"], default=None,
                       help="settings profile (default: $BOOTENS_PROFILE or quick)")
    p_run.add_argument("--out", default=DEFAULT_OUT,
                       help=f"results folder (default: ./{DEFAULT_OUT}; results/ holds the committed record)")
    p_run.add_argument("--force", action="store_true", help="recompute even if a cached result exists")
    p_run.add_argument("--seed", type=int, default=None, help="override the config's seed")
    p_run.add_argument("--quiet", action="store_true", help="no progress bars, no summary on stdout")
    p_run.add_argument("--datasets", nargs="+", default=None, help="uci: datasets to run (default: the profile's)")
    p_run.add_argument("--methods", nargs="+", default=None, help="uci: method ids or families, e.g. ensemble-1 gp, or mcd,sghmc")
    p_run.add_argument("--set", action="append", metavar="FIELD=VALUE",
                       help="override a config field (JSON value; a method's settings by a dotted name), e.g. "
                            "--set n_particles=50 --set lbfgs.memory=100; repeatable")
    p_run.add_argument("--workers", type=int, default=None, help="uci: cells run at once (threads; 0: one per usable core, at most 2)")
    p_run.add_argument("--stored-only", action="store_true",
                       help="uci: compute nothing; summarise the cells already stored (missing ones are listed)")
    p_run.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                       help="uci: run pending cells in priority order, starting only those whose estimated "
                            "time fits in what is left of SECONDS (counted from the command's start); print "
                            "what remains")
    p_run.add_argument("--shard", default=None, metavar="I/N",
                       help="uci: run only every N-th cell of the priority order, from the I-th (0 <= I < N): "
                            "shards 0/N .. N-1/N cover every cell once")
    p_run.add_argument("--pack", default=None, metavar="FILE.tar.gz",
                       help="uci: write the cells computed by this run, with their provenance, into one "
                            ".tar.gz (rewritten after every cell); fold it in with `bootens fold-cells`")
    p_run.add_argument("--at-once", action="store_true",
                       help="uci: the pending splits of a dataset and ensemble method as one group, every split "
                            "x sigma^2 x particle in one program (each cell still stored and packed alone)")
    p_run.add_argument("--pack-all", action="store_true",
                       help="uci: --pack holds every stored cell of the configuration, not only this run's")
    p_run.add_argument("--cell-times", nargs="+", default=None, metavar="PATH",
                       help="uci: reference cell times for the estimates: record folders (cells.csv), "
                            "cells.csv files or cell packs, e.g. results/paper/uci results/paper/uci-mcd-sghmc")
    p_run.add_argument("--skip-recorded", nargs="+", default=None, metavar="RECORD",
                       help="uci: pass over the cells these committed record folders already hold at this "
                            "configuration's settings, e.g. results/paper/uci results/paper/uci-mcd-sghmc")
    p_run.add_argument("--default-cell-s", type=float, default=None, metavar="SECONDS",
                       help="uci: estimate of a cell whose method family has no measured time (default 600)")
    p_run.set_defaults(fn=_cmd_run)
    p_fold = sub.add_parser("fold-cells", help="uci: merge cell packs into the local cell store and rewrite a "
                                               "record folder from the stored cells (as --stored-only)")
    p_fold.add_argument("packs", nargs="+", metavar="PACK",
                        help="cell packs written by `bootens run uci --pack`")
    p_fold.add_argument("--into", required=True, metavar="DIR",
                        help="the record folder to rewrite, e.g. results/paper/uci")
    p_fold.add_argument("--profile", choices=["quick", "paper"], default=None,
                        help="settings profile (default: $BOOTENS_PROFILE or quick)")
    p_fold.add_argument("--seed", type=int, default=None, help="override the config's seed")
    p_fold.add_argument("--datasets", nargs="+", default=None,
                        help="datasets of the record (default: the profile's)")
    p_fold.add_argument("--methods", nargs="+", default=None, help="method ids or families of the record")
    p_fold.add_argument("--set", action="append", metavar="FIELD=VALUE",
                        help="override a config field; repeatable")
    p_fold.add_argument("--store", default=None, metavar="DIR",
                        help="the cell store to merge into (default: the configuration's, under "
                             "$BOOTENS_CACHE_DIR)")
    p_fold.add_argument("--force", action="store_true",
                        help="take cells made with other settings or code (another family hash) as this "
                             "configuration's")
    p_fold.add_argument("--quiet", action="store_true", help="no summary on stdout")
    p_fold.set_defaults(fn=_cmd_fold, workers=None)
    p_ref = sub.add_parser("deep-relu-reference",
                           help="the deep-ReLU NUTS reference, resumable: run or resume "
                                "OUT/nuts-reference chunk by chunk until converged")
    p_ref.add_argument("--profile", choices=["quick", "paper"], default=None,
                       help="settings profile (default: $BOOTENS_PROFILE or quick)")
    p_ref.add_argument("--out", default=f"{DEFAULT_OUT}/deep-relu",
                       help="folder of the run directory nuts-reference/ "
                            f"(default: ./{DEFAULT_OUT}/deep-relu)")
    p_ref.add_argument("--chunk-draws", type=int, default=10,
                       help="transitions per chunk and chain; the state is saved after each (default 10)")
    p_ref.add_argument("--draws", type=int, default=None, help="stop once this many draws per chain are kept")
    p_ref.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                       help="start no chunk that the last chunk's time says would end after SECONDS (counted "
                            "from the command's start)")
    p_ref.add_argument("--target-rhat", type=float, default=1.01,
                       help="stop when the predictive's R-hat is below this at every grid point ... "
                            "(default 1.01)")
    p_ref.add_argument("--target-ess", type=float, default=400.0,
                       help="... and its bulk ESS at least this (default 400)")
    p_ref.add_argument("--seed", type=int, default=None, help="override the config's seed")
    p_ref.add_argument("--set", action="append", metavar="FIELD=VALUE",
                       help="override a config field, e.g. --set nuts.chains=4; repeatable")
    p_ref.add_argument("--status", action="store_true",
                       help="run nothing: print the diagnostics of the draws kept so far (read only, safe "
                            "while another process runs the directory)")
    p_ref.add_argument("--quiet", action="store_true", help="no progress bar")
    p_ref.set_defaults(fn=_cmd_deep_relu_reference, datasets=None, methods=None, workers=None)
    p_bench = sub.add_parser("bench", help="particle throughput vs k, loops and the roofline -> OUT/bench.json")
    p_bench.add_argument("--quick", action="store_true", help="the quick benchmark (under 2 minutes on 2 CPU cores)")
    p_bench.add_argument("--profile", choices=["quick", "paper"], default=None,
                         help="settings profile without --quick (default: $BOOTENS_PROFILE or quick)")
    p_bench.add_argument("--out", default=f"{DEFAULT_OUT}/bench",
                         help=f"folder of bench.json (default: ./{DEFAULT_OUT}/bench)")
    p_bench.add_argument("--k", type=int, nargs="+", default=None, help="particle counts, e.g. 1 10 50 200 1000")
    p_bench.add_argument("--models", type=int, nargs="+", default=None, help="hidden layers of the networks (1 4)")
    p_bench.add_argument("--datasets", nargs="+", default=None, help="shapes of: boston kin8nm protein")
    p_bench.add_argument("--steps", type=int, default=None, help="training steps per timed call")
    p_bench.add_argument("--repeats", type=int, default=None, help="timed calls per row (after a warm-up)")
    p_bench.add_argument("--max-rows", type=int, default=None, help="cap on training rows (0 = full size)")
    p_bench.add_argument("--loop-particles", type=int, default=None, help="particles timed in the loop baselines")
    p_bench.add_argument("--shard", action="store_true", help="split the particle axis over all local devices")
    p_bench.add_argument("--no-torch", action="store_true", help="skip the PyTorch loop even if torch is installed")
    p_bench.add_argument("--case", choices=["throughput", "uci-cell", "particle-batch", "linesearch", "uci-dataset",
                                            "estimator", "groups", "first-fit"],
                         default="throughput",
                         help="throughput: particle-steps/s vs k (bench.json); uci-cell: real UCI ensemble cells "
                              "(the profile's L-BFGS and sigma^2 grid; --datasets, --models, --k as particles, "
                              "--steps as L-BFGS steps) timed cold and warm, one sigma^2 at a time and in "
                              "batches (uci-cell.json); particle-batch: the particles stepped in groups of "
                              "--particle-batches against all at once, Adam and line-search L-BFGS "
                              "(particle-batch.json; --k as particles, default 200); linesearch: the "
                              "ensembles' zoom line search against optax's own under vmap, L-BFGS as in the UCI "
                              "profiles (linesearch.json; --k, default 50 200; --steps, default 100); "
                              "uci-dataset: one L-BFGS iteration of a paper-scale UCI ensemble (real data of "
                              "split 0; --k as particles per sigma^2, --max-rows, --steps iterations per timed "
                              "call, default 10; --repeats, default 5; --warmup), XLA's FLOPs and bytes, the "
                              "roofline fractions and where its time goes (uci-dataset.json); estimator: the "
                              "scikit-learn estimator against scikit-learn's GP, a bagged MLP and the plain ensemble "
                              "on four problems, five splits, defaults (estimator.json; --datasets as problems); groups: one "
                              "UCI ensemble cell (--datasets, --models: one each, default boston 1; --k, --steps) and "
                              "the estimator's diabetes fit, particles in the library's groups against all at once, "
                              "alternating (--repeats, default 1) (groups.json); first-fit: the estimator's time to "
                              "a first answer on diabetes in a fresh process: import, first fit, a second fit, a fit "
                              "of another row count, predict, with their compilation (first-fit.json; --quick: a "
                              "small ensemble and few steps)")
    p_bench.add_argument("--grid-batches", type=int, nargs="+", default=None,
                         help="uci-cell: sigma^2 values trained together (1 = one at a time, 0 = automatic; "
                              "default 1 0); uci-dataset: the first is used (default 0)")
    p_bench.add_argument("--warmup", type=int, default=None,
                         help="uci-dataset: real iterations before the timed ones (default 20)")
    p_bench.add_argument("--lbfgs-directions", nargs="+", default=None, choices=["compact", "two-loop"],
                         help="uci-dataset: the L-BFGS directions timed, a row each (default compact: the "
                              "ensembles' own; two-loop: optax's recursion, the same direction up to rounding)")
    p_bench.add_argument("--particle-batches", type=int, nargs="+", default=[10, 20, 50],
                         help="particle-batch: group sizes timed against all particles at once")
    p_bench.add_argument("--features", type=int, default=0,
                         help="particle-batch: also the linear chapter's model, linear in this many "
                              "trigonometric features of 64 points (0 = not timed)")
    p_bench.add_argument("--quiet", action="store_true", help="no progress bar, no table on stdout")
    p_bench.set_defaults(fn=_cmd_bench)
    args = parser.parse_args(argv)
    args._start = start
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("bootens: interrupted; no partial result was written, except that uci keeps its finished cells "
              "(the next run resumes from them) and bench its measured rows (bench.json, marked incomplete)",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
