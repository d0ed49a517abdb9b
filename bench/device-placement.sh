#!/usr/bin/env bash
# GPU machine: decode of the 30b-a3b preset under VRAM budgets in every placement that can be
# asked for (copy, zerocopy --graph, hybrid, and auto when the build has it), all resident
# as the ceiling, and CPU-only decode at several thread counts; full outputs in $OUT.
#   BUDGETS (default "12G 8G 4G"), MODES (default "copy zc hybrid"), THREADS (default "8 12 16")
set -u
. bench/device-env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name|NUMA node\(s\))"
gen_30b
for g in --no-graph --graph; do
    echo "### resident $g"
    "$B/strata" bench -m $M --device cuda $g -p 512 -n 128 --bw-gib 0.5 --tg random >"$OUT/res$g.txt" 2>&1
    grep -E "^(pp|tg)[0-9]" "$OUT/res$g.txt"
done
for b in ${BUDGETS:-12G 8G 4G}; do
    for mode in ${MODES:-copy zc hybrid}; do
        case $mode in
        copy) f="--residency copy" ;;
        zc) f="--residency zerocopy --graph" ;;
        hybrid) f="--placement hybrid" ;;
        auto) f="" ;;
        esac
        echo "### $b $mode"
        timeout 150 "$B/strata" bench -m $M --vram-budget $b $f -p 512 -n 128 --bw-gib 0.5 --tg random \
            >"$OUT/$b-$mode.txt" 2>&1
        echo "rc=$?"
        grep -E "^(pp|tg)[0-9]|hit|auto|placement|lanes" "$OUT/$b-$mode.txt" | head -14
    done
done
for t in ${THREADS:-8 12 16 def}; do
    echo "### cpu -t $t"
    timeout 120 "$B/strata" bench -m $M --device cpu $([ $t = def ] || echo -t $t) -p 64 -n 32 --bw-gib 0.5 --tg random >"$OUT/cpu-$t.txt" 2>&1
    grep -E "^(pp|tg)[0-9]|floor|threads" "$OUT/cpu-$t.txt" | head -6
done
