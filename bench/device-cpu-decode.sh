#!/usr/bin/env bash
# GPU machine: CPU-only pp512/tg128 of the 30b-a3b Q4_K_M preset at 8, 12 and 16 threads,
# each next to the floor from the read bandwidth measured in the same run.
# Reads the stripped strata binary from .carry/bin.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
B=$PWD/.carry/bin
"$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o /dev/shm/30b.gguf 2>&1 | tail -1
for t in 8 12 16; do
  echo "== strata bench -m 30b-a3b-q4_k_m.gguf -t $t -p 512 -n 128"
  "$B/strata" bench -m /dev/shm/30b.gguf -t $t -p 512 -n 128 2>&1 | tee "$OUT/bench-30b-t$t.txt"
done
