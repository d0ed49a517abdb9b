#!/usr/bin/env bash
# GPU machine: the CUDA tests (kernels against the CPU reference, the CUDA backend against
# the CPU backend), compute-sanitizer memcheck on the backend test, then strata run and
# strata bench with --device cuda on the 30b-a3b Q4_K_M preset, all resident.
# Reads the stripped strata and test binaries from .carry/bin.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
B=$PWD/.carry/bin
export STRATA_TEST_DATA=$PWD/tests/data
T0=$(date +%s)
step() { echo "== $(($(date +%s) - T0))s: $*"; }
step cuda tests
for t in "$B"/test_cuda_*; do
  timeout 120 "$t" >"$OUT/$(basename "$t").log" 2>&1
  rc=$?
  echo "$(basename "$t") rc=$rc"
  [ $rc -eq 0 ] || tail -25 "$OUT/$(basename "$t").log"
done
step memcheck
if command -v compute-sanitizer >/dev/null; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_cuda_backend" \
    >"$OUT/memcheck-backend.log" 2>&1
  echo "memcheck test_cuda_backend rc=$?"; tail -3 "$OUT/memcheck-backend.log"
fi
step run tiny on cuda
"$B/strata" gen --preset tiny -q -o /tmp/tiny.gguf && \
  "$B/strata" run -m /tmp/tiny.gguf -p "Once upon a time" -n 24 --temp 0 --device cuda 2>&1 | tail -3
step gen 30b-a3b
"$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o /dev/shm/30b.gguf 2>&1 | tail -1
step bench cuda
timeout 150 "$B/strata" bench -m /dev/shm/30b.gguf --device cuda -p 512 -n 128 2>&1 | tee "$OUT/bench-30b-cuda.txt"
step done
