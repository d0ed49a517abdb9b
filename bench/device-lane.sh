#!/usr/bin/env bash
# GPU machine: hybrid under the GPU's own cache (the CPU lane inside the decode graph,
# cuda_lane.h) against the GPU's cache alone and host-driven hybrid, in one lease: the 30b-a3b
# preset under BUDGETS (default "8G 4G") with MODES (default "gpu hybrid lane lane-s5": lane =
# --residency gpu --placement hybrid, lane-sN with STRATA_LANE_CPU_SHARE=0.N, lane-aN with
# STRATA_LANE_ADMIT=N, lane-tN with -t N, lane-spin and hybrid-spin with OMP_WAIT_POLICY=active,
# auto: the default placement, auto-nolane: without the lane's trial; gpu-even, lane-even and
# auto-even with STRATA_DEVCACHE_EVEN=1: even slot shares at the hand-over), and W1-real under
# W1_BUDGETS (default none) with W1_MODES (default "copy gpu lane"); the test binaries named in
# TESTS first (default test_cuda_residency test_cuda_devcache). Results in $OUT/lane.txt and the
# full outputs in $OUT/lane-logs.tar.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
bench_budget lane 500
run_tests "${TESTS-test_cuda_residency test_cuda_devcache}" "GPU cache's graph|test_cuda_devcache:"
keep="^(pp|tg)[0-9]|hit rate|^lanes|hybrid under|prefetch|placement auto|rc="
KEEP_N=16
mode_flags() { # $1: mode -> environment and flags in M_ENV, M_F
    case $1 in
    gpu) M_ENV=X=1 M_F=(--residency gpu --graph) ;;
    gpu-even) M_ENV=STRATA_DEVCACHE_EVEN=1 M_F=(--residency gpu --graph) ;;
    lane-even) M_ENV=STRATA_DEVCACHE_EVEN=1 M_F=(--residency gpu --placement hybrid) ;;
    auto-even) M_ENV=STRATA_DEVCACHE_EVEN=1 M_F=() ;;
    hybrid) M_ENV=X=1 M_F=(--placement hybrid) ;;
    copy) M_ENV=X=1 M_F=(--placement stream) ;;
    auto) M_ENV=X=1 M_F=() ;;
    auto-nolane) M_ENV=STRATA_AUTO_LANE=0 M_F=() ;;
    lane) M_ENV=X=1 M_F=(--residency gpu --placement hybrid) ;;
    lane-s*) M_ENV=STRATA_LANE_CPU_SHARE=0.${1#lane-s} M_F=(--residency gpu --placement hybrid) ;;
    lane-a*) M_ENV=STRATA_LANE_ADMIT=${1#lane-a} M_F=(--residency gpu --placement hybrid) ;;
    lane-spin) M_ENV=OMP_WAIT_POLICY=active M_F=(--residency gpu --placement hybrid) ;;
    lane-t*) M_ENV=X=1 M_F=(--residency gpu --placement hybrid -t ${1#lane-t}) ;;
    hybrid-spin) M_ENV=OMP_WAIT_POLICY=active M_F=(--placement hybrid) ;;
    esac
}
if [ -n "${BUDGETS-8G 4G}" ]; then
    gen_30b
    [ -n "${RESIDENT-1}" ] && bench_one resident X=1 -m $M --device cuda -p 512 -n 128 --tg random
    for b in ${BUDGETS-8G 4G}; do
        for mode in ${MODES:-gpu hybrid lane lane-s5}; do
            mode_flags $mode
            bench_one "$b-$mode" "$M_ENV" -m $M --vram-budget $b -p 512 -n 128 --tg random "${M_F[@]}"
        done
    done
fi
[ -n "${W1_BUDGETS:-}" ] || exit 0
left && w1_setup
for b in $W1_BUDGETS; do
    for mode in ${W1_MODES:-copy gpu lane}; do
        mode_flags $mode
        bench_one "w1-$b-$mode" "$M_ENV" -m $W1 -f /tmp/eval.txt --vram-budget $b -p 512 -n 256 \
            --tg greedy "${M_F[@]}"
    done
done
