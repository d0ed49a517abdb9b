#!/usr/bin/env bash
# GPU machine: the GPU cache's prediction (--residency gpu --graph --prefetch) as it was and with
# its listings on a stream of their own (STRATA_PF_LIST) and its router in the layer's launch
# (STRATA_ROUTE2), against the copy cache and the GPU's cache without prediction, on W1-real
# (bench/heldout.py's odd texts, steady decode: 256 greedy tokens after 512) at BUDGETS
# (default 1G 2G), each configuration ROUNDS times (default 2) in turn; then at 2 GiB a residency
# profile (warmed up on the even texts) restored under the GPU's cache with prediction. First
# TESTS from .carry/bin unless SKIP_TESTS=1. Results in $OUT/predict.txt.
set -u
. bench/device-env.sh
R=$OUT/predict.txt
export STRATA_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$R"
run_tests "${TESTS:-test_cuda_matmul test_cuda_devcache test_cuda_residency test_cuda_backend}" "matrices in one call|prefetch"
w1_setup
keep="^(pp|tg)[0-9]|^cache |^prefetch |error"
F=(-m $W1 -f /tmp/eval.txt --tg greedy --bw-gib 0.25 -p 512 -n 256)
for b in ${BUDGETS:-1G 2G}; do
    for round in $(seq ${ROUNDS:-2}); do
        bench_env X=1 "${F[@]}" --vram-budget $b --placement stream
        bench_env X=1 "${F[@]}" --vram-budget $b --residency gpu --graph
        bench_env STRATA_PF_LIST=0,STRATA_ROUTE2=0 "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch
        bench_env STRATA_ROUTE2=0 "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch
        bench_env X=1 "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch
    done
done
P=/tmp/w1-2G.profile
"$B/strata" profile warmup -m $W1 --vram-budget 2G --prompts /tmp/warm.txt --separator '<|sep|>' \
    --max-tokens 256 --decode 32 -o $P 2>&1 | grep -E "replaying|texts" | tail -2 | tee -a "$R"
bench_env X=1 "${F[@]}" --vram-budget 2G --residency gpu --graph --profile $P
bench_env X=1 "${F[@]}" --vram-budget 2G --residency gpu --graph --profile $P --prefetch
bench_env X=1 "${F[@]}" --vram-budget 2G --placement stream
