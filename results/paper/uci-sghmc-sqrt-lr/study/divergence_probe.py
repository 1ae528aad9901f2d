"""Where and when do the SGHMC restarts of the UCI record diverge? (see DIVERGENCE.md next to this file)

One split's *final* fit (the whole training split, standardised), as the harness runs it: the cell's key
(``_cell_key`` of ``experiment.py``, seed 0, then the second half of ``split(key)``), the paper's 1-layer
network (50 ReLU units, N(0, 1) priors), 10 restarts from prior draws, ``mdecay`` 0.01, ``lr`` 0.001; each
row varies one of: sigma^2 (standardised units), lr_scaling, batch size, dtype, chain length.

Prints one JSON line per run: the restarts that diverged (of 10), the first non-finite step of each (burn-in
is steps 0 .. burn_in - 1), the median frozen preconditioner M^-1 and the wall time.

    BOOTENS_DATA_DIR=/work/main/.bootens_cache/uci-data nice -n 19 .venv/bin/python \\
        results/paper/uci-sghmc-sqrt-lr/study/divergence_probe.py --dataset wine --split 1 --noise-var 1e-4 1e-2 1 \\
        --lr-scaling sqrt_lr none --batch 20 --draws 20
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import jax
import numpy as np

from bootens_core import models, samplers
from bootens_core.data import uci
from bootens_core.repro.experiments.uci.config import UCI_METHODS


def cell_fit_key(dataset: str, split: int, seed: int = 0) -> jax.Array:
    """The key of the cell's final fit (experiment._cell_key, then harness.run_cell's k_fit)."""
    k = jax.random.fold_in(jax.random.key(seed), uci.DATASETS.index(dataset))
    k = jax.random.fold_in(k, UCI_METHODS.index("sghmc-1"))
    k = jax.random.fold_in(k, split)
    return jax.random.split(k)[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="wine")
    p.add_argument("--split", type=int, default=1)
    p.add_argument("--noise-var", type=float, nargs="+", default=[1.0])
    p.add_argument("--lr-scaling", nargs="+", default=["sqrt_lr"])
    p.add_argument("--lr", type=float, nargs="+", default=[1e-3])
    p.add_argument("--batch", type=int, nargs="+", default=[20])
    p.add_argument("--dtype", nargs="+", default=["float32"])
    p.add_argument("--burn-in", type=int, default=2000)
    p.add_argument("--thin", type=int, default=2000)
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--restarts", type=int, default=10)
    p.add_argument("--mdecay", type=float, default=0.01)
    p.add_argument("--key-seed", type=int, default=-1, help="-1: the cell's own key; else key(seed)")
    args = p.parse_args()

    data = uci.load(args.dataset, args.split)
    model = models.mlp(data.x_train.shape[1], (50,), "relu", weight_var=1.0, bias_var=1.0)
    key = cell_fit_key(args.dataset, args.split) if args.key_seed < 0 else jax.random.key(args.key_seed)
    grid = itertools.product(args.noise_var, args.lr_scaling, args.lr, args.batch, args.dtype)
    for nv, scaling, lr, batch, dtype in grid:
        if dtype == "float64":
            jax.config.update("jax_enable_x64", True)
        start = time.perf_counter()
        res = samplers.sghmc_model(
            key, model, data.x_train, data.y_train, nv, n_restarts=args.restarts, n_draws=args.draws,
            burn_in=args.burn_in, thin=args.thin, lr=lr, mdecay=args.mdecay,
            batch_size=min(batch, len(data.y_train)), lr_scaling=scaling, on_diverged="report", dtype=dtype,
        )
        info = res.info
        first = [s for s in info["first_nonfinite_step"] if s is not None]
        print(json.dumps({
            "dataset": args.dataset, "split": args.split, "n": int(info["n_data"]), "noise_var": nv,
            "lr": lr, "lr_scaling": scaling, "eps": round(float(info["step_size"]), 6),
            "batch": info["batch_size"],
            "dtype": dtype, "burn_in": args.burn_in, "steps": info["n_steps_per_chain"],
            "diverged": f"{info['n_diverged']}/{args.restarts}", "first_nonfinite_step": sorted(first),
            "in_burn_in": sum(s < args.burn_in for s in first),
            "minv_median": float(np.median(info["minv_median"])),
            "wall_s": round(time.perf_counter() - start, 1),
        }), flush=True)


if __name__ == "__main__":
    main()
