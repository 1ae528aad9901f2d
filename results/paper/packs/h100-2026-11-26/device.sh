#!/usr/bin/env bash
# One device call: the GPU list of results/paper/README.md step 5, then a 1-layer ensemble window.
# usage: bash device.sh COMMIT TF32_S FANIN_S DEFAULT_S TAG   (seconds are each window's --time-budget; 0 skips)
set -u
export PYTHONUNBUFFERED=1 BOOTENS_DATA_DIR=$PWD/.bootens_cache/uci-data BOOTENS_CACHE_DIR=$PWD/.bootens_cache \
       BOOTENS_GIT_COMMIT=$1
tag=$5
run="python -m bootens_core.repro.cli run uci --profile paper --quiet --cell-times results/paper/uci results/paper/uci-mcd-sghmc"
{ nvidia-smi -L; python -c 'import jax; print(jax.__version__, jax.devices())'; } > $OUT/env-$tag.txt 2>&1
# (a) the TF32 check: Yacht's 1-layer splits 0-6 again, now in float32 products (no --skip-recorded on purpose)
[ "$2" -gt 0 ] && $run --datasets yacht --methods ensemble-1 --set max_splits=7 --time-budget $2 \
    --pack $OUT/tf32-$tag.tar.gz > $OUT/tf32-$tag.log 2>&1
# (b) the 4-layer ensembles with the N(0, 1/fan-in) weight prior, a record of their own
[ "$3" -gt 0 ] && $run --datasets yacht boston energy concrete --methods ensemble-4 \
    --set network.scale_by_fan_in=true --time-budget $3 --pack $OUT/fanin-$tag.tar.gz > $OUT/fanin-$tag.log 2>&1
# (c) the paper's 1-layer ensembles, passing over the cells the committed records hold
[ "$4" -gt 0 ] && $run --methods ensemble-1 --time-budget $4 --skip-recorded results/paper/uci results/paper/uci-mcd-sghmc \
    --pack $OUT/cells-$tag.tar.gz > $OUT/cells-$tag.log 2>&1
ls -la $OUT
