#!/usr/bin/env bash
# --spec mtp from the command line, on tiny random-weight qwen3next and qwen35moe files with an
# MTP block (strata gen --mtp 1, CPU):
#  1. strata run --spec mtp prints the greedy text strata run prints, and the statistics line
#     (random weights: few drafts are kept); strata chat over two messages gives the same
#     replies with it; strata batch --spec mtp writes the greedy lines strata batch writes, and
#     a sampled line the same text at --streams 1 and 3; strata spec-replay --spec mtp drafts
#     and gives the same numbers on a second run;
#  2. refusals (exit 1, named): a file without an MTP block, a block left unloaded by --no-mtp.
set -uo pipefail
strata=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
strip() { sed 's/,"timings":{[^}]*}//' "$1"; }

for arch in qwen3next qwen35moe; do
    m="$tmp/$arch.gguf"
    "$strata" gen --arch "$arch" --preset tiny --mtp 1 --quant q8_0 -q -o "$m" >/dev/null ||
        fail "gen $arch"
    R=(run -m "$m" --device cpu -t 2 --temp 0 -n 40)
    for p in "def fibonacci(n):" "import os"; do
        "$strata" "${R[@]}" -p "$p" >"$tmp/plain" 2>/dev/null || fail "$arch: run exited $?"
        "$strata" "${R[@]}" -p "$p" --spec mtp --draft-max 4 >"$tmp/spec" 2>"$tmp/err" ||
            fail "$arch: run --spec mtp exited $?: $(cat "$tmp/err")"
        cmp -s "$tmp/plain" "$tmp/spec" || fail "$arch '$p': --spec mtp changed the greedy text"
        grep -q "^speculative: [0-9]* verify passes, [1-9][0-9]* drafted, [0-9]* accepted" "$tmp/err" ||
            fail "$arch: no statistics line: $(cat "$tmp/err")"
        sed -n 's/^speculative: \(.*\)/'"$arch"': \1/p' "$tmp/err" | head -1
    done
    printf 'def add(a, b):\nclass Stack:\n' >"$tmp/msgs"
    C=(chat -m "$m" --device cpu -t 2 --temp 0 -n 16)
    "$strata" "${C[@]}" <"$tmp/msgs" >"$tmp/c0" 2>/dev/null || fail "$arch: chat exited $?"
    "$strata" "${C[@]}" -v --spec mtp <"$tmp/msgs" >"$tmp/c1" 2>"$tmp/err" ||
        fail "$arch: chat --spec mtp exited $?: $(cat "$tmp/err")"
    [ "$(tr -d '\n' <"$tmp/c0")" = "$(tr -d '\n' <"$tmp/c1")" ] || fail "$arch: chat --spec mtp changed the replies"
    [ "$(grep -c "^speculative: [0-9]* verify passes" "$tmp/err")" = 2 ] ||
        fail "$arch: chat --spec mtp: $(grep speculative "$tmp/err")"

    printf '{"prompt":"def fibonacci(n):"}\n{"prompt":"import os"}\n{"prompt":"class Stack:"}\n{"prompt":"for i in range(","temperature":0.8,"seed":3}\n' >"$tmp/in.jsonl"
    B=(batch -m "$m" --device cpu -t 2 --temp 0 -n 24 --input "$tmp/in.jsonl")
    "$strata" "${B[@]}" --streams 3 -o "$tmp/$arch-b0.jsonl" 2>/dev/null || fail "$arch: batch exited $?"
    "$strata" "${B[@]}" --streams 3 --spec mtp -o "$tmp/$arch-b3.jsonl" 2>"$tmp/err" ||
        fail "$arch: batch --spec mtp exited $?: $(cat "$tmp/err")"
    grep -q "speculative: [0-9]* verify passes, [1-9][0-9]* drafted" "$tmp/err" ||
        fail "$arch: batch --spec mtp: no statistics: $(cat "$tmp/err")"
    "$strata" "${B[@]}" --streams 1 --spec mtp -o "$tmp/$arch-b1.jsonl" 2>/dev/null ||
        fail "$arch: batch --spec mtp --streams 1 exited $?"
    [ "$(strip "$tmp/$arch-b0.jsonl" | head -3)" = "$(strip "$tmp/$arch-b3.jsonl" | head -3)" ] ||
        fail "$arch: batch --spec mtp changed greedy lines"
    [ "$(strip "$tmp/$arch-b1.jsonl")" = "$(strip "$tmp/$arch-b3.jsonl")" ] ||
        fail "$arch: batch --spec mtp: --streams 1 and 3 differ"

    for i in 1 2 3; do printf 'for i in range(10):\n    total += values[i]\n'; done >"$tmp/rep.txt"
    "$strata" spec-replay -m "$m" --spec mtp -t 2 -f "$tmp/rep.txt" >"$tmp/r1" 2>&1 ||
        fail "$arch: spec-replay --spec mtp exited $?: $(cat "$tmp/r1")"
    "$strata" spec-replay -m "$m" --spec mtp -t 2 -f "$tmp/rep.txt" >"$tmp/r2" 2>&1
    cmp -s "$tmp/r1" "$tmp/r2" || fail "$arch: spec-replay --spec mtp differs between two runs"
    grep -q "^passes [0-9]*, drafted [1-9][0-9]*, accepted" "$tmp/r1" ||
        fail "$arch: spec-replay --spec mtp drafted nothing: $(cat "$tmp/r1")"
done

"$strata" gen --arch qwen3next --preset tiny --quant q8_0 -q -o "$tmp/plain.gguf" >/dev/null || fail "gen"
"$strata" run -m "$tmp/plain.gguf" --device cpu -t 2 -n 4 -p x --spec mtp >/dev/null 2>"$tmp/err"
[ $? = 1 ] && grep -q "this model has no MTP block" "$tmp/err" || fail "no block: $(cat "$tmp/err")"
"$strata" run -m "$tmp/qwen3next.gguf" --device cpu -t 2 -n 4 -p x --spec mtp --no-mtp >/dev/null 2>"$tmp/err"
[ $? = 1 ] && grep -q "the MTP block was not loaded (--no-mtp)" "$tmp/err" ||
    fail "--no-mtp: $(cat "$tmp/err")"
"$strata" spec-replay -m "$tmp/plain.gguf" --spec mtp -f "$tmp/rep.txt" >/dev/null 2>"$tmp/err"
[ $? = 1 ] && grep -q "this model has no MTP block" "$tmp/err" || fail "spec-replay, no block: $(cat "$tmp/err")"
echo "cli_spec_mtp: ok"
