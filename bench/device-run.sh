#!/usr/bin/env bash
# GPU machine: the CPU tests, strata info, the tokenizer check against Hugging Face
# tokenizers, CPU matvec bandwidth, and CPU decode of the 30b-a3b Q4_K_M preset against its
# floor. Logs go to $OUT (or ./device-out).
# Needs: .carry/bin (strata + test binaries, stripped), tests/data/npm/tokenizer-qwen3,
# tests/data/npm/tokenizer-deepseek_v3.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
B=$PWD/.carry/bin
export STRATA_TEST_DATA=$PWD/tests/data OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
T0=$(date +%s)
step() { echo "== $(($(date +%s) - T0))s: $*"; }

step machine
{ date -u; nproc; grep -m1 "model name" /proc/cpuinfo; free -g; nvidia-smi -L; } >"$OUT/machine.txt" 2>&1
"$B/strata" info >>"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

step tests
for t in "$B"/test_*; do
  "$t" >"$OUT/test-$(basename "$t").log" 2>&1
  echo "$(basename "$t") rc=$?"
done | tee "$OUT/tests.txt"

step tokenizer vs Hugging Face
python3 tools/tokref/hf_check.py \
  tests/data/npm/tokenizer-qwen3/models/tokenizer.json tests/data/tokenizer/qwen3-expected.jsonl \
  tests/data/npm/tokenizer-deepseek_v3/models/tokenizer.json tests/data/tokenizer/deepseek_v3-expected.jsonl \
  2>&1 | tee "$OUT/tokenizer-hf.txt" | tail -5

step bench-kernels
"$B/strata" bench-kernels --threads 16 --types q4_k,q8_0,q6_k --seconds 0.5 2>&1 | tee "$OUT/bench-kernels.txt" | tail -12

step gen 30b-a3b q4_k_m
dir=/dev/shm
[ "$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)" -gt 24 ] || dir=/tmp
"$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o $dir/30b.gguf 2>&1 | tee "$OUT/gen-30b.txt"

step bench 30b-a3b on 16 threads
"$B/strata" bench -m $dir/30b.gguf -t 16 -p 512 -n 128 2>&1 | tee "$OUT/bench-30b-cpu.txt"
step bench 30b-a3b on 12 threads
"$B/strata" bench -m $dir/30b.gguf -t 12 -p 128 -n 64 2>&1 | tee "$OUT/bench-30b-cpu-t12.txt"
step done
