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
if [ -z "${SKIP_TESTS:-}" ]; then
    for t in ${TESTS:-test_cuda_matmul test_cuda_devcache test_cuda_residency test_cuda_backend}; do
        s=$(date +%s)
        (cd tests && timeout 250 "$B/$t" >"/tmp/$t.log" 2>&1)
        echo "$t rc=$? ($(($(date +%s) - s)) s)" | tee -a "$R"
        grep -E "FAIL|failed|matrices in one call|prefetch" "/tmp/$t.log" | head -20 | tee -a "$R"
    done
fi
w1_setup
keep="^(pp|tg)[0-9]|^cache |^prefetch |error"
# bench_keep under the environment settings $1 (commas between them; X=1: none)
bk() {
    local e=$1
    shift
    echo "### $e bench $*" | tee -a "$R"
    env ${e//,/ } timeout 90 "$B/strata" bench "$@" 2>&1 | grep -E "$keep" | tee -a "$R"
}
F=(-m $W1 -f /tmp/eval.txt --tg greedy --bw-gib 0.25 -p 512 -n 256)
for b in ${BUDGETS:-1G 2G}; do
    for round in $(seq ${ROUNDS:-2}); do
        bk X=1 "${F[@]}" --vram-budget $b --placement stream
        bk X=1 "${F[@]}" --vram-budget $b --residency gpu --graph
        bk STRATA_PF_LIST=0,STRATA_ROUTE2=0 "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch
        bk STRATA_ROUTE2=0 "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch
        bk X=1 "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch
    done
done
P=/tmp/w1-2G.profile
"$B/strata" profile warmup -m $W1 --vram-budget 2G --prompts /tmp/warm.txt --separator '<|sep|>' \
    --max-tokens 256 --decode 32 -o $P 2>&1 | grep -E "replaying|texts" | tail -2 | tee -a "$R"
bk X=1 "${F[@]}" --vram-budget 2G --residency gpu --graph --profile $P
bk X=1 "${F[@]}" --vram-budget 2G --residency gpu --graph --profile $P --prefetch
bk X=1 "${F[@]}" --vram-budget 2G --placement stream
