#!/usr/bin/env bash
# GPU machine: one build against another in one call. NEW binaries in .carry/bin (strata and
# the test_cuda_* programs, from .carry/bin.tar.xz), OLD strata in .carry/old (from
# .carry/old.tar.xz; both packed by scripts/device-pack.sh). Runs:
#   1. every GPU test of NEW;
#   2. logits, byte for byte: the default model and an 8-layer 30b-a3b q4_k_m cut, OLD all
#      resident against NEW in every mode that must be bit-identical to it (all resident,
#      --graph, copy, zerocopy, zerocopy --graph, --prefetch, each at a budget that evicts);
#   3. greedy text and --stats-json of `run`, OLD against NEW, per placement (copy, zerocopy,
#      prefetch, static, hybrid; hybrid also OLD against OLD, since its lane split follows
#      bandwidths measured at open);
#   4. strata bench of the full 30b-a3b q4_k_m, OLD and NEW alternated twice per mode.
# Switches: SKIP_TESTS=1, SKIP_LOGITS=1 (parts 2 and 3), SKIP_BENCH=1, BENCH_MODES (lines of
# extra bench flags), REPS (OLD/NEW pairs per mode, default 2), SWAP=1 (every other pair runs
# NEW first, against an order effect).
set -u
. bench/device-env.sh
[ -f .carry/old.tar.xz ] && tar -xJf .carry/old.tar.xz -C .carry
O=$PWD/.carry/old/strata
N=$B/strata
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$N" --version 2>/dev/null | head -1

if [ -z "${SKIP_TESTS:-}" ]; then
    export STRATA_TEST_DATA=$PWD/tests/data
    for t in "$B"/test_cuda_* "$B"/test_api; do
        n=$(basename "$t")
        "$t" >"$OUT/$n.log" 2>&1
        echo "$n rc=$?"
        grep -E "FAIL|failed|passed" "$OUT/$n.log" | tail -3
    done
    [ -x "$B/simple" ] && { "$B/simple" models/strata-default.gguf "def fibonacci(n):" >"$OUT/simple.txt" 2>&1; echo "examples/simple rc=$? ($(wc -c <"$OUT/simple.txt") bytes)"; }
fi

same() { # same A B WHAT: byte compare two files
    if cmp -s "$1" "$2"; then echo "identical  $3"; else echo "DIFFERENT  $3 ($(cmp "$1" "$2" 2>&1 | head -1))"; fi
}

D=models/strata-default.gguf
C=/dev/shm/c8.gguf
L=/tmp/logits
mkdir -p $L
if [ -z "${SKIP_LOGITS:-}" ]; then
[ -f $C ] || "$N" gen --preset 30b-a3b --layers 8 --quant q4_k_m -q -o $C 2>&1 | tail -1
IDS=$(seq -s, 1 7 448)
"$O" logits -m $D -p "def fibonacci(n):" --greedy 32 --device cuda -o $L/d-old.bin >/dev/null 2>&1
"$N" logits -m $D -p "def fibonacci(n):" --greedy 32 --device cuda -o $L/d-new.bin >/dev/null 2>&1
same $L/d-old.bin $L/d-new.bin "default model, cuda, prompt + 32 greedy"
"$O" logits -m $C --ids "$IDS" --greedy 32 --device cuda -o $L/c-old.bin >/dev/null 2>&1
echo "old 8-layer cut rc=$? ($(stat -c %s $L/c-old.bin 2>/dev/null) bytes)"
i=0
while read -r flags; do
    i=$((i + 1))
    "$N" logits -m $C --ids "$IDS" --greedy 32 --device cuda $flags -o $L/c-$i.bin 2>$L/c-$i.err >/dev/null
    rc=$?
    same $L/c-old.bin $L/c-$i.bin "8-layer cut, new [$flags] rc=$rc"
    grep -E "^strata: (expert cache|--vram)" $L/c-$i.err | head -2
done <<'EOF'

--graph
--vram-budget 2G --residency copy
--vram-budget 2G --residency zerocopy
--vram-budget 2G --residency zerocopy --graph
--vram-budget 2G --prefetch
--vram-budget 2G --streaming kernel
EOF

P="def quicksort(items):"
while read -r flags; do
    for who in old new old2; do
        bin=$N; [ "$who" = new ] || bin=$O
        "$bin" run -m $C $flags --temp 0 -n 48 -p "$P" --stats-json $L/r-$who.json \
            >$L/r-$who.txt 2>$L/r-$who.err
    done
    same $L/r-old.txt $L/r-new.txt "run text, old vs new [$flags]"
    [ -s $L/r-old.json ] && same $L/r-old.json $L/r-new.json "run --stats-json, old vs new [$flags]"
    same $L/r-old.txt $L/r-old2.txt "run text, old vs old [$flags]"
    tail -1 $L/r-new.err
done <<'EOF'
--vram-budget 2G --residency copy
--vram-budget 2G --residency zerocopy
--vram-budget 2G --prefetch
--vram-budget 2G --placement static
--vram-budget 2G --placement static:3
--vram-budget 2G --placement hybrid
EOF
fi

[ -n "${SKIP_BENCH:-}" ] && exit 0
gen_30b
R="$OUT/bench-house.txt"
: >"$R"
bench() { # bench WHO FLAGS...
    local who=$1 bin=$N
    shift
    [ "$who" = old ] && bin=$O
    echo "### $who: strata bench $*" >>"$R"
    timeout 150 "$bin" bench -m $M "$@" -p 512 -n 128 --bw-gib 0.5 --tg random >/tmp/bench.txt 2>&1
    echo "rc=$?" >>/tmp/bench.txt
    cat /tmp/bench.txt >>"$R"
    echo "$who $* | $(grep -E '^(pp|tg)[0-9]' /tmp/bench.txt | tr -s ' ' | tr '\n' ' ')"
}
while read -r flags; do
    [ -n "$flags" ] || continue
    for rep in $(seq ${REPS:-2}); do
        if [ $((rep % 2)) = 0 ] && [ -n "${SWAP:-}" ]; then # SWAP=1: every other pair NEW first
            bench new $flags
            bench old $flags
        else
            bench old $flags
            bench new $flags
        fi
    done
done <<<"${BENCH_MODES:---device cuda --graph
--vram-budget 8G --residency zerocopy
--vram-budget 8G --placement hybrid}"
