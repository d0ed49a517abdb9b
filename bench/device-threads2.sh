#!/usr/bin/env bash
# GPU machine: pp512/tg128 of 30b-a3b Q4_K_M on the CPU with bound threads (the best settings
# of device-threads.sh), 10, 12 and 14 threads. Binary: .carry/bin/strata (stripped).
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
B=$PWD/.carry/bin
"$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o /dev/shm/30b.gguf 2>&1 | tail -1
for t in 10 12 14; do
  echo "== OMP_WAIT_POLICY=active OMP_PROC_BIND=close OMP_PLACES=cores strata bench -m 30b.gguf -t $t -p 512 -n 128"
  OMP_WAIT_POLICY=active OMP_PROC_BIND=close OMP_PLACES=cores \
    "$B/strata" bench -m /dev/shm/30b.gguf -t $t -p 512 -n 128 2>&1 | tee "$OUT/bench-bound-t$t.txt" | grep -E "host|pp|tg|floor"
done
