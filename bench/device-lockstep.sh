#!/usr/bin/env bash
# GPU machine: lockstep decode (strata bench --streams N) on W1-real (the shipped model
# inflated to the 30b-a3b preset's shapes) under an 8 GiB budget and all resident: aggregate
# decode tok/s and expert bytes moved per generated token for N = 1, 4, 8 (NS to change).
# Binaries: .carry/bin.tar.xz (scripts/device-pack.sh).
set -u
. bench/device-env.sh
R="$OUT/bench-lockstep.txt"
W1=/dev/shm/w1.gguf
[ -f $W1 ] || "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -o $W1 2>&1 | tail -1
keep="^(tg|cache |lockstep )"
for n in ${NS-1 4 8}; do
    for where in "--vram-budget ${BUDGET:-8G}" "--device cuda"; do
        echo "### strata bench -m W1 $where -p 64 -n 64 --streams $n --tg random" | tee -a "$R"
        timeout 60 "$B/strata" bench -m $W1 $where -p 64 -n 64 --bw-gib 0.1 --streams $n --tg random 2>&1 |
            grep -E "$keep" | tee -a "$R"
    done
done
