#!/usr/bin/env bash
# GPU machine: two builds (or settings) of strata compared in one lease. RUNS: the runs, spaces
# between them, each a binary of .carry/bin with optional environment settings after colons
# (e.g. "strata-base strata strata:STRATA_MOE_Q6W=0"). For each run: TESTS (binaries of
# .carry/bin, the run's settings; a name with the run's suffix, test_cuda_moe-base for
# strata-base, where one exists), then ROUNDS rounds of the 30b-a3b q4_k_m preset all resident:
# tg128 after a PS-token prompt eager and with --graph, lockstep decode of NS streams; then
# (NCU1=1) ncu on the first four 8-bit expert kernels a run launches (one-token calls: the
# bulk path; time, DRAM and L1 throughput, load instructions, stall reasons) and (NCU8=1) on four
# of the eight-row lockstep steps' 8-bit direct expert kernels. Results on stdout and in
# $OUT/two.txt (raw logs stay in /tmp/two: a call returns at most 8 files).
set -u
. bench/device-env.sh
L=/tmp/two
mkdir -p $L
exec > >(tee -a "$OUT/two.txt") 2>&1
export STRATA_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
run_env() { local r=$1; echo "${r#*:}" | grep -q = && echo "${r#*:}" | tr : ' '; }
run_bin() { echo "${1%%:*}"; }
for r in $RUNS; do
    b=$(run_bin "$r")
    sfx=${b#strata}
    for t in ${TESTS:-}; do
        tb=$t$sfx
        [ -x "$B/$tb" ] || tb=$t
        s=$(date +%s)
        (cd tests && env $(run_env "$r") timeout 200 "$B/$tb" >"$L/$tb-${r//[=:]/-}.log" 2>&1)
        echo "### $r $tb rc=$? ($(($(date +%s) - s)) s)"
        grep -E "FAIL|failed|bench:" "$L/$tb-${r//[=:]/-}.log" | head -${TEST_LINES:-30}
    done
done
gen_30b
for round in $(seq ${ROUNDS:-1}); do
    for r in $RUNS; do
        b=$(run_bin "$r")
        for g in --no-graph --graph; do
            echo "### round $round $r --device cuda $g -p ${PS:-512}"
            env $(run_env "$r") "$B/$b" bench -m $M --device cuda $g -p ${PS:-512} -n 128 --bw-gib 0.5 \
                --tg random 2>&1 | grep -E "^(pp|tg)"
        done
        for n in ${NS:-}; do
            echo "### round $round $r --streams $n"
            env $(run_env "$r") "$B/$b" bench -m $M --device cuda -p 64 -n 64 --bw-gib 0.1 --streams $n \
                --tg random 2>&1 | grep -E "^(tg|lockstep)"
        done
    done
done
if [ -n "${NCU1:-}" ]; then
    m=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
    m=$m,l1tex__throughput.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_lg.sum
    m=$m,sm__sass_inst_executed_op_global_ld.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active
    m=$m,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio
    m=$m,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
    m=$m,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
    m=$m,sm__inst_issued.avg.pct_of_peak_sustained_active
    for r in $RUNS; do
        b=$(run_bin "$r")
        for p in 1; do
            echo "### ncu $r -p $p"
            env $(run_env "$r") timeout 120 ncu --metrics $m -k regex:"moe_(down|gate_up)_(q8|b8)" -c 4 \
                "$B/$b" bench -m $M --device cuda -p $p -n 1 --bw-gib 0.1 --tg random >"$L/ncu-$p-${r//[=:]/-}.txt" 2>&1
            grep -E "k_moe|gpu__time|dram__|l1tex|sm__|stalled" "$L/ncu-$p-${r//[=:]/-}.txt" | awk '{ if ($1 ~ /void|k_moe/) print $0; else print $1, $NF }' | head -60
        done
    done
fi
if [ -n "${NCU8:-}" ]; then
    # the 8-bit direct expert kernels of eight-row lockstep steps: past the single stream's
    # 16-token prompt and the eight streams' prompts (about 870 launches of the two kernels)
    for r in $RUNS; do
        b=$(run_bin "$r")
        echo "### ncu lockstep 8 $r"
        env $(run_env "$r") timeout 120 ncu --metrics $m -k regex:"moe_(down|gate_up)_q8" --launch-skip ${NCU8_SKIP:-900} -c 4 \
            "$B/$b" bench -m $M --device cuda -p 16 -n 4 --bw-gib 0.1 --streams 8 --tg random >"$L/ncu8-${r//[=:]/-}.txt" 2>&1
        grep -E "k_moe|gpu__time|dram__|l1tex|sm__|stalled" "$L/ncu8-${r//[=:]/-}.txt" | awk '{ if ($1 ~ /void|k_moe/) print $0; else print $1, $NF }' | head -60
    done
fi
exit 0
