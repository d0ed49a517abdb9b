#!/usr/bin/env bash
# GPU machine: all-resident decode of the 30b-a3b preset, two builds side by side in one lease:
# .carry/bin.tar.xz holding base/strata (the reference build) beside bin/ (the build
# under test, with the CUDA tests named in TESTS). Prints pp512/tg128 eager and with --graph
# for both (BUILDS: other folders of builds in .carry, e.g. a third, mid/; ROUNDS of them; ENVS:
# environment settings each build runs under, e.g. "X=1 STRATA_CUDA_PDL=0"),
# (OFFLOAD=1) 8 and 12 GiB budgets, (LOCKSTEP=1) lockstep decode of NS streams, then (NCU=1) ncu's per-kernel decode
# times for both (bench/ncu-summary.py).
set -u
. bench/device-env.sh
# (bin.tar.xz may hold base/ beside bin/)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
for t in ${TESTS:-}; do
    "$B/$t" >"$OUT/$t.log" 2>&1; echo "$t rc=$?"
    grep -E "FAIL|failed" "$OUT/$t.log" | head -5
done
gen_30b
for round in $(seq ${ROUNDS:-2}); do
    for bin in ${BUILDS:-.carry/base .carry/bin}; do
        for e in ${ENVS:-X=1}; do # ENVS: environment settings to compare, e.g. STRATA_CUDA_PDL=0
            for g in --no-graph --graph; do
                echo "### round $round $bin $e bench --device cuda $g"
                env $e "$bin/strata" bench -m $M --device cuda $g -p 512 -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^(pp|tg)"
            done
        done
    done
done
if [ -n "${OFFLOAD:-}" ]; then # under a VRAM budget: host-driven decode (no graph) but zerocopy
    for w in ${OFFLOAD_WHERE:-"--vram-budget 8G" "--vram-budget 8G --placement hybrid"}; do
        for bin in ${BUILDS:-.carry/base .carry/bin}; do
            for e in ${ENVS:-X=1}; do
                echo "### $bin $e bench $w"
                env $e timeout 120 "$bin/strata" bench -m $M $w -p 512 -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^(pp|tg)[0-9]|hit"
            done
        done
    done
fi
if [ -n "${LOCKSTEP:-}" ]; then # aggregate lockstep decode, all resident
    for bin in ${BUILDS:-.carry/base .carry/bin}; do
        for e in ${ENVS:-X=1}; do
            for g in --no-graph --graph; do
                for n in ${NS:-8 16}; do
                    echo "### $bin $e bench $g --streams $n"
                    env $e "$bin/strata" bench -m $M --device cuda $g -p 64 -n 64 --bw-gib 0.1 --streams $n --tg random 2>&1 | grep -E "^(tg|lockstep)"
                done
            done
        done
    done
fi
if [ -n "${NCU:-}" ]; then
    for bin in ${BUILDS:-.carry/base .carry/bin}; do
        B=$PWD/$bin ncu_decode "$OUT/ncu-$(basename $bin).txt" --graph | sort -rn | head -40
    done
fi
