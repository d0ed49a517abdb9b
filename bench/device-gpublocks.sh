#!/usr/bin/env bash
# GPU machine: the GPU's own expert cache (--residency gpu --graph) with its launch's grid at
# STRATA_DEVCACHE_BLOCKS = each of GRIDS (default 264 132 66 33): W1-real (as in
# bench/device-gpucache.sh) at 1 and 2 GiB, and the 30b-a3b preset at 8 GiB. Results in
# $OUT/gpublocks.txt.
set -u
. bench/device-env.sh
R=$OUT/gpublocks.txt
w1_setup
gen_30b
for g in ${GRIDS:-264 132 66 33}; do
    for b in 1G 2G; do
        echo "### STRATA_DEVCACHE_BLOCKS=$g strata bench -m w1.gguf -f eval.txt --tg greedy -p 512 -n 256 --vram-budget $b --residency gpu --graph" | tee -a "$R"
        STRATA_DEVCACHE_BLOCKS=$g timeout 60 "$B/strata" bench -m $W1 -f /tmp/eval.txt --tg greedy \
            --bw-gib 0.25 -p 512 -n 256 --vram-budget $b --residency gpu --graph 2>&1 |
            grep -E "^(pp|tg)[0-9]|^cache " | tee -a "$R"
    done
    echo "### STRATA_DEVCACHE_BLOCKS=$g strata bench -m 30b.gguf -p 512 -n 128 --tg random --vram-budget 8G --residency gpu --graph" | tee -a "$R"
    STRATA_DEVCACHE_BLOCKS=$g timeout 60 "$B/strata" bench -m $M -p 512 -n 128 --tg random \
        --bw-gib 0.5 --vram-budget 8G --residency gpu --graph 2>&1 | grep -E "^(pp|tg)[0-9]|^cache " | tee -a "$R"
done
