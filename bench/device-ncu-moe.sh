#!/usr/bin/env bash
# GPU machine: ncu --set full on the first launches of the prefill MoE kernels (8-bit tensor
# cores, prep, combine) and the F32 router tiles of a pp512 on the 30b-a3b q4_k_m preset.
. bench/device-env.sh
gen_30b
timeout 300 ncu --set full -k regex:"m8|sgemm|prep_q8|combine" -c 5 "$B/strata" bench -m $M --device cuda -p 512 -n 1 --bw-gib 0.5 --tg random > $OUT/ncu-m8.txt 2>&1
echo rc=$?
grep -E "k_moe|sgemm|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issue Slots Busy|L2 Hit|One or More Eligible|No Eligible" $OUT/ncu-m8.txt | head -120
