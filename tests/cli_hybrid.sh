#!/usr/bin/env bash
# The hybrid Gated DeltaNet architectures from the command line, on generated tiny files
# (qwen3next and qwen35moe at q8_0, CPU):
#  1. strata run greedy prints the same text with --spec ngram and with --spec draft (the model
#     as its own draft: every draft kept), whose verify passes rewind the recurrent state;
#  2. strata chat over two messages with --spec draft gives the replies plain chat gives;
#  3. strata batch writes the same lines at --streams 1 and 3 (lockstep rows of several
#     recurrent streams, slots reused);
#  4. strata bench prints pp and tg on the CPU.
set -uo pipefail
strata=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
strip() { sed 's/,"timings":{[^}]*}//' "$1"; }
for arch in qwen3next qwen35moe; do
    m="$tmp/$arch.gguf"
    "$strata" gen --arch $arch --preset tiny --quant q8_0 -q -o "$m" >/dev/null || fail "gen $arch"
    R=(run -m "$m" --device cpu -t 2 --temp 0 -n 32)
    for p in "def fibonacci(n):" "import os"; do
        "$strata" "${R[@]}" -p "$p" >"$tmp/plain" 2>"$tmp/err" || fail "$arch run: $(cat "$tmp/err")"
        "$strata" "${R[@]}" -p "$p" --spec ngram --draft-max 4 >"$tmp/spec" 2>"$tmp/err" ||
            fail "$arch run --spec ngram: $(cat "$tmp/err")"
        cmp -s "$tmp/plain" "$tmp/spec" || fail "$arch '$p': --spec ngram changed the greedy text"
        "$strata" "${R[@]}" -p "$p" --spec draft -md "$m" --draft-device cpu >"$tmp/spec" \
            2>"$tmp/err" || fail "$arch run --spec draft: $(cat "$tmp/err")"
        cmp -s "$tmp/plain" "$tmp/spec" || fail "$arch '$p': --spec draft changed the greedy text"
        grep -q "^speculative: [0-9]* verify passes, \([0-9]*\) drafted, \1 accepted (100.0%)" \
            "$tmp/err" || fail "$arch, the model as its own draft: $(cat "$tmp/err")"
    done
    printf 'def add(a, b):\nclass Stack:\n' >"$tmp/msgs"
    C=(chat -m "$m" --device cpu -t 2 --temp 0 -n 16)
    "$strata" "${C[@]}" <"$tmp/msgs" >"$tmp/c0" 2>"$tmp/err" || fail "$arch chat: $(cat "$tmp/err")"
    "$strata" "${C[@]}" -v --spec draft -md "$m" --draft-device cpu <"$tmp/msgs" >"$tmp/c1" \
        2>"$tmp/err" || fail "$arch chat --spec draft: $(cat "$tmp/err")"
    [ "$(tr -d '\n' <"$tmp/c0")" = "$(tr -d '\n' <"$tmp/c1")" ] ||
        fail "$arch chat --spec draft changed the replies"
    printf '{"prompt":"def fibonacci(n):"}\n{"prompt":"import os"}\n{"prompt":"class Stack:"}\n{"prompt":"for i in range(","temperature":0.8,"seed":3}\n{"prompt":"x = "}\n' >"$tmp/in.jsonl"
    rm -f "$tmp/b1.jsonl" "$tmp/b3.jsonl"
    B=(batch -m "$m" --device cpu -t 2 --temp 0 -n 16 --input "$tmp/in.jsonl")
    "$strata" "${B[@]}" --streams 1 -o "$tmp/b1.jsonl" 2>"$tmp/err" || fail "$arch batch: $(cat "$tmp/err")"
    "$strata" "${B[@]}" --streams 3 -o "$tmp/b3.jsonl" 2>"$tmp/err" ||
        fail "$arch batch --streams 3: $(cat "$tmp/err")"
    [ "$(strip "$tmp/b1.jsonl")" = "$(strip "$tmp/b3.jsonl")" ] ||
        fail "$arch batch: --streams 1 and 3 differ"
    [ "$(wc -l <"$tmp/b3.jsonl")" = 5 ] || fail "$arch batch: $(wc -l <"$tmp/b3.jsonl") lines"
    "$strata" bench -m "$m" --device cpu -t 2 -p 32 -n 8 --bw-gib 0.25 >"$tmp/bench" 2>&1 ||
        fail "$arch bench: $(cat "$tmp/bench")"
    grep -q "^pp32 " "$tmp/bench" && grep -q "^tg8 " "$tmp/bench" || fail "$arch bench: $(cat "$tmp/bench")"
done
echo "cli_hybrid: ok"
