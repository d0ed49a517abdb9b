#!/usr/bin/env bash
# GPU machine: ncu's full section set (occupancy, memory throughput, warp stall reasons) for one
# decode-step instance of each hot kernel of the all-resident 30b-a3b preset. Binaries:
# .carry/bin.tar.xz; KERNELS is an ncu -k regex.
set -u
. bench/device-env.sh
gen_30b
timeout 300 ncu --clock-control none --set full -k "regex:${KERNELS:-k_attn_dec|k_moe_gate_up|k_moe_down_direct|mmv_kernel}" \
    --launch-skip ${NCU_SKIP:-1200} --launch-count ${NCU_COUNT:-6} "$B/strata" bench -m $M --device cuda --graph \
    -p 64 -n 8 --bw-gib 0.5 --tg random >"$OUT/ncu-full.txt" 2>&1
echo "ncu rc=$?"
grep -E "^  [a-zA-Z_].*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|L1/TEX Hit|L2 Hit|Compute \(SM\) Th|Elapsed Cycles|SM Frequency" "$OUT/ncu-full.txt" | head -150
