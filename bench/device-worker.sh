#!/usr/bin/env bash
# GPU machine: the prefetch worker (prefetch/pf_worker.h) against prediction made inside the
# cache's lookup (STRATA_PF_WORKER=0) and after the layer's launch on the caller's thread (1),
# with the copy cache (--placement stream --prefetch) and the plain copy cache, on W1-real
# (bench/heldout.py's odd texts, 256 greedy tokens after 512) at BUDGETS (default 1G 2G), ROUNDS
# rounds (default 2), and --prefetch-top M for each M of TOPS (default "4 2") with the copy cache
# and with the GPU's cache in a graph (beside it without prediction and with all k); then the
# 30b-a3b preset at 8 GiB under hybrid with and without the worker (P30B=1). First TESTS unless
# SKIP_TESTS=1. Results in $OUT/worker.txt.
set -u
. bench/device-env.sh
R=$OUT/worker.txt
export STRATA_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$R"
run_tests "${TESTS:-test_cuda_residency test_cuda_backend test_cuda_batch}" ""
w1_setup
keep="^(pp|tg)[0-9]|^cache |^prefetch |^cpu lane|error"
F=(-m $W1 -f /tmp/eval.txt --tg greedy --bw-gib 0.25 -p 512 -n 256)
for b in ${BUDGETS:-1G 2G}; do
    for round in $(seq ${ROUNDS:-2}); do
        bench_env X=1 "${F[@]}" --vram-budget $b --placement stream
        bench_env STRATA_PF_WORKER=0 "${F[@]}" --vram-budget $b --placement stream --prefetch
        bench_env STRATA_PF_WORKER=1 "${F[@]}" --vram-budget $b --placement stream --prefetch
        bench_env X=1 "${F[@]}" --vram-budget $b --placement stream --prefetch
        for m in ${TOPS:-4 2}; do
            bench_env X=1 "${F[@]}" --vram-budget $b --placement stream --prefetch-top $m
        done
        bench_env X=1 "${F[@]}" --vram-budget $b --residency gpu --graph
        bench_env X=1 "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch
        for m in ${TOPS:-4 2}; do
            bench_env X=1 "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch-top $m
        done
    done
done
if [ -n "${P30B:-}" ]; then
    gen_30b
    G=(-m $M -p 512 -n 128 --tg random --bw-gib 0.5 --vram-budget 8G --placement hybrid)
    bench_env X=1 "${G[@]}"
    bench_env STRATA_PF_WORKER=0 "${G[@]}" --prefetch
    bench_env X=1 "${G[@]}" --prefetch
fi
