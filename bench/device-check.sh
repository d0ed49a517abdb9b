#!/usr/bin/env bash
# GPU machine, the check of a commit: every test binary in .carry/bin (scripts/device-pack.sh
# with the test names; CPU tests packed there run on this machine's CPU, AVX-512 included),
# then unless SKIP_Q3N=1 the qwen3next 80b-a3b preset resident (strata bench pp512 / tg128,
# eager and --graph), then unless SKIP_SERVE=1 bench/device-serve.sh. About 6 minutes. Logs
# come back packed in $OUT/logs.tar; results in $OUT/check.txt and $OUT/serve-load.txt.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
L=$OUT/logs
mkdir -p "$L"
trap 'tar -cf "$OUT/logs.tar" -C "$OUT" logs && rm -rf "$L"' EXIT
R=$OUT/check.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R"
for t in "$B"/test_*; do
    n=$(basename "$t")
    (cd tests && timeout 200 "$t" >"$L/$n.log" 2>&1)
    echo "$n rc=$?" | tee -a "$R"
    grep -E "FAIL" "$L/$n.log" | head -20 | tee -a "$R"
done
if [ -z "${SKIP_Q3N:-}" ]; then
    Q=/dev/shm/q3n-80b.gguf
    "$B/strata" gen --arch qwen3next --preset 80b-a3b --quant q4_k_m -q -o $Q 2>&1 | tail -1
    for g in --no-graph --graph; do
        echo "### strata bench -m q3n-80b.gguf --device cuda $g -p 512 -n 128" | tee -a "$R"
        timeout 150 "$B/strata" bench -m $Q --device cuda $g -p 512 -n 128 --bw-gib 1 \
            >"$L/bench-q3n$g.txt" 2>&1
        grep -E "^(pp|tg)[0-9]|^floor|^bytes|^backend +cuda" "$L/bench-q3n$g.txt" | tee -a "$R"
    done
    rm -f $Q
fi
[ -n "${SKIP_SERVE:-}" ] || bash bench/device-serve.sh
