"""The ``bootens`` command: list experiments and run them into a results folder.

    bootens list
    bootens run univariate --profile quick               # -> bootens-out/univariate/
    bootens run linear --profile paper --out runs/ --force
    bootens run uci --profile paper --datasets boston yacht --methods ensemble-1 gp --workers 2
    bootens run uci --profile paper --stored-only     # summarise the cells finished so far
    bootens bench --quick                             # particle throughput -> bootens-out/bench/bench.json

``run`` writes ``OUT/<experiment>/{summary.json, arrays.npz, config.json, provenance.json}`` and prints the
summary. Results are cached (see :mod:`bootens_core.store`); ``--force`` recomputes. Without ``--out``, results go
to ``bootens-out/`` in the current folder, never beside the committed record under ``results/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

__all__ = ["main", "DEFAULT_OUT"]

# Where `run` and `bench` write without --out: apart from results/, which holds the committed record.
DEFAULT_OUT = "bootens-out"


def _writable_dir(path: str) -> str | None:
    """Create ``path`` (and parents) and check that a file can be written there; return a one-line reason
    if not. Called before any computation, so a long run never ends in a traceback about its output."""
    import os
    import tempfile
    from pathlib import Path

    target = Path(path)
    try:
        if target.exists() and not target.is_dir():
            return f"--out {path}: exists and is not a folder"
        target.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".bootens-write-test-", dir=target)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"--out {path}: cannot write there ({exc.strerror or exc})"
    return None


def _cmd_list(args: argparse.Namespace) -> int:
    from . import experiments

    width = max(len(n) for n in experiments.REGISTRY)
    for name, mod in sorted(experiments.REGISTRY.items()):
        print(f"{name:<{width}}  {', '.join(mod.ARTEFACTS):<32}  {mod.DESCRIPTION}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import jax

    from . import config, experiments, store

    try:
        mod = experiments.get(args.experiment)
    except KeyError as exc:
        print(f"bootens: {exc.args[0]}", file=sys.stderr)
        return 2
    cfg = config.for_profile(mod.Config, args.profile)
    import dataclasses

    overrides = {"seed": args.seed, "datasets": args.datasets, "methods": args.methods, "workers": args.workers}
    fields = {f.name for f in dataclasses.fields(cfg)}
    for name, value in overrides.items():
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
    for item in args.set or []:
        name, sep, text = item.partition("=")
        if not sep or name not in fields:
            print(f"bootens: --set takes FIELD=VALUE with a field of {type(cfg).__name__}, got {item!r}",
                  file=sys.stderr)
            return 2
        current = getattr(cfg, name)
        try:
            value = json.loads(text) if not isinstance(current, str) else text
            if isinstance(current, tuple):
                value = tuple(value)
            elif isinstance(current, bool) and not isinstance(value, bool):
                raise ValueError(name)
            elif type(current) is int and (isinstance(value, bool) or value != int(value)):
                raise ValueError(name)
            elif type(current) in (int, float):
                value = type(current)(value)
        except (ValueError, TypeError):
            print(f"bootens: cannot read {text!r} as a value of {name} ({type(current).__name__})", file=sys.stderr)
            return 2
        cfg = dataclasses.replace(cfg, **{name: value})
    problem = _writable_dir(args.out)
    if problem:
        print(f"bootens: {problem}", file=sys.stderr)
        return 2
    key = jax.random.key(cfg.seed)
    try:
        if args.stored_only:
            if not hasattr(mod, "from_cells"):
                print(f"bootens: --stored-only is for experiments stored cell by cell (uci), not {mod.NAME}",
                      file=sys.stderr)
                return 2
            # Assemble the finished cells only (e.g. while a long run is still going, or after it was cut
            # short); the summary lists the missing ones and the wall time is the cells' own.
            root = mod._store_dir(key, cfg)
            result = mod.from_cells(root, cfg, store.provenance())
            result.provenance["wall_time_s"] = result.summary["wall_s_cells_total"]
            result.provenance["assembled_from_stored_cells"] = True
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


def _cmd_bench(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    import jax

    from . import bench, config

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
    try:
        doc = bench.measure(jax.random.key(cfg.seed), cfg, progress=not args.quiet)
    except ValueError as exc:
        print(f"bootens: {exc}", file=sys.stderr)
        return 2
    doc["profile"] = "quick" if args.quick else config.profile(args.profile)
    out = Path(args.out)
    tmp = out / ".bench.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(out / "bench.json")
    if not args.quiet:
        for r in doc["rows"]:
            torch_x = "-" if r["speedup_vs_torch_loop"] is None else f"{r['speedup_vs_torch_loop']:.2f}"
            print(f"{r['model']:<9} {r['dataset']:<8} k={r['k']:<5} {r['particle_steps_per_s']:>10.4g} "
                  f"particle-steps/s  {r['flops_per_s']:.3g} FLOP/s  x{r['speedup_vs_jax_loop']:.2f} vs JAX loop  "
                  f"x{torch_x} vs torch loop  {r['roofline_fraction']:.0%} of roofline")
    print(f"bootens: wrote {out / 'bench.json'} ({doc['device']['kind']}, {doc['wall_s']:.0f} s)", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bootens`` console script."""
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
                       help="override a config field (JSON value), e.g. --set n_particles=50; repeatable")
    p_run.add_argument("--workers", type=int, default=None, help="uci: cells run at once (threads)")
    p_run.add_argument("--stored-only", action="store_true",
                       help="uci: compute nothing; summarise the cells already stored (missing ones are listed)")
    p_run.set_defaults(fn=_cmd_run)
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
    p_bench.add_argument("--quiet", action="store_true", help="no progress bar, no table on stdout")
    p_bench.set_defaults(fn=_cmd_bench)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("bootens: interrupted; no partial result was written (uci keeps its finished cells and resumes "
              "from them on the next run)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
