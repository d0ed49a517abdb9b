#!/usr/bin/env bash
# GPU machine: the decode attention's blocks merging in clusters (STRATA_ATTN_CLUSTER=N: up to
# N key tiles per block) against the splits without them (=0), one build, one lease: the CUDA
# tests named in TESTS; the md5 of greedy logits on the 30b-a3b preset, eager and --graph, per
# setting (eager and graph must agree; =0 keeps the bits of the build before); then
# bench/device-bulk.sh: tg128 after 512-token prompts (CLS), --graph after PLONG-token prompts
# (CLS_LONG), lockstep decode of NS streams, and the 8 GiB hybrid placement with
# STRATA_EARLY=0 and the default.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
for t in ${TESTS:-}; do
    (cd tests && timeout 200 "$B/$t" >"$OUT/$t.log" 2>&1)
    echo "$t rc=$?"
    grep -E "FAIL" "$OUT/$t.log" | head -20
done
gen_30b
CLS=${CLS:-"0 2"}
for c in $CLS; do
    for g in "" --graph; do
        STRATA_ATTN_CLUSTER=$c "$B/strata" logits -m $M --device cuda $g --ids 1,2,3,4,5,6,7 \
            --greedy 40 -o /tmp/l.bin >/dev/null 2>&1
        echo "cluster $c logits$g $(md5sum </tmp/l.bin | cut -c1-32)"
    done
done
envs() { for c in "$@"; do printf 'STRATA_ATTN_CLUSTER=%s ' "$c"; done; }
TESTS= ENVS=$(envs $CLS) ROUNDS=${ROUNDS:-1} NS=${NS:-8} bash bench/device-bulk.sh
[ -n "${CLS_LONG:-}" ] && TESTS= NS= ENVS=$(envs $CLS_LONG) PS=${PLONG:-2048} GRAPH_ONLY=1 bash bench/device-bulk.sh
[ -n "${HYBRID:-}" ] && TESTS= NS= ENVS="STRATA_EARLY=0 STRATA_EARLY=3" PS=0 \
    WHERE="--vram-budget 8G --placement hybrid" bash bench/device-bulk.sh
exit 0
