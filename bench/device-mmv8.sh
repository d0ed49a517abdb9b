#!/usr/bin/env bash
# GPU machine: the M-row MMV kernels of lockstep steps compared under settings of one build
# (SETS, spaces between them, commas inside one; X=1: none; default "X=1 STRATA_MMV_ROWS=1").
# test_cuda_matmul under each (its checks, then its bench
# lines: GB/s of m = 1 and 8 over 256 MB); test_cuda_batch; ROUNDS rounds (default 2) of the
# 30b-a3b q4_k_m preset all resident, lockstep decode of NS streams (default 8), eager and
# with --graph, each setting in turn; then (NCU=1) ncu's per-kernel time over two eight-stream
# steps per setting and its sections for a window of one (bench/device-ncu-step8.sh). Results
# in $OUT/mmv8.txt.
set -u
. bench/device-env.sh
R=$OUT/mmv8.txt
exec > >(tee -a "$R") 2>&1
export STRATA_TEST_DATA=$PWD/tests/data
SETS=${SETS:-"X=1 STRATA_MMV_ROWS=1"}
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
for e in $SETS; do
    s=$(date +%s)
    (cd tests && env ${e//,/ } timeout 150 "$B/test_cuda_matmul" >"/tmp/mm-$e.log" 2>&1)
    echo "### test_cuda_matmul $e rc=$? ($(($(date +%s) - s)) s)"
    grep -E "FAIL|failed|bench:|m-row|more case|matrices in one call.*m 8" "/tmp/mm-$e.log" | head -40
done
for t in ${TESTS:-test_cuda_batch}; do
    s=$(date +%s)
    (cd tests && timeout 200 "$B/$t" >"/tmp/$t.log" 2>&1)
    echo "### $t rc=$? ($(($(date +%s) - s)) s)"
    grep -E "FAIL|failed|differ|bit" "/tmp/$t.log" | head -20
done
gen_30b
for round in $(seq ${ROUNDS:-2}); do
    for e in $SETS; do
        for g in --no-graph --graph; do
            for n in ${NS:-8}; do
                echo "### round $round $e --streams $n $g"
                env ${e//,/ } timeout 90 "$B/strata" bench -m $M --device cuda $g -p 64 -n 64 \
                    --bw-gib 0.1 --streams $n --tg random 2>&1 | grep -E "^(tg|lockstep)"
            done
        done
    done
done
if [ -n "${NCU:-}" ]; then
    for e in $SETS; do
        echo "### ncu lockstep 8 streams, $e"
        env ${e//,/ } timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum \
            --launch-skip ${LSKIP:-10600} --launch-count ${LCOUNT:-980} --print-summary per-kernel \
            "$B/strata" bench -m $M --device cuda -p 16 -n 8 --bw-gib 0.1 --streams 8 --tg random \
            >/tmp/ncu-sum.txt 2>&1
        python3 bench/ncu-summary.py /tmp/ncu-sum.txt | sort -rn | head -16
    done
    ENVS="X=1" bash bench/device-ncu-step8.sh
fi
