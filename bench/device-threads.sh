#!/usr/bin/env bash
# GPU machine: CPU decode of 30b-a3b Q4_K_M under thread counts and OpenMP policies.
# Reads the stripped strata binary from .carry/bin.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
B=$PWD/.carry/bin
"$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o /dev/shm/30b.gguf 2>&1 | tail -1
run() { # name, then env assignments
  local name=$1; shift
  echo "== $name: $*"
  env "$@" "$B/strata" bench -m /dev/shm/30b.gguf -p 128 -n 64 2>&1 | tee "$OUT/threads-$name.txt" | grep -E "tg|pp|floor|host"
}
run t16 OMP_NUM_THREADS=16
run t16-bind OMP_NUM_THREADS=16 OMP_PROC_BIND=close OMP_PLACES=cores
run t8-bind OMP_NUM_THREADS=8 OMP_PROC_BIND=close OMP_PLACES=cores
run t8-bind-active OMP_NUM_THREADS=8 OMP_WAIT_POLICY=active OMP_PROC_BIND=close OMP_PLACES=cores
run t12-bind-active OMP_NUM_THREADS=12 OMP_WAIT_POLICY=active OMP_PROC_BIND=close OMP_PLACES=cores
