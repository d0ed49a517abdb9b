#!/usr/bin/env bash
# GPU machine: where CPU decode time goes on 30b-a3b Q4_K_M (strata bench --op-times), and the
# effect of OpenMP's wait policy and thread binding. Binary: .carry/bin/strata (stripped).
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
B=$PWD/.carry/bin
"$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o /dev/shm/30b.gguf 2>&1 | tail -1
run() { # name, env..., then bench args
  local name=$1; shift
  echo "== $name: $*"
  env "$@" "$B/strata" bench -m /dev/shm/30b.gguf -p 64 -n 48 --op-times 2>&1 | tee "$OUT/profile-$name.txt" | grep -E "moe_ffn|matmul|attention|rmsnorm|rope|tg|pp|floor|host"
}
run default OMP_NUM_THREADS=16
run active OMP_NUM_THREADS=16 OMP_WAIT_POLICY=active
run bind OMP_NUM_THREADS=16 OMP_WAIT_POLICY=active OMP_PROC_BIND=close OMP_PLACES=cores
run t8 OMP_WAIT_POLICY=active OMP_PROC_BIND=close OMP_PLACES=cores OMP_NUM_THREADS=8
