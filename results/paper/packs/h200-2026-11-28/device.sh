#!/usr/bin/env bash
# One device call: the paper-scale ensemble cells a CPU cannot reach soon, as several processes sharing the
# one GPU (a paper-scale cell keeps the device 1-3% busy, so processes interleave rather than queue):
#   4 shards of the paper's 1-layer ensemble on Kin8nm (splits 4-9), Naval and Protein,
#   2 shards of the 4-layer ensemble with the fan-in prior on Energy, Wine, Yacht and Boston.
# Each process has its own pack and log; GPU utilisation is sampled every 5 s. Everything is tarred into
# $OUT/window.tar at the end (the machine returns at most 8 files).
# usage: bash device.sh COMMIT BUDGET_S     (each process's --time-budget; it is killed at BUDGET_S + 70)
set -u
export PYTHONUNBUFFERED=1 BOOTENS_DATA_DIR=$PWD/.bootens_cache/uci-data BOOTENS_CACHE_DIR=$PWD/.bootens_cache \
       BOOTENS_GIT_COMMIT=$1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.15
budget=$2
W=/tmp/window; mkdir -p $W
{ nvidia-smi -L; nproc; python -c 'import jax; print(jax.__version__, jax.devices())'; } > $W/env.txt 2>&1
nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used --format=csv -l 5 > $W/smi.csv 2>&1 &
smi=$!
run="timeout $((budget + 70)) python -m bootens_core.repro.cli run uci --profile paper --quiet --time-budget $budget
     --cell-times results/paper/uci results/paper/uci-mcd-sghmc"
for i in 0 1 2 3; do
  $run --datasets kin8nm naval protein --methods ensemble-1 --shard $i/4 \
       --skip-recorded results/paper/uci --pack $W/cells-$i.tar.gz > $W/cells-$i.log 2>&1 &
done
for i in 0 1; do
  $run --datasets energy wine yacht boston --methods ensemble-4 --set network.scale_by_fan_in=true --shard $i/2 \
       --skip-recorded results/paper/uci-fanin --pack $W/fanin-$i.tar.gz > $W/fanin-$i.log 2>&1 &
done
wait $(jobs -p | grep -v "^$smi$")
kill $smi
tar -cf $OUT/window.tar -C $W .
ls -la $W
