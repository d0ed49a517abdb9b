#!/usr/bin/env bash
# GPU machine: gpt-oss decode and prefill, a base build (.carry/base) against the build under
# test (.carry/bin) in one lease, both from .carry/bin.tar.xz (scripts/device-pack.sh), and
# llama.cpp's llama-bench (.carry/llama/llama-bench, built for sm_90 with flash attention)
# on the same files:
#   1. unless SKIP_TESTS=1, TESTS (default test_cuda_ops test_cuda_backend) from .carry/bin;
#   2. the 20b preset (MXFP4 experts, the rest Q8_0) in tmpfs: pp512 / tg128 all resident, eager
#      and --graph, base and new; with NCU=1 ncu's per-kernel times over graph decode steps;
#   3. unless SKIP_120B=1, the 120b preset: all resident (base, new), and under each of BUDGETS
#      (default 16G) hybrid (base, new) and static (new); with LLAMA=1 llama-bench on the same
#      file all resident and with --n-cpu-moe at each of NCMOE (default "27 28 29 30"), the peak
#      device memory of each read by nvidia-smi every 0.2 s.
# Results: $OUT/oss.txt; logs packed in $OUT/logs.tar.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
R=$OUT/oss.txt
L=$OUT/logs
mkdir -p "$L"
trap 'tar -cf "$OUT/logs.tar" -C "$OUT" logs && rm -rf "$L"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$R"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$R"
BASE=$PWD/.carry/base
if [ -z "${SKIP_TESTS:-}" ]; then
    for t in ${TESTS-test_cuda_ops test_cuda_backend}; do
        s=$(date +%s)
        (cd tests && timeout 300 "$B/$t" >"$L/$t.log" 2>&1)
        echo "$t rc=$? ($(($(date +%s) - s)) s)" | tee -a "$R"
        grep -E "FAIL" "$L/$t.log" | head -20 | tee -a "$R"
    done
    grep -E "attention head_dim .*(window|sinks)" "$L/test_cuda_ops.log" | tee -a "$R"
fi
keep="^(pp|tg)[0-9]|floor|hit rate|^cache|^pcie|^cpu lane|^lanes|^strata: (expert cache|static|hybrid)"
sb() { # $1: label, $2: binary folder, $3: file, the rest: flags
    local lab=$1 bin=$2 f=$3
    shift 3
    echo "### [$lab] strata bench -m $(basename "$f") $* -p 512 -n 128" | tee -a "$R"
    timeout 200 "$bin/strata" bench -m "$f" "$@" -p 512 -n 128 --bw-gib 1 >"$L/sb.log" 2>&1
    echo "rc=$?" >>"$L/sb.log"
    grep -E "$keep|rc=|rror" "$L/sb.log" | tee -a "$R"
}
G=/dev/shm/oss-20b.gguf
s=$(date +%s)
[ -f $G ] || "$B/strata" gen --arch gpt-oss --preset 20b --quant q8_0 -q -o $G 2>&1 | tail -1
echo "20b ready in $(($(date +%s) - s)) s" | tee -a "$R"
for g in "" --graph; do
    for v in base new; do
        bin=$B
        [ $v = base ] && bin=$BASE
        [ -x "$bin/strata" ] && sb $v "$bin" $G --device cuda $g
    done
done
if [ -n "${NCU:-}" ]; then
    timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip "${NCU_SKIP:-1500}" \
        --launch-count "${NCU_COUNT:-600}" --print-summary per-kernel "$B/strata" bench -m $G --device cuda \
        --graph -p 64 -n 16 --bw-gib 0.5 --tg random >"$L/ncu-20b.txt" 2>&1
    echo "ncu rc=$?" | tee -a "$R"
    python3 bench/ncu-summary.py "$L/ncu-20b.txt" | sort -rn | head -30 | tee -a "$R"
fi
rm -f $G
[ -n "${SKIP_120B:-}" ] && exit 0
G=/dev/shm/oss-120b.gguf
s=$(date +%s)
[ -f $G ] || "$B/strata" gen --arch gpt-oss --preset 120b --quant q8_0 -q -o $G 2>&1 | tail -1
echo "120b ready in $(($(date +%s) - s)) s" | tee -a "$R"
for v in base new; do
    bin=$B
    [ $v = base ] && bin=$BASE
    [ -x "$bin/strata" ] && sb $v "$bin" $G --device cuda
done
for b in ${BUDGETS:-16G}; do
    for v in base new; do
        bin=$B
        [ $v = base ] && bin=$BASE
        [ -x "$bin/strata" ] && sb $v "$bin" $G --vram-budget $b --placement hybrid
    done
    sb new "$B" $G --vram-budget $b --placement static
done
if [ -n "${LLAMA:-}" ]; then
    LB=$PWD/.carry/llama/llama-bench
    [ -f .carry/llama.tar.xz ] && tar -xJf .carry/llama.tar.xz -C .carry
    for n in all ${NCMOE:-27 28 29 30}; do
        fl=(-ngl 99 -fa 1 -p 512 -n 128 -r 2 -t 16)
        [ $n = all ] || fl+=(-ncmoe $n)
        echo "### llama-bench -m $(basename $G) ${fl[*]}" | tee -a "$R"
        (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done) >"$L/mem.txt" 2>/dev/null &
        mp=$!
        timeout 240 "$LB" -m $G "${fl[@]}" >"$L/llama-$n.log" 2>&1
        echo "rc=$?" | tee -a "$R"
        kill $mp
        grep -E "^\|" "$L/llama-$n.log" | tee -a "$R"
        grep -iE "error|fail" "$L/llama-$n.log" | head -5 | tee -a "$R"
        echo "peak device memory $(sort -n "$L/mem.txt" | tail -1) MiB" | tee -a "$R"
    done
fi
rm -f $G
true
