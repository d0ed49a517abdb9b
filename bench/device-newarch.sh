#!/usr/bin/env bash
# GPU machine: the architectures whose CUDA path has not yet been run on a GPU (gpt-oss,
# qwen3next), benchmarked there once their GPU tests pass (STRATA_CUDA_UNVERIFIED=1 lets the
# engine take them to the GPU). About 8 minutes:
#   1. test_cuda_ssm and test_cuda_backend (the hybrid and gpt-oss cases); a failure stops here;
#   2. the qwen3next 80b-a3b preset at q4_k_m (ARCH_LAYERS layers, default all 48: 52.6 GB) in
#      tmpfs: strata bench pp512 / tg128 all resident, then under --vram-budget 8G and 16G with
#      the stream, hybrid and static placements (hit rate, floor);
#   3. unless SKIP_OSS=1, gpt-oss 120b at its MXFP4 mix the same way at 16G, and 20b resident.
# Results: $OUT/bench-newarch.txt.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for t in test_cuda_ssm test_cuda_backend; do
    (cd tests && timeout 300 "$B/$t" >"$OUT/$t.log" 2>&1)
    rc=$?
    echo "$t rc=$rc"
    grep -E "FAIL|rel err|max rel" "$OUT/$t.log" | head -40
    [ $rc = 0 ] || exit 1
done
export STRATA_CUDA_UNVERIFIED=1
R="$OUT/bench-newarch.txt"
bench() { # $1: file, the rest: placement flags
    local f=$1
    shift
    echo "### strata bench -m $(basename "$f") $* -p 512 -n 128" | tee -a "$R"
    timeout 150 "$B/strata" bench -m "$f" "$@" -p 512 -n 128 --bw-gib 1 2>&1 | grep -v "^gen" |
        tail -n 25 | tee -a "$R"
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
bench $G --vram-budget 16G --placement hybrid
bench $G --vram-budget 16G --placement static
rm -f $G
G=/dev/shm/oss-20b.gguf
"$B/strata" gen --arch gpt-oss --preset 20b --quant q8_0 -q -o $G 2>&1 | tail -1
bench $G --device cuda
rm -f $G
