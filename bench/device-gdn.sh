#!/usr/bin/env bash
# GPU machine: the chunked delta rule against the recurrent one. About 5 minutes:
#   1. test_cuda_ssm: both forms against the CPU op, and each form's time at qwen3next-80b's
#      head shape (16-512 tokens in one call); then, unless SKIP_TESTS=1, test_cuda_backend and
#      test_cuda_spec when packed;
#   2. unless SKIP_HF=1, tests/hf/compare_qwen3next.py on CUDA (config A's 40- and 90-token
#      prompts take the chunked form);
#   3. the qwen3next 80b-a3b and qwen35moe 35b-a3b presets at q4_k_m (ARCH_LAYERS layers,
#      default all) in tmpfs, all resident: strata bench pp512 / tg128 with the build in
#      .carry/base (the recurrent form only) and the one in .carry/bin, alternating, ROUNDS
#      rounds (default 2).
# Results: $OUT/gdn.txt; logs packed in $OUT/logs.tar.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
export PYTHONUNBUFFERED=1
L=$OUT/logs
mkdir -p "$L"
trap 'tar -cf "$OUT/logs.tar" -C "$OUT" logs && rm -rf "$L"' EXIT
R=$OUT/gdn.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R"
(cd tests && timeout 120 "$B/test_cuda_ssm" >"$L/test_cuda_ssm.log" 2>&1)
echo "test_cuda_ssm rc=$?" | tee -a "$R"
grep -E "^gdn|FAIL" "$L/test_cuda_ssm.log" | tee -a "$R"
for t in test_cuda_backend test_cuda_spec; do
    [ -x "$B/$t" ] && [ -z "${SKIP_TESTS:-}" ] || continue
    (cd tests && timeout 200 "$B/$t" >"$L/$t.log" 2>&1)
    echo "$t rc=$?" | tee -a "$R"
    grep -E "qwen3|FAIL" "$L/$t.log" | tee -a "$R"
done
if [ -z "${SKIP_HF:-}" ]; then
    timeout 200 python3 tests/hf/compare_qwen3next.py --strata "$B/strata" --out "$L/hf-qwen3next" \
        --device cuda --threads 16 --strata-devices cuda >"$L/hf-qwen3next.log" 2>&1
    echo "compare_qwen3next rc=$?" | tee -a "$R"
    grep -E "^\|" "$L/hf-qwen3next.log" | tee -a "$R"
    tail -3 "$L/hf-qwen3next.log" | tee -a "$R"
fi
for am in "qwen3next 80b-a3b" "qwen35moe 35b-a3b"; do
    set -- $am
    Q=/dev/shm/$1.gguf
    "$B/strata" gen --arch $1 --preset $2 --quant q4_k_m ${ARCH_LAYERS:+--layers $ARCH_LAYERS} \
        -q -o $Q 2>&1 | tail -1
    for r in $(seq "${ROUNDS:-2}"); do
        for bin in base bin; do
            echo "### $bin: strata bench -m $1-$2 --device cuda -p 512 -n 128 (round $r)" | tee -a "$R"
            timeout 150 ".carry/$bin/strata" bench -m $Q --device cuda -p 512 -n 128 --bw-gib 1 \
                >"$L/bench-$1-$bin-$r.txt" 2>&1
            grep -E "^(pp|tg)[0-9]|^floor" "$L/bench-$1-$bin-$r.txt" | tee -a "$R"
        done
    done
    rm -f $Q
done
