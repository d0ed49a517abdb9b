#!/usr/bin/env bash
# GPU machine: strata and llama.cpp's llama-bench side by side in one lease on one file, the
# 30b-a3b q4_k_m preset (`strata gen --preset 30b-a3b --quant q4_k_m`, in tmpfs):
#   all resident: strata bench --no-graph and its default (graph decode); llama-bench -ngl 99;
#   under each of BUDGETS (default "12G 8G 4G"): strata bench --vram-budget with each of MODES
#   (default "auto hybrid zc gpu": the default placement, the hybrid CPU lane, zero-copy misses
#   in a graph, the GPU's own cache in a graph; gpupf: the same with --prefetch; lane: that
#   cache with its misses computed by the CPU lane inside the graph), llama-bench with
#   --n-cpu-moe NCMOE_<budget> (defaults 22, 33 and 44: the split that fits 12, 8 and 4 GiB),
#   its peak device memory read by nvidia-smi every 0.2 s;
#   with CPU=1, the CPU alone: strata with its default threads, llama-bench -ngl 0 -t 12,16
#   with the GPU hidden.
# strata runs -p 512 -n 128 --tg random (--bw-gib 0.5); llama-bench -fa on -p 512 -n 128 -r 2
# -t 16 (as bench/cuda-resident.md's earlier side-by-side). llama-bench comes from
# .carry/llama.tar.xz (bench/llama-build.sh), strata from .carry/bin.tar.xz. Results: $OUT/side.txt.
set -u
. bench/device-env.sh
R=$OUT/side.txt
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$R"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$R"
llama_setup >>"$R"
gen_30b
sb() { # $1: label, the rest: strata bench flags
    local lab=$1
    shift
    echo "### strata [$lab] $*" | tee -a "$R"
    timeout 150 "$B/strata" bench -m $M "$@" -p 512 -n 128 --bw-gib 0.5 --tg random \
        >"$OUT/sb-$lab.txt" 2>&1
    echo "rc=$?" | tee -a "$R"
    grep -E "^(pp|tg)[0-9]|hit rate|placement auto|^lanes|^prefetch" "$OUT/sb-$lab.txt" | head -14 |
        tee -a "$R"
}
lb() { # $1: label, the rest: llama-bench flags
    local lab=$1
    shift
    echo "### llama-bench [$lab] $*" | tee -a "$R"
    (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done) \
        >"$OUT/mem.txt" 2>/dev/null &
    local mp=$!
    timeout 240 "$LB" -m $M "$@" >"$OUT/lb-$lab.txt" 2>&1
    echo "rc=$?" | tee -a "$R"
    kill $mp
    grep -E "^\|" "$OUT/lb-$lab.txt" | tee -a "$R"
    grep -iE "error|fail|cannot|undefined" "$OUT/lb-$lab.txt" | head -5 | tee -a "$R"
    echo "peak device memory $(sort -n "$OUT/mem.txt" | tail -1) MiB" | tee -a "$R"
}
fl=(-fa on -p 512 -n 128 -r 2 -t 16)
if [ -n "${RESIDENT-1}" ]; then # RESIDENT= leaves the all-resident runs out
    sb resident --device cuda --no-graph
    sb resident-default --device cuda
    lb resident -ngl 99 "${fl[@]}"
fi
for b in ${BUDGETS:-12G 8G 4G}; do
    for mode in ${MODES:-auto hybrid zc gpu}; do
        case $mode in
        auto) f=(--placement auto) ;;
        hybrid) f=(--placement hybrid) ;;
        zc) f=(--residency zerocopy --graph) ;;
        gpu) f=(--residency gpu --graph) ;;
        gpupf) f=(--residency gpu --graph --prefetch) ;;
        lane) f=(--residency gpu --placement hybrid) ;;
        esac
        sb "$b-$mode" --vram-budget "$b" "${f[@]}"
    done
    v=NCMOE_$b
    n=${!v:-$(case $b in 12G) echo 22 ;; 8G) echo 33 ;; *) echo 44 ;; esac)}
    lb "$b" -ngl 99 -ncmoe "$n" "${fl[@]}"
done
if [ -n "${CPU:-}" ]; then
    sb cpu --device cpu
    echo "### CUDA_VISIBLE_DEVICES= llama-bench -ngl 0 -p 64 -n 64 -r 2 -t 12,16" | tee -a "$R"
    CUDA_VISIBLE_DEVICES='' timeout 300 "$LB" -m $M -ngl 0 -p 64 -n 64 -r 2 -t 12,16 \
        >"$OUT/lb-cpu.txt" 2>&1
    echo "rc=$?" | tee -a "$R"
    grep -E "^\|" "$OUT/lb-cpu.txt" | tee -a "$R"
fi
true
