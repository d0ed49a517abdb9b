#!/usr/bin/env bash
# GPU machine: test_cuda_matmul again (graph replay compared on outputs only), then the
# all-resident 30b-a3b Q4_K_M bench with the HBM floor. Binaries: .carry/bin.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
B=$PWD/.carry/bin
"$B/test_cuda_matmul" >"$OUT/test_cuda_matmul.log" 2>&1; echo "test_cuda_matmul rc=$?"
grep -E "FAIL|failed|graph" "$OUT/test_cuda_matmul.log" | head -8
"$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o /dev/shm/30b.gguf 2>&1 | tail -1
"$B/strata" bench -m /dev/shm/30b.gguf --device cuda -p 512 -n 128 2>&1 | tee "$OUT/bench-30b-cuda.txt"
