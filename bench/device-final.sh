#!/usr/bin/env bash
# GPU machine, the check of a final commit in one lease: every test binary in .carry/bin
# (results in $OUT/final.txt, logs in $OUT/final-logs.tar); CPU-only decode of the 30b-a3b
# preset (`-p 64 -n 64`) by each binary of .carry/bin in BINS (default strata) with the
# default (timed) thread count and with -t 16, and in lockstep (CPU_STREAMS streams, default 8,
# -t 16, `-n 32`); then by the last of them with each environment of CPU_ENVS at -t 16
# (default "STRATA_MOE_FLOW=0,STRATA_MATMUL_FINE=0 STRATA_ATTN_HEADS=8"); ROUNDS rounds
# (default 2), interleaved; each binary once after a CPU_LONG-token prompt (default 2048, -t 16,
# `-n 32`: prompt and decode attention over long contexts); llama-bench's CPU decode (-ngl 0,
# the GPU hidden, -t 12,16); then
# bench/device-llama30b.sh (all resident, and BUDGETS with MODES, default "12G 8G 4G" and
# "auto gpu lane", beside llama.cpp; $OUT/side.txt, its outputs in $OUT/side-logs.tar) for
# what is left of BUDGET_S (default 540 s).
# Needs .carry/llama.tar.xz (bench/llama-build.sh). About 9 minutes.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
bench_budget final 540
run_tests "$(cd "$B" && ls test_*)" ""
gen_30b
keep="^(pp|tg)[0-9]|^floor|^host read|^strata: threads|^lockstep"
for round in $(seq ${ROUNDS:-2}); do
    for bin in ${BINS:-strata}; do
        for t in auto 16; do
            tf=(-t $t)
            [ $t = auto ] && tf=()
            bin=$bin bench_one "cpu-$bin-t$t-r$round" X=1 -m $M --device cpu "${tf[@]}" -p 64 -n 64
        done
    done
    # CPU lockstep: CPU_STREAMS streams (default 8) by each binary at 16 threads
    for bin in ${BINS:-strata}; do
        bin=$bin KEEP_N=10 bench_one "cpu-$bin-s${CPU_STREAMS:-8}-r$round" X=1 -m $M --device cpu -t 16 \
            -p 64 -n 32 --streams ${CPU_STREAMS:-8}
    done
    # the last binary with each of CPU_ENVS at 16 threads (default: the CPU decode switches off)
    for e in ${CPU_ENVS:-STRATA_MOE_FLOW=0,STRATA_MATMUL_FINE=0 STRATA_ATTN_HEADS=8}; do
        bin=$bin bench_one "cpu-$bin-t16-${e//[=,]/_}-r$round" "$e" -m $M --device cpu -t 16 -p 64 -n 64
    done
done
# long contexts (CPU_LONG tokens of prompt, default 2048; 0: none): each binary once at 16 threads
if [ "${CPU_LONG:-2048}" -gt 0 ]; then
    for bin in ${BINS:-strata}; do
        bin=$bin bench_one "cpu-$bin-long-t16" X=1 -m $M --device cpu -t 16 -p ${CPU_LONG:-2048} -n 32
    done
fi
llama_setup >>"$R"
echo "### CUDA_VISIBLE_DEVICES= llama-bench -ngl 0 -p 64 -n 64 -r 2 -t 12,16" | tee -a "$R"
CUDA_VISIBLE_DEVICES='' timeout 200 "$LB" -m $M -ngl 0 -p 64 -n 64 -r 2 -t 12,16 >"$OUT/lb-cpu.txt" 2>&1
echo "rc=$?" | tee -a "$R"
grep -E "^\|" "$OUT/lb-cpu.txt" | tee -a "$R"
left && RESIDENT=1 BUDGETS="${BUDGETS:-12G 8G 4G}" MODES="${MODES:-auto gpu lane}" \
    timeout $((${BUDGET_S:-540} - $(date +%s) + t0 + 30)) bash bench/device-llama30b.sh >/dev/null 2>&1
echo "device-llama30b.sh rc=$?" | tee -a "$R"
cd "$OUT" && tar -cf side-logs.tar sb-*.txt lb-*.txt 2>/dev/null && rm -f sb-*.txt lb-*.txt mem.txt
