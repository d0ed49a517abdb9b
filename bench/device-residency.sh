#!/usr/bin/env bash
# GPU machine: the GPU tests, then 30b-a3b Q4_K_M decode/prefill all-resident and
# under --vram-budget 4/8/12 GiB with both ways of serving misses (copy, zerocopy); with
# INFLATED=path also the inflated trained model. Binaries: .carry/bin.tar.xz (stripped).
# Switches: SKIP_TESTS=1, SANITIZE=1 (memcheck of SANITIZE_TESTS), VERBOSE=1 (per-layer
# tables), GRAPH=1 (also all-resident with --graph), PREFETCH/STATIC/HYBRID/ADMIT/GATHER=1
# (those variants per budget; ADMIT = hybrid with STRATA_HYBRID_ADMIT=1, which only builds
# before 44d94b9 read: admission is on since), NCU=1 (ncu
# per-kernel times of decode), BUDGETS="..." / IBUDGETS="..." (an empty list skips those
# benches). Everything at once took 7.2 minutes at b97543e (bench/runs.md).
set -u
. bench/device-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ -n "${SKIP_TESTS:-}" ] || for t in test_cuda_gather test_cuda_residency test_cuda_backend test_cuda_moe test_cuda_ops test_cuda_matmul; do
    [ -x "$B/$t" ] || continue
    STRATA_TEST_VERBOSE=${VERBOSE:-} "$B/$t" >/tmp/$t.log 2>&1; echo "$t rc=$?" | tee -a "$OUT/tests.log"
    cat /tmp/$t.log >>"$OUT/tests.log"
    grep -E "FAIL|failed|bit-identical|DIFFER|budget" /tmp/$t.log | head -24
done
# the shipped default model on the GPU (--device auto picks it) against the CPU, greedy
if [ -z "${SKIP_TESTS:-}" ]; then
    for d in cuda cpu; do
        "$B/strata" run -m models/strata-default.gguf --device $d -p "def fibonacci(n):" -n 48 \
            --temp 0 >/tmp/default-$d.txt 2>/tmp/default-$d.err; echo "default model on $d rc=$?"
    done
    cmp -s /tmp/default-cuda.txt /tmp/default-cpu.txt && echo "default model: cuda and cpu greedy text identical" \
        || { echo "default model: cuda and cpu differ:"; cat /tmp/default-cuda.txt; echo; cat /tmp/default-cpu.txt; }
    tail -1 /tmp/default-cuda.err
fi
gen_30b
R="$OUT/bench-residency.txt"
: >"$R"
run() { echo "### strata bench $*" | tee -a "$R"; timeout 150 "$B/strata" bench "$@" 2>&1 | grep -vE "^(model|host read|model read|first token|bytes/token)" | tee -a "$R"; }
# random weights: decode feeds random ids (greedy output repeats, and so would the routing)
run -m $M --device cuda -p 512 -n 128 --bw-gib 0.5 --tg random
[ -n "${GRAPH:-}" ] && run -m $M --device cuda --graph -p 512 -n 128 --bw-gib 0.5 --tg random
[ -n "${GRAPH:-}" ] && for b in ${BUDGETS-4G 8G 12G}; do run -m $M --vram-budget $b --residency zerocopy --graph -p 512 -n 128 --bw-gib 0.5 --tg random; done
for b in ${BUDGETS-4G 8G 12G}; do
    for mode in ${MODES:-copy zerocopy}; do
        run -m $M --vram-budget $b --residency $mode -p 512 -n 128 --bw-gib 0.5 --tg random
    done
    [ -n "${PREFETCH:-}" ] && run -m $M --vram-budget $b --prefetch -p 512 -n 128 --bw-gib 0.5 --tg random
    # llama.cpp's --n-cpu-moe placement in the same binary: the smallest N that fits
    [ -n "${STATIC:-}" ] && run -m $M --vram-budget $b --placement static -p 512 -n 128 --bw-gib 0.5 --tg random
    [ -n "${HYBRID:-}" ] && run -m $M --vram-budget $b --placement hybrid -p 512 -n 128 --bw-gib 0.5 --tg random
    # the opt-in admission of CPU-lane misses when PCIe is idle (bench/hybrid.md)
    [ -n "${ADMIT:-}" ] && STRATA_HYBRID_ADMIT=1 run -m $M --vram-budget $b --placement hybrid -p 512 -n 128 --bw-gib 0.5 --tg random
    [ -n "${GATHER:-}" ] && run -m $M --vram-budget $b --streaming kernel -p 512 -n 128 --bw-gib 0.5 --tg random
done
# per-kernel GPU time of all-resident decode (ncu, one metric; prefill and load skipped)
if [ -n "${NCU:-}" ] && command -v ncu >/dev/null; then
    for g in ${NCU_MODES:-plain --graph}; do
        [ "$g" = plain ] && g=
        ncu_decode "$OUT/ncu$g.txt" $g
    done
fi
if [ -n "${SANITIZE:-}" ] && command -v compute-sanitizer >/dev/null; then
    for t in ${SANITIZE_TESTS:-test_cuda_residency}; do
        timeout 300 compute-sanitizer --tool memcheck "$B/$t" >"$OUT/memcheck-$t.log" 2>&1
        echo "memcheck $t rc=$?"; tail -3 "$OUT/memcheck-$t.log"
    done
fi
if [ -n "${INFLATED:-}" ]; then
    I=/dev/shm/inflated.gguf
    "$B/strata" gen --inflate "$INFLATED" --preset 30b-a3b -o $I 2>&1 | tail -2
    # the trained routing: a real text prompt (PROMPT), decode greedy
    P=(-f "${PROMPT:-tests/data/routing-prompts.txt}" --tg greedy)
    run -m $I --device cuda -p 512 -n 128 --bw-gib 0.5 "${P[@]}"
    for b in ${IBUDGETS-2G 4G}; do
        for mode in copy zerocopy; do
            run -m $I --vram-budget $b --residency $mode -p 512 -n 128 --bw-gib 0.5 "${P[@]}" --stats-json "$OUT/stats-inflated-$b-$mode.json"
        done
        [ -n "${PREFETCH:-}" ] && run -m $I --vram-budget $b --prefetch -p 512 -n 128 --bw-gib 0.5 "${P[@]}"
        [ -n "${STATIC:-}" ] && run -m $I --vram-budget $b --placement static -p 512 -n 128 --bw-gib 0.5 "${P[@]}"
        [ -n "${HYBRID:-}" ] && run -m $I --vram-budget $b --placement hybrid -p 512 -n 128 --bw-gib 0.5 "${P[@]}"
    done
fi
