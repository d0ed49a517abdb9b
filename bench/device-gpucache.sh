#!/usr/bin/env bash
# GPU machine: the GPU's own expert cache (--residency gpu) against the host-driven paths.
# First TESTS (default test_cuda_devcache test_cuda_residency) from .carry/bin, unless
# SKIP_TESTS=1. Then W1-real (the shipped model inflated to the 30b-a3b shapes, bench/heldout.py's
# odd texts; steady decode, 256 greedy tokens after 512) all resident in a graph, and at each of
# BUDGETS (default 1G 2G): copy (--placement stream), gpu, gpu in a graph (alone and with
# --prefetch), and gpu in a graph after a residency profile (warmed up on the even texts),
# alone and with --prefetch; then REPS (default 0) more pairs of copy and gpu in a graph at
# 2 GiB. With P30B=1 also the 30b-a3b preset (random
# weights and decode ids, -p 512 -n 128) at 4 and 8 GiB: copy, hybrid, gpu in a graph with and
# without --prefetch. Results in $OUT/gpucache.txt.
set -u
. bench/device-env.sh
R=$OUT/gpucache.txt
export STRATA_TEST_DATA=$PWD/tests/data
if [ -z "${SKIP_TESTS:-}" ]; then
    for t in ${TESTS:-test_cuda_devcache test_cuda_residency}; do
        s=$(date +%s)
        (cd tests && timeout 250 "$B/$t" >"$OUT/$t.log" 2>&1)
        echo "$t rc=$? ($(($(date +%s) - s)) s)" | tee -a "$R"
        grep -E "FAIL|failed|gpu cache|test_cuda_devcache:" "$OUT/$t.log" | head -8 | tee -a "$R"
    done
fi
w1_setup
keep="^(pp|tg)[0-9]|^cache |^prefetch |^placement|^backend|error|GPU runs"
F=(-m $W1 -f /tmp/eval.txt --tg greedy --bw-gib 0.25 -p 512 -n 256)
bench_keep "${F[@]}" --device cuda --graph
for b in ${BUDGETS:-1G 2G}; do
    bench_keep "${F[@]}" --vram-budget $b --placement stream
    bench_keep "${F[@]}" --vram-budget $b --residency gpu
    bench_keep "${F[@]}" --vram-budget $b --residency gpu --graph
    bench_keep "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch
    P=/tmp/w1-$b.profile
    "$B/strata" profile warmup -m $W1 --vram-budget $b --prompts /tmp/warm.txt --separator '<|sep|>' \
        --max-tokens 256 --decode 32 -o $P 2>&1 | grep -E "replaying|texts" | tail -2 | tee -a "$R"
    bench_keep "${F[@]}" --vram-budget $b --residency gpu --graph --profile $P
    bench_keep "${F[@]}" --vram-budget $b --residency gpu --graph --profile $P --prefetch
done
# the ratio at 2 GiB, copy and gpu in a graph alternated (copy varies most from run to run)
for i in $(seq "${REPS:-0}"); do
    bench_keep "${F[@]}" --vram-budget 2G --placement stream
    bench_keep "${F[@]}" --vram-budget 2G --residency gpu --graph
done
if [ -n "${P30B:-}" ]; then
    gen_30b
    for b in 4G 8G; do
        G=(-m $M -p 512 -n 128 --tg random --bw-gib 0.5 --vram-budget $b)
        bench_keep "${G[@]}" --placement stream
        bench_keep "${G[@]}" --placement hybrid
        bench_keep "${G[@]}" --residency gpu --graph
        bench_keep "${G[@]}" --residency gpu --graph --prefetch
    done
fi
