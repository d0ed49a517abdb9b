#!/usr/bin/env bash
# GPU machine: settings of one build against each other on all-resident decode, in one lease.
# ENVS: the settings, spaces between them, commas between the variables of one (X=1: none).
# Unless SKIP_TESTS=1, every test binary of .carry/bin first (device-env.sh's run_tests).
# Then under each setting the md5 of greedy logits on the 30b-a3b preset (settings that keep
# the arithmetic must print the same sums), then ROUNDS rounds (default 2) of `strata bench
# --device cuda -p 512 -n 128 --tg random` under each setting in turn (graph steps; with
# EAGER=1 also --no-graph once each), then with NCU=1 ncu's per-kernel times of the default.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
R=$OUT/decode-ab.txt
run_tests "$(cd "$B" && ls test_*)" ""
gen_30b
for e in $ENVS; do
    env ${e//,/ } "$B/strata" logits -m $M --device cuda --ids 1,2,3,4,5,6,7 --greedy 40 \
        -o /tmp/l.bin >/dev/null 2>&1
    echo "$e logits $(md5sum </tmp/l.bin | cut -c1-32)"
    rm -f /tmp/l.bin
done
for r in $(seq 1 ${ROUNDS:-2}); do
    for e in $ENVS; do
        echo "$e round $r: $(env ${e//,/ } timeout 90 "$B/strata" bench -m $M --device cuda \
            -p 512 -n 128 --tg random 2>&1 | grep -E '^tg128' | tr -s ' ')"
    done
done
if [ -n "${EAGER:-}" ]; then
    for e in $ENVS; do
        echo "$e --no-graph: $(env ${e//,/ } timeout 90 "$B/strata" bench -m $M --device cuda \
            --no-graph -p 512 -n 128 --tg random 2>&1 | grep -E '^tg128' | tr -s ' ')"
    done
fi
[ -n "${NCU:-}" ] && NCU_SKIP=3000 NCU_COUNT=600 ncu_decode "$OUT/ncu-sum.txt" | sort -rn | head -24
exit 0
