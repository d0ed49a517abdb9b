#!/usr/bin/env bash
# GPU machine: the GPU's cache with victims by use count (cuda_devcache.h) against victims by
# recency (STRATA_DEVCACHE_LRU=1) in one lease, and the automatic placement's pick, on the
# 30b-a3b preset under BUDGETS (default "12G 8G 4G"; MODES of auto gpu gpu-lru zc hybrid) and
# W1-real under W1_BUDGETS (default "1G 2G"; W1_MODES of auto gpu gpu-lru zc copy, default
# "gpu gpu-lru copy"); every test binary in .carry/bin first (TESTS: a subset by name).
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
bench_budget lfu 500
run_tests "${TESTS:-$(cd "$B" && ls test_*)}" "test_cuda_devcache:"
gen_30b
keep="^(pp|tg)[0-9]|hit rate|placement auto|^placement"
bench_one resident X=1 -m $M --device cuda -p 512 -n 128 --tg random
for b in ${BUDGETS:-12G 8G 4G}; do
    F=(-m $M --vram-budget $b -p 512 -n 128 --tg random)
    for mode in ${MODES:-auto gpu gpu-lru zc hybrid}; do
        case $mode in
        auto) bench_one "$b-$mode" X=1 "${F[@]}" ;;
        gpu) bench_one "$b-$mode" X=1 "${F[@]}" --residency gpu --graph ;;
        gpu-lru) bench_one "$b-$mode" STRATA_DEVCACHE_LRU=1 "${F[@]}" --residency gpu --graph ;;
        zc) [ $b = 12G ] && bench_one "$b-$mode" X=1 "${F[@]}" --residency zerocopy --graph ;;
        hybrid) [ $b = 12G ] || bench_one "$b-$mode" X=1 "${F[@]}" --placement hybrid ;;
        esac
    done
done
[ -n "${W1_BUDGETS-1G 2G}" ] || exit 0
left && w1_setup
for b in ${W1_BUDGETS-1G 2G}; do
    F=(-m $W1 -f /tmp/eval.txt --vram-budget $b -p 512 -n 256 --tg greedy)
    for mode in ${W1_MODES:-gpu gpu-lru copy}; do
        case $mode in
        auto) bench_one "w1-$b-$mode" X=1 "${F[@]}" ;;
        gpu) bench_one "w1-$b-$mode" X=1 "${F[@]}" --residency gpu --graph ;;
        gpu-lru) bench_one "w1-$b-$mode" STRATA_DEVCACHE_LRU=1 "${F[@]}" --residency gpu --graph ;;
        zc) bench_one "w1-$b-$mode" X=1 "${F[@]}" --residency zerocopy --graph ;;
        copy) bench_one "w1-$b-$mode" X=1 "${F[@]}" --placement stream ;;
        esac
    done
done
