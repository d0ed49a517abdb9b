#!/usr/bin/env bash
# GPU machine: the bulk 8-bit MoE path against the direct one in one build and one lease
# (ENVS: the environment settings each run takes, commas between the variables of one:
# STRATA_MOE_BULK=0 keeps decode on the direct path, STRATA_MOE_BULK=N takes the bulk path up
# to N tokens):
# the CUDA tests named in TESTS, then the 30b-a3b q4_k_m preset all resident (pp512/tg128
# eager and with --graph), lockstep decode of NS streams, the budgets of WHERE and (NCU=1)
# ncu's per-kernel decode times, (W1REAL=1) W1-real at 2 GiB, copies and the GPU's cache.
# PS: the prompt lengths of the resident runs (default 512); GRAPH_ONLY=1 for prompts past
# 512 runs those with --graph only; PS=0 none.
set -u
. bench/device-env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
for t in ${TESTS:-}; do
    "$B/$t" >"$OUT/$t.log" 2>&1
    echo "$t rc=$?"
    grep -E "FAIL|failed|bench:" "$OUT/$t.log" | head -40
done
gen_30b
ENVS=${ENVS:-"X=1 STRATA_MOE_BULK=0"}
for round in $(seq ${ROUNDS:-1}); do
    for p in ${PS:-512}; do
        [ "$p" = 0 ] && continue # PS=0: no resident runs
        gs='--no-graph --graph'
        [ "$p" -gt 512 ] && [ -n "${GRAPH_ONLY:-}" ] && gs=--graph
        for e in $ENVS; do
            for g in $gs; do
                g=${g//\"/}
                echo "### round $round $e bench --device cuda $g -p $p"
                env ${e//,/ } "$B/strata" bench -m $M --device cuda $g -p $p -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^(pp|tg)"
            done
        done
    done
done
for n in ${NS:-}; do
    for e in $ENVS; do
        echo "### $e bench --device cuda --streams $n"
        env ${e//,/ } "$B/strata" bench -m $M --device cuda -p 64 -n 64 --bw-gib 0.1 --streams $n --tg random 2>&1 | grep -E "^(tg|lockstep)"
    done
done
IFS=, read -ra wheres <<<"${WHERE:-}"
for w in "${wheres[@]}"; do
    for e in $ENVS; do
        echo "### $e bench $w"
        env ${e//,/ } timeout 120 "$B/strata" bench -m $M $w -p 512 -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^(pp|tg)[0-9]|hit"
    done
done
if [ -n "${NCU:-}" ]; then # ncu's per-kernel decode times (graph), each setting of ENVS
    for e in ${NCU_ENVS:-$ENVS}; do
        echo "### ncu $e"
        env ${e//,/ } bash -c ". bench/device-env.sh; ncu_decode $OUT/ncu-${e//[=,]/-}.txt --graph" | sort -rn | head -24
    done
fi
if [ -n "${W1REAL:-}" ]; then # W1-real at 2 GiB: the copy cache and the GPU's cache in a graph
    w1_setup
    F=(-m $W1 -f /tmp/eval.txt --tg greedy --bw-gib 0.25 -p 512 -n 256 --vram-budget 2G)
    for e in $ENVS; do
        for w in "--placement stream" "--residency gpu --graph"; do
            echo "### $e bench W1-real 2G $w"
            env ${e//,/ } timeout 120 "$B/strata" bench "${F[@]}" $w 2>&1 | grep -E "^(pp|tg)[0-9]|^cache"
        done
    done
fi
