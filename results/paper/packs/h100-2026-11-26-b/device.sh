#!/usr/bin/env bash
# One device call: results/paper/README.md step 5 in its order -- the 4-layer ensembles with the fan-in
# prior on the datasets its record lacks, then the paper's 1-layer ensembles the committed records lack,
# then the H200's TF32 cells again in float32 (4-layer ensembles of Boston, Concrete and Yacht).
# usage: bash device.sh COMMIT FANIN_S ONE_S REDO_S TAG   (seconds are each window's --time-budget; 0 skips)
set -u
export PYTHONUNBUFFERED=1 BOOTENS_DATA_DIR=$PWD/.bootens_cache/uci-data BOOTENS_CACHE_DIR=$PWD/.bootens_cache \
       BOOTENS_GIT_COMMIT=$1
tag=$5
run="python -m bootens_core.repro.cli run uci --profile paper --quiet --cell-times results/paper/uci results/paper/uci-mcd-sghmc"
{ nvidia-smi -L; python -c 'import jax; print(jax.__version__, jax.devices())'; } > $OUT/env-$tag.txt 2>&1
# (a) 4 layers, weight prior N(0, 1/fan-in): the datasets after Concrete, smallest cost first by the window's order
[ "$2" -gt 0 ] && $run --datasets yacht boston energy wine --methods ensemble-4 \
    --set network.scale_by_fan_in=true --skip-recorded results/paper/uci-fanin --time-budget $2 \
    --pack $OUT/fanin-$tag.tar.gz > $OUT/fanin-$tag.log 2>&1
# (b) the paper's 1-layer ensembles, passing over the cells the committed records hold
[ "$3" -gt 0 ] && $run --methods ensemble-1 --time-budget $3 --skip-recorded results/paper/uci results/paper/uci-mcd-sghmc \
    --pack $OUT/cells-$tag.tar.gz > $OUT/cells-$tag.log 2>&1
# (c) the H200's TF32 cells in float32: named, so no --skip-recorded (the record holds them, made in TF32)
[ "$4" -gt 0 ] && $run --datasets boston concrete yacht --methods ensemble-4 --time-budget $4 \
    --pack $OUT/redo-$tag.tar.gz > $OUT/redo-$tag.log 2>&1
ls -la $OUT
