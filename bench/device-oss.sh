#!/usr/bin/env bash
# GPU machine: gpt-oss decode and prefill, a base build (.carry/base) against the build under
# test (.carry/bin), both unpacked from .carry/bin.tar.xz (scripts/device-pack.sh), and
# llama.cpp's llama-bench (.carry/llama.tar.xz, made by bench/llama-build.sh: llama-bench
# built for sm_90 with flash attention, and a stand-in libnccl.so.2 for its multi-GPU
# reductions, which one GPU never calls) on the same files. Sections, each on when its variable is set:
#   TESTS="test_cuda_ops ..."  those tests from .carry/bin (they stop nothing);
#   S20B=1   the 20b preset (MXFP4 experts, the rest Q8_0) in tmpfs: pp512 / tg128 all resident,
#            eager and --graph, base and new; with NCU=1 ncu's per-kernel times over graph
#            decode steps of the new build;
#   S120B=1  the 120b preset: all resident (base, new; not with SKIP_RES=1), then under each
#            of BUDGETS (default "16G 8G") each of PLACES (default "hybrid static stream"; also
#            auto, and zc: zero-copy misses in a graph), new (and base for hybrid);
#   LLAMA=1  llama-bench -fa on -p 512 -n 128 -r 2 -t 16 on the 20b and 120b files: all layers
#            on the GPU, and the 120b with --n-cpu-moe at each of NCMOE (default
#            "27 28 29 32 33"), the peak device memory of each run read by nvidia-smi every
#            0.2 s;
#   CPU=1    the 30b-a3b q4_k_m preset on the CPU alone, -p 64 -n 64: strata with its default
#            threads and with 12, and with LCPU=1 llama-bench -ngl 0 at 12 and 16 threads
#            with the GPU hidden;
#   P30B=1   the 30b-a3b q4_k_m preset all resident: strata (--graph) and llama-bench.
# The files stay in tmpfs with KEEP=1 (a later call on the same machine skips their
# generation). Results: $OUT/oss.txt; logs packed in $OUT/logs.tar.
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
for t in ${TESTS:-}; do
    s=$(date +%s)
    (cd tests && timeout 300 "$B/$t" >"$L/$t.log" 2>&1)
    echo "$t rc=$? ($(($(date +%s) - s)) s)" | tee -a "$R"
    grep -E "FAIL" "$L/$t.log" | head -20 | tee -a "$R"
done
keep="^(pp|tg)[0-9]|floor|hit rate|^cache|^pcie|^cpu lane|^lanes|^placement|^strata: (expert cache|static|hybrid|auto)"
sb() { # $1: label, $2: binary folder, $3: file, the rest: flags
    local lab=$1 bin=$2 f=$3
    shift 3
    [ -x "$bin/strata" ] || return 0
    echo "### [$lab] strata bench -m $(basename "$f") $* -p 512 -n 128" | tee -a "$R"
    timeout 200 "$bin/strata" bench -m "$f" "$@" -p 512 -n 128 --bw-gib 1 >"$L/sb.log" 2>&1
    echo "rc=$?" >>"$L/sb.log"
    grep -E "$keep|rc=|rror" "$L/sb.log" | tee -a "$R"
}
gen() { # $1: file, the rest: strata gen flags
    local f=$1 s
    shift
    s=$(date +%s)
    [ -f "$f" ] || "$B/strata" gen "$@" -q -o "$f" 2>&1 | tail -1
    echo "$(basename "$f") ready in $(($(date +%s) - s)) s" | tee -a "$R"
}
G20=/dev/shm/oss-20b.gguf
G120=/dev/shm/oss-120b.gguf
if [ -n "${S20B:-}" ]; then
    gen $G20 --arch gpt-oss --preset 20b --quant q8_0
    for g in --no-graph --graph; do
        sb base "$BASE" $G20 --device cuda $g
        sb new "$B" $G20 --device cuda $g
    done
    if [ -n "${NCU:-}" ]; then
        timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip "${NCU_SKIP:-1500}" \
            --launch-count "${NCU_COUNT:-600}" --print-summary per-kernel "$B/strata" bench -m $G20 --device cuda \
            --graph -p 64 -n 16 --bw-gib 0.5 --tg random >"$L/ncu-20b.txt" 2>&1
        echo "ncu rc=$?" | tee -a "$R"
        python3 bench/ncu-summary.py "$L/ncu-20b.txt" | sort -rn | head -30 | tee -a "$R"
    fi
fi
if [ -n "${S120B:-}" ]; then
    gen $G120 --arch gpt-oss --preset 120b --quant q8_0
    if [ -z "${SKIP_RES:-}" ]; then
        sb base "$BASE" $G120 --device cuda
        sb new "$B" $G120 --device cuda
    fi
    for b in ${BUDGETS:-16G 8G}; do
        for p in ${PLACES:-hybrid static stream}; do
            case $p in
            zc) fl=(--residency zerocopy --graph) ;;
            *) fl=(--placement "$p") ;;
            esac
            [ "$p" = hybrid ] && sb base "$BASE" $G120 --vram-budget "$b" "${fl[@]}"
            sb new "$B" $G120 --vram-budget $b "${fl[@]}"
        done
    done
fi
lb() { # $1: file, the rest: llama-bench flags
    local f=$1
    shift
    echo "### llama-bench -m $(basename "$f") $*" | tee -a "$R"
    (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done) >"$L/mem.txt" 2>/dev/null &
    local mp=$!
    timeout 240 "$LB" -m "$f" "$@" >"$L/llama.log" 2>&1
    echo "rc=$?" | tee -a "$R"
    kill $mp
    grep -E "^\|" "$L/llama.log" | tee -a "$R"
    grep -iE "error|fail|cannot|undefined" "$L/llama.log" | head -5 | tee -a "$R"
    echo "peak device memory $(sort -n "$L/mem.txt" | tail -1) MiB" | tee -a "$R"
}
if [ -n "${LLAMA:-}${LCPU:-}" ]; then
    llama_setup >>"$R"
fi
fl=(-fa on -p 512 -n 128 -r 2 -t 16)
if [ -n "${LLAMA:-}" ]; then
    gen $G20 --arch gpt-oss --preset 20b --quant q8_0
    lb $G20 -ngl 99 "${fl[@]}"
    gen $G120 --arch gpt-oss --preset 120b --quant q8_0
    lb $G120 -ngl 99 "${fl[@]}"
    for n in ${NCMOE:-27 28 29 32 33}; do
        lb $G120 -ngl 99 -ncmoe $n "${fl[@]}"
    done
fi
if [ -n "${CPU:-}" ]; then # the 30b-a3b preset on the CPU alone: strata and llama.cpp (GPU hidden)
    gen_30b
    for t in "" 12; do
        echo "### [new] strata bench -m 30b.gguf ${t:+-t $t} -p 64 -n 64" | tee -a "$R"
        timeout 200 "$B/strata" bench -m $M ${t:+-t $t} -p 64 -n 64 >"$L/cpu.log" 2>&1
        grep -E "^(pp|tg)[0-9]|^floor|^backend|threads" "$L/cpu.log" | tee -a "$R"
    done
    if [ -n "${LCPU:-}" ]; then
        echo "### CUDA_VISIBLE_DEVICES= llama-bench -m 30b.gguf -ngl 0 -p 64 -n 64 -r 2 -t 12,16" | tee -a "$R"
        CUDA_VISIBLE_DEVICES='' timeout 300 "$LB" -m $M -ngl 0 -p 64 -n 64 -r 2 -t 12,16 >"$L/llama-cpu.log" 2>&1
        echo "rc=$?" | tee -a "$R"
        grep -E "^\|" "$L/llama-cpu.log" | tee -a "$R"
    fi
fi
if [ -n "${P30B:-}" ]; then
    gen_30b
    sb new "$B" $M --device cuda --graph
    [ -n "${LLAMA:-}" ] && lb $M -ngl 99 "${fl[@]}"
    [ -n "${KEEP:-}" ] || rm -f $M
fi
[ -n "${KEEP:-}" ] || rm -f $G20 $G120
true
