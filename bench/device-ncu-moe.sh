#!/usr/bin/env bash
# GPU machine: ncu on the prefill MoE kernels (8-bit tensor cores, prep, combine) and the F32
# router tiles of the 30b-a3b q4_k_m preset. Default: --set full on the first launches of a
# pp512. STALLS=1: instead, for prompts of PS tokens (default "128 512"), the time and the
# average stall reasons per issued instruction of the first launches of the 8-bit tensor-core
# kernels and the prep kernel.
. bench/device-env.sh
gen_30b
if [ -n "${STALLS:-}" ]; then
    for p in ${PS:-128 512}; do
        timeout 200 ncu --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio',gpu__time_duration.sum,sm__inst_issued.avg.pct_of_peak_sustained_active \
            -k regex:"m8|prep_q8" -c 3 "$B/strata" bench -m $M --device cuda -p $p -n 1 --bw-gib 0.5 --tg random >$OUT/ncu-stalls-$p.txt 2>&1
        echo "### p $p rc=$?"
        grep -E "k_moe|gpu__time|inst_issued|stalled" $OUT/ncu-stalls-$p.txt | awk '$NF+0 >= 0.1 || /k_moe|gpu__time|inst_issued/' | head -90
    done
    exit 0
fi
timeout 300 ncu --set full -k regex:"m8|sgemm|prep_q8|combine" -c 5 "$B/strata" bench -m $M --device cuda -p 512 -n 1 --bw-gib 0.5 --tg random > $OUT/ncu-m8.txt 2>&1
echo rc=$?
grep -E "k_moe|sgemm|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issue Slots Busy|L2 Hit|One or More Eligible|No Eligible" $OUT/ncu-m8.txt | head -120
