#!/usr/bin/env bash
# GPU machine: CPU decode of 30b-a3b Q4_K_M with the weights in the page cache (mmap of a
# tmpfs file) and copied to anonymous huge pages (--no-mmap), at 16, 12 and 8 threads.
# Reads the stripped strata binary from .carry/bin.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
B=$PWD/.carry/bin
"$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o /dev/shm/30b.gguf 2>&1 | tail -1
for t in 16 12 8; do
  for mode in --no-mmap ""; do
    echo "== strata bench -m 30b.gguf -t $t -p 128 -n 64 $mode"
    "$B/strata" bench -m /dev/shm/30b.gguf -t $t -p 128 -n 64 $mode 2>&1 |
      tee "$OUT/nommap-t$t${mode:+-nommap}.txt" | grep -E "host|weights  |pp|tg|floor"
  done
done
