#!/usr/bin/env bash
# One GPU window, one command of at most 9 minutes: a short benchmark, then the paper-scale cells still missing,
# in stages (bootens_core/repro/experiments/uci/window.py: the 1-layer ensembles, the 4-layer ensembles with the
# fan-in prior, the paper's N(0, 1) prior at 4 layers on 3 splits a dataset, the cells made with TF32 products
# again in float32, then Power's and Kin8nm's 1-layer ensembles on a finer sigma^2 grid, the sensitivity of their
# verdicts to the grid), as PROCESSES workers sharing the device. It prints, before the cells start, how many the
# cost model expects to finish. What comes back ($OUT, or bootens-out/window): bench.log, uci-dataset.json,
# window.log and window.tar (every pack and worker log), then fold the packs at COMMIT (results/paper/README.md).
#
# usage: bash results/paper/device.sh COMMIT [window arguments...]
#   environment: WINDOW_S (530: the whole command, bench included), PROCESSES (6), BENCH_S (60; 0 skips),
#   PRECISION_S (0 skips; e.g. 240): beside the window, one more process makes Yacht's 1-layer splits 0-6 with
#   JAX's matmul precision PRECISION (default "high") into PRECISION.tar.gz, to be paired with the CPU record's
#   cells as the TF32 check was (uci.repeated_cells). Done for "high" on an H200 (packs/h200-2026-11-28-b):
#   worse than the CPU's float32 cells (paired, 7 of 7 splits, p = 0.02 RMSE, 0.006 MNLL), as TF32 was: on
#   an NVIDIA GPU, XLA computes "high" with TF32 products;
#   BOOTENS_DATA_DIR (default: .bootens_cache/uci-data, carried to the machine)
set -u
commit=${1:?usage: bash results/paper/device.sh COMMIT [window arguments...]}
shift
window_s=${WINDOW_S:-530}; processes=${PROCESSES:-6}; bench_s=${BENCH_S:-60}; precision_s=${PRECISION_S:-0}
precision=${PRECISION:-high}
out=${OUT:-bootens-out/window}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 BOOTENS_GIT_COMMIT=$commit
export BOOTENS_DATA_DIR=${BOOTENS_DATA_DIR:-$PWD/.bootens_cache/uci-data} BOOTENS_CACHE_DIR=${BOOTENS_CACHE_DIR:-$PWD/.bootens_cache}
py=${PYTHON:-python}
start=$(date +%s)
if [ "$bench_s" -gt 0 ]; then
  # the L-BFGS direction in compact form (the default) and optax's two-loop recursion, a row each
  timeout "$bench_s" $py -m bootens_core.repro.cli bench --case uci-dataset --datasets kin8nm --models 1 4 \
      --lbfgs-directions compact two-loop --repeats 3 --out "$out" > "$out/bench.log" 2>&1
fi
# what is left of the window, less 45 s for the last cell running over its estimate and the packing
budget=$(( window_s - ($(date +%s) - start) - 45 ))
if [ "$budget" -lt 10 ]; then
  echo "device.sh: no time left for cells ($budget s)" | tee "$out/window.log"; exit 0
fi
work=$(mktemp -d)
if [ "$precision_s" -gt 0 ]; then
  JAX_DEFAULT_MATMUL_PRECISION=$precision XLA_PYTHON_CLIENT_MEM_FRACTION=0.1 timeout "$precision_s" \
      $py -m bootens_core.repro.cli run uci --profile paper --quiet --datasets yacht --methods ensemble-1 \
      --set max_splits=7 --time-budget $(( precision_s - 30 )) --pack "$out/$precision.tar.gz" \
      > "$out/$precision.log" 2>&1 &
fi
$py -m bootens_core.repro.experiments.uci.window --budget "$budget" --processes "$processes" --out "$work" "$@" \
    2>&1 | tee "$out/window.log"
wait
cp "$work/window.tar" "$out/window.tar"
ls -la "$out"
