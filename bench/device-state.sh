#!/usr/bin/env bash
# GPU machine: where the default placement and lockstep decode stand on one build, in one lease
# (30b-a3b q4_k_m preset, `strata bench -p 512 -n 128 --tg random` unless said): the default
# placement at 8 GiB three times with its log, the GPU's cache in a graph alone, all resident;
# --prefetch on the GPU's cache at 8 GiB; then `-p 64 -n 64 --streams N` for N = 1 and 8 all
# resident (eager and --graph) and N = 8 at 8 GiB. Results: $OUT/state.txt.
set -u
. bench/device-env.sh
R=$OUT/state.txt
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$R"
gen_30b
tg_line "resident" --device cuda
for r in 1 2 3; do tg_line "8G auto r$r" --vram-budget 8G; done
tg_line "8G gpu graph" --vram-budget 8G --residency gpu --graph
tg_line "8G gpu graph --prefetch" --vram-budget 8G --residency gpu --graph --prefetch
ls8() { # $1: label, the rest: flags
    local l=$1
    shift
    echo "$l: $(timeout 120 "$B/strata" bench -m $M "$@" -p 64 -n 64 --bw-gib 0.1 --tg random 2>&1 |
        grep -E '^(tg|lockstep |cache )' | tr -s ' ' | tr '\n' ' ')" | tee -a "$R"
}
for w in "--device cuda --no-graph" "--device cuda --graph"; do
    ls8 "streams 1 $w" $w --streams 1
    ls8 "streams 8 $w" $w --streams 8
done
ls8 "streams 8 8G" --vram-budget 8G --streams 8
exit 0
