#!/usr/bin/env bash
# GPU machine's CPU: where CPU-only decode of the 30b-a3b preset goes at THREADS (default "12
# 16"): each run's time per op (`--op-times`) and the processors' user, system, idle and steal
# time from /proc/stat around it (steal: time the hypervisor ran something else on a vCPU that
# wanted to run), for each binary of .carry/bin in BINS (default strata), ROUNDS rounds
# (default 1), THREADS may name auto (no -t: the timed default); then matvec throughput by `strata bench-kernels` at the same thread counts on
# a large (256 MiB) and a layer-sized (4 MiB) matrix (KTHREADS, default "12 16"; empty: none).
# TRACE=1 adds STRATA_MOE_TRACE=1 (the experts' phases per thread); BINDS (default "free
# bound") the thread placements (bound: OMP_PROC_BIND=close, OMP_PLACES=cores). Results in $OUT/cpu-diag.txt, the full
# outputs in $OUT/cpu-diag-logs.tar.
set -u
. bench/device-env.sh
bench_budget cpu-diag 400
gen_30b
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(|L3"; grep -o -w 'amx_[a-z0-9]*\|avx512_vnni' /proc/cpuinfo | sort | uniq -c; } | tee -a "$R"
ticks() { awk '/^cpu /{print $2 + $3, $4, $5, $9}' /proc/stat; }
keep="^(pp|tg)[0-9]|floor|host read|threads|^strata: threads|expert_ffn trace|^  (entered|x conv|gate/up|h conv|down|added|returned)"
KEEP_N=30
for round in $(seq ${ROUNDS:-1}); do
    for bin in ${BINS:-strata}; do
        for t in ${THREADS:-12 16}; do
            for place in ${BINDS:-free bound}; do
                left || break
                bind=
                [ $place = bound ] && bind=OMP_PROC_BIND=close,OMP_PLACES=cores
                lab=$bin-t$t${bind:+-bound}-r$round
                tf=(-t $t)
                [ $t = auto ] && tf=()
                a=($(ticks))
                bin=$bin bench_one "$lab" "${bind:-X=1}${TRACE:+,STRATA_MOE_TRACE=1}" -m $M --device cpu "${tf[@]}" -p 16 -n ${NGEN:-32} --op-times
                b=($(ticks))
                echo "ticks (1/100 s over all vCPUs): user $((b[0] - a[0])) system $((b[1] - a[1])) idle $((b[2] - a[2])) steal $((b[3] - a[3]))" | tee -a "$R"
                sed -n '/profile of decode/,/^  read/p' "$OUT/b-$lab.txt" | grep -E "op |matmul|moe_ffn|attention" | tee -a "$R"
            done
        done
    done
done
for t in ${KTHREADS-12 16}; do
    for mib in 256 4; do
        left || break
        echo "### bench-kernels --threads $t --mib $mib" | tee -a "$R"
        timeout 120 "$B/strata" bench-kernels --threads $t --types q4_k,q6_k,q8_0 --mib $mib --seconds 0.5 2>&1 | tail -8 | tee -a "$R"
    done
done
