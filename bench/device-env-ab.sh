#!/usr/bin/env bash
# GPU machine: settings of one build compared in one lease. ENVS: the settings, spaces between
# them, commas between the variables of one (e.g. "STRATA_EARLY=3 STRATA_EARLY=11"). Under each
# setting (or of TEST_ENVS where given): the CUDA tests named in TESTS, then (unless LOGITS=0)
# the md5 of greedy logits on the 30b-a3b preset, eager and --graph (settings that change only
# scheduling must print the same sums); then
# bench/device-bulk.sh over ENVS (ROUNDS, NS, WHERE, PS as there).
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
for e in ${TEST_ENVS:-$ENVS}; do
    for t in ${TESTS:-}; do
        (cd tests && env ${e//,/ } timeout 200 "$B/$t" >"$OUT/$t-${e//[=,]/-}.log" 2>&1)
        echo "$e $t rc=$?"
        grep -E "FAIL" "$OUT/$t-${e//[=,]/-}.log" | head -20
    done
done
gen_30b
for e in $ENVS; do
    [ "${LOGITS:-1}" = 0 ] && break
    for g in "" --graph; do
        env ${e//,/ } "$B/strata" logits -m $M --device cuda $g --ids 1,2,3,4,5,6,7 --greedy 40 \
            -o /tmp/l.bin >/dev/null 2>&1
        echo "$e logits$g $(md5sum </tmp/l.bin | cut -c1-32)"
    done
done
TESTS= bash bench/device-bulk.sh
exit 0
