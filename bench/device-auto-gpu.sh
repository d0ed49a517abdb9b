#!/usr/bin/env bash
# GPU machine: the default placement (auto, which now times the GPU's own cache too) against the
# fixed modes. W1-real (the shipped model inflated to the 30b-a3b shapes, bench/heldout.py's odd
# texts, 256 greedy tokens after 512) at W1_BUDGETS (default 2G 1G): auto, gpu --graph, gpu
# --graph --prefetch, copy (--placement stream); then unless SKIP_30B=1 the 30b-a3b preset
# (random weights and decode ids, -p 512 -n 128) at P30B_BUDGETS (default 8G 4G): auto, gpu
# --graph, hybrid. The auto runs' decisions (stderr) are kept. Results in $OUT/auto-gpu.txt.
set -u
. bench/device-env.sh
R=$OUT/auto-gpu.txt
w1_setup
keep="^(pp|tg)[0-9]|^cache |^prefetch |^placement|error|placement auto: [a-z].* per step"
BENCH_TIMEOUT=120
F=(-m $W1 -f /tmp/eval.txt --tg greedy --bw-gib 0.25 -p 512 -n 256)
for b in ${W1_BUDGETS:-2G 1G}; do
    bench_keep "${F[@]}" --vram-budget $b
    bench_keep "${F[@]}" --vram-budget $b --residency gpu --graph
    bench_keep "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch
    bench_keep "${F[@]}" --vram-budget $b --placement stream
done
if [ -z "${SKIP_30B:-}" ]; then
    gen_30b
    for b in ${P30B_BUDGETS:-8G 4G}; do
        G=(-m $M -p 512 -n 128 --tg random --bw-gib 0.5 --vram-budget $b)
        bench_keep "${G[@]}"
        bench_keep "${G[@]}" --residency gpu --graph
        bench_keep "${G[@]}" --placement hybrid
    done
fi
