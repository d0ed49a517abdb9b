#!/usr/bin/env bash
# GPU machine: gpt-oss and qwen3next / qwen35moe against transformers and benchmarked. About
# 9 minutes:
#   1. unless SKIP_TESTS=1, test_cuda_ssm and test_cuda_backend (the hybrid and gpt-oss cases);
#      a failure stops here;
#   2. unless SKIP_HF=1, tests/hf/compare_qwen3next.py (strata on HF_DEVICES_Q3N, default cuda,
#      and the CI references) and compare_gptoss.py (strata on the CPU and CUDA, and its CI
#      reference); the references come back packed in $OUT/ci-refs.tar;
#   3. the qwen3next 80b-a3b preset at q4_k_m (ARCH_LAYERS layers, default all 48: 52.6 GB) in
#      tmpfs: strata bench pp512 / tg128 all resident, then under --vram-budget 8G and 16G with
#      the stream, hybrid and static placements (hit rate, floor);
#   4. unless SKIP_OSS=1, gpt-oss 120b at its MXFP4 mix all resident and under 16G and 8G
#      (hybrid, static), and 20b all resident.
# Results: $OUT/bench-newarch.txt; every log packed in $OUT/logs.tar at the end.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
L=$OUT/logs
mkdir -p "$L"
trap 'tar -cf "$OUT/logs.tar" -C "$OUT" logs && rm -rf "$L"' EXIT
if [ -z "${SKIP_TESTS:-}" ]; then
    for t in test_cuda_ssm test_cuda_backend; do
        (cd tests && timeout 300 "$B/$t" >"$L/$t.log" 2>&1)
        rc=$?
        echo "$t rc=$rc"
        grep -E "FAIL" "$L/$t.log" | head -40
        [ $rc = 0 ] || exit 1
    done
fi
if [ -z "${SKIP_HF:-}" ]; then
    timeout 200 python3 tests/hf/compare_qwen3next.py --strata "$B/strata" --out "$L/hf-qwen3next" \
        --device cuda --threads 16 --strata-devices "${HF_DEVICES_Q3N:-cuda}" >"$L/hf-qwen3next.log" 2>&1
    echo "compare_qwen3next rc=$?"
    grep -E "^\|" "$L/hf-qwen3next.log" | grep -v " yes |" | head -20
    timeout 200 python3 tests/hf/compare_gptoss.py --strata "$B/strata" --out "$L/hf-gptoss" \
        --device cuda --threads 16 --strata-devices cpu,cuda >"$L/hf-gptoss.log" 2>&1
    echo "compare_gptoss rc=$?"
    grep -E "^\|" "$L/hf-gptoss.log" | grep -v " yes |" | head -20
    tail -3 "$L/hf-gptoss.log"
    (cd "$L" && tar -cf "$OUT/ci-refs.tar" hf-qwen3next/ci-ref-* hf-gptoss/ci-ref-*)
fi
R="$OUT/bench-newarch.txt"
bench() { # $1: file, the rest: placement flags
    local f=$1
    shift
    echo "### strata bench -m $(basename "$f") $* -p 512 -n 128" | tee -a "$R"
    timeout 150 "$B/strata" bench -m "$f" "$@" -p 512 -n 128 --bw-gib 1 2>&1 | grep -v "^gen" |
        tail -n 25 >>"$R"
    grep -E "^(pp|tg)[0-9]|floor|hit rate" "$R" | tail -4
}
rm -f /dev/shm/w1.gguf /dev/shm/30b.gguf
Q=/dev/shm/q3n-80b.gguf
[ -f $Q ] || "$B/strata" gen --arch qwen3next --preset 80b-a3b --quant q4_k_m \
    ${ARCH_LAYERS:+--layers $ARCH_LAYERS} -q -o $Q 2>&1 | tail -1
bench $Q --device cuda
for v in 8G 16G; do
    for p in stream hybrid static; do
        bench $Q --vram-budget $v --placement $p
    done
done
rm -f $Q
[ -n "${SKIP_OSS:-}" ] && exit 0
G=/dev/shm/oss-120b.gguf
"$B/strata" gen --arch gpt-oss --preset 120b --quant q8_0 -q -o $G 2>&1 | tail -1
bench $G --device cuda
for v in 16G 8G; do
    for p in hybrid static; do
        bench $G --vram-budget $v --placement $p
    done
done
rm -f $G
G=/dev/shm/oss-20b.gguf
"$B/strata" gen --arch gpt-oss --preset 20b --quant q8_0 -q -o $G 2>&1 | tail -1
bench $G --device cuda
rm -f $G
