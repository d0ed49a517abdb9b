#!/usr/bin/env bash
# Speculative decoding from the command line, on the shipped default model (CPU):
#  1. strata run --spec ngram and --spec draft (the model as its own draft: every draft kept)
#     print the same greedy text as strata run (two prompts, one under STRATA_TEST_QUICK=1), and their statistics lines; strata chat over two
#     messages with the model as its own draft: the same replies, every draft kept in both turns
#     (its drafter is given the earlier turn);
#  2. strata spec-replay on a text that repeats itself accepts drafts, and on a text without a
#     repeated pair of tokens drafts nothing; its numbers are the same on a second run;
#  3. strata batch --spec ngram writes the greedy lines strata batch writes without it, and a
#     sampled line the same text at --streams 1 and 3; --spec draft (the model as its own draft)
#     the same greedy lines, every draft kept (100% at each draft position);
#  4. bad options: --spec other, --draft-max without --spec, --draft-max 0, a missing -f,
#     --spec draft without -md, -md without --spec draft: exit 2; a draft model whose
#     vocabulary differs, and --spec mtp on a model without an MTP block: exit 1 naming it
#     (cli_spec_mtp runs --spec mtp).
set -uo pipefail
strata=$1
model="$2/../../models/strata-default.gguf"
[ -r "$model" ] || { echo "skip: no $model"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# Greedy under the shipped file's repeat penalty (general.sampling.penalty_repeat): the verify
# pass applies it row by row, and the draft model drafts with it, so the model as its own
# draft still has every draft kept. Verify passes of 9 rows (D) take the CPU's gemm kernels,
# which give each row one row's bits (cpu_kernels/gemm.h), so near-ties resolve as in plain
# decoding.
R=(run -m "$model" --device cpu -t 2 --temp 0 -n 48)
D=(--spec draft -md "$model" --draft-device cpu --draft-max 8)

prompts=("def fibonacci(n):" "import os")
[ "${STRATA_TEST_QUICK:-}" = 1 ] && prompts=("def fibonacci(n):") # sanitizer builds: one prompt
for p in "${prompts[@]}"; do
    "$strata" "${R[@]}" -p "$p" >"$tmp/plain" 2>/dev/null || fail "run exited $?"
    "$strata" "${R[@]}" -p "$p" --spec ngram --draft-max 6 >"$tmp/spec" 2>"$tmp/err" ||
        fail "run --spec exited $?: $(cat "$tmp/err")"
    cmp -s "$tmp/plain" "$tmp/spec" || fail "'$p': --spec ngram changed the greedy text"
    grep -q "^speculative: [0-9]* verify passes, [0-9]* drafted, [0-9]* accepted" "$tmp/err" ||
        fail "no statistics line: $(cat "$tmp/err")"
    "$strata" "${R[@]}" -p "$p" "${D[@]}" >"$tmp/spec" 2>"$tmp/err" ||
        fail "run --spec draft exited $?: $(cat "$tmp/err")"
    cmp -s "$tmp/plain" "$tmp/spec" || fail "'$p': --spec draft changed the greedy text"
    grep -q "^speculative: [0-9]* verify passes, \([0-9]*\) drafted, \1 accepted (100.0%)" "$tmp/err" ||
        fail "the model as its own draft: $(cat "$tmp/err")"
done
# and without it (--repeat-penalty 1): the plain argmax drafts
"$strata" "${R[@]}" --repeat-penalty 1 -p "def fibonacci(n):" "${D[@]}" >/dev/null 2>"$tmp/err" ||
    fail "run --spec draft --repeat-penalty 1 exited $?"
grep -q "^speculative: [0-9]* verify passes, \([0-9]*\) drafted, \1 accepted (100.0%)" "$tmp/err" ||
    fail "the model as its own draft, no penalty: $(cat "$tmp/err")"
printf 'def add(a, b):\nclass Stack:\n' >"$tmp/msgs"
C=(chat -m "$model" --device cpu -t 2 --temp 0 -n 24)
"$strata" "${C[@]}" <"$tmp/msgs" >"$tmp/c0" 2>/dev/null || fail "chat exited $?"
"$strata" "${C[@]}" -v "${D[@]}" <"$tmp/msgs" >"$tmp/c1" 2>"$tmp/err" ||
    fail "chat --spec draft exited $?: $(cat "$tmp/err")"
# (-v prints the statistics instead of the newline after each reply)
[ "$(tr -d '\n' <"$tmp/c0")" = "$(tr -d '\n' <"$tmp/c1")" ] || fail "chat --spec draft changed the replies"
[ "$(grep -c "^speculative: [0-9]* verify passes, \([0-9]*\) drafted, \1 accepted (100.0%)" "$tmp/err")" = 2 ] ||
    fail "chat --spec draft, the model as its own draft: $(grep speculative "$tmp/err")"
"$strata" gen --preset tiny -q -o "$tmp/tiny.gguf" >/dev/null || fail "gen"
"$strata" "${R[@]}" -p x --spec draft -md "$tmp/tiny.gguf" >/dev/null 2>"$tmp/err"
[ $? = 1 ] && grep -q "vocabulary" "$tmp/err" || fail "a foreign draft model: $(cat "$tmp/err")"

for i in 1 2 3 4 5 6; do printf 'for i in range(10):\n    total += values[i] * weights[i]\n'; done >"$tmp/rep.txt"
"$strata" spec-replay -m "$model" --spec ngram -f "$tmp/rep.txt" >"$tmp/r1" 2>&1 || fail "spec-replay exited $?"
"$strata" spec-replay -m "$model" --spec ngram -f "$tmp/rep.txt" >"$tmp/r2" 2>&1
cmp -s "$tmp/r1" "$tmp/r2" || fail "spec-replay differs between two runs"
acc=$(sed -n 's/^passes [0-9]*, drafted [0-9]*, accepted \([0-9]*\) .*/\1/p' "$tmp/r1")
[ -n "$acc" ] && [ "$acc" -gt 20 ] || fail "a repeating text: $(cat "$tmp/r1")"
grep -q "^acceptance by draft position: 1:" "$tmp/r1" || fail "no per-position line: $(cat "$tmp/r1")"
printf 'The quick brown fox jumps over the lazy dog.' >"$tmp/short.txt"
"$strata" spec-replay -m "$model" --spec ngram -f "$tmp/short.txt" >"$tmp/r3" 2>&1 || fail "short text exited $?"
grep -q "drafted 0, accepted 0" "$tmp/r3" || fail "a text without repeats: $(cat "$tmp/r3")"

strip() { sed 's/,"timings":{[^}]*}//' "$1"; }
printf '{"prompt":"def fibonacci(n):"}\n{"prompt":"import os"}\n{"prompt":"class Stack:"}\n{"prompt":"for i in range(","temperature":0.8,"seed":3}\n' >"$tmp/in.jsonl"
B=(batch -m "$model" --device cpu -t 2 --temp 0 -n 32 --input "$tmp/in.jsonl")
"$strata" "${B[@]}" --streams 3 -o "$tmp/b0.jsonl" 2>/dev/null || fail "batch exited $?"
"$strata" "${B[@]}" --streams 3 --spec ngram -o "$tmp/b3.jsonl" 2>"$tmp/err" || fail "batch --spec exited $?"
grep -q "speculative: [0-9]* verify passes" "$tmp/err" || fail "batch --spec: no statistics: $(cat "$tmp/err")"
"$strata" "${B[@]}" --streams 1 --spec ngram -o "$tmp/b1.jsonl" 2>/dev/null || fail "batch --spec --streams 1 exited $?"
[ "$(strip "$tmp/b0.jsonl" | head -3)" = "$(strip "$tmp/b3.jsonl" | head -3)" ] ||
    fail "batch --spec changed greedy lines"
[ "$(strip "$tmp/b1.jsonl")" = "$(strip "$tmp/b3.jsonl")" ] ||
    fail "batch --spec: --streams 1 and 3 differ"
head -3 "$tmp/in.jsonl" >"$tmp/in3.jsonl" # the greedy lines
"$strata" "${B[@]}" --input "$tmp/in3.jsonl" --streams 3 --spec draft -md "$model" --draft-device cpu \
    -o "$tmp/bd.jsonl" 2>"$tmp/err" ||
    fail "batch --spec draft exited $?: $(cat "$tmp/err")"
[ "$(strip "$tmp/b0.jsonl" | head -3)" = "$(strip "$tmp/bd.jsonl" | head -3)" ] ||
    fail "batch --spec draft changed greedy lines"
grep -q "speculative: [0-9]* verify passes, \([0-9]*\) drafted, \1 accepted" "$tmp/err" ||
    fail "batch --spec draft with the model itself: $(cat "$tmp/err")"
# every position of every pass kept, so each listed position reads 100%
pos=$(grep "accepted by draft position:" "$tmp/err" | sed 's/.*position://')
[ -n "$pos" ] && [ -z "$(tr ' ' '\n' <<<"$pos" | grep -v '^$' | grep -v ':100%$')" ] ||
    fail "batch --spec draft by position: $(cat "$tmp/err")"

"$strata" run -m "$model" --device cpu -t 2 -n 4 -p x --spec mtp >/dev/null 2>"$tmp/err"
[ $? = 1 ] && grep -q "this model has no MTP block" "$tmp/err" || fail "--spec mtp without a block: $(cat "$tmp/err")"
for bad in "run -m $model --spec other -p x" "run -m $model --draft-max 4 -p x" \
    "run -m $model --spec ngram --draft-max 0 -p x" "spec-replay -m $model --spec ngram" \
    "spec-replay -m $model -f $tmp/rep.txt" "run -m $model --spec draft -p x" \
    "run -m $model -md $model -p x"; do
    # shellcheck disable=SC2086
    "$strata" $bad >/dev/null 2>"$tmp/err"
    rc=$?
    [ $rc = 2 ] || fail "'strata $bad' exited $rc: $(cat "$tmp/err")"
done
echo "cli_spec: ok"
