#!/usr/bin/env bash
# strata batch on the shipped default model (CPU, one thread, short generations):
#  1. greedy texts of 3 prompts decoded together (--streams 3) equal strata run's for each
#     prompt alone, and a per-line stop string cuts the text where run's text has it;
#  2. --streams 1 and --streams 3 write the same OUT (timings aside), greedy and sampled at
#     --temp 0.8 with per-line seeds, and so do prompts joining the steps in chunks of 2
#     tokens or evaluated alone (--prefill-chunk 2, 0);
#  3. malformed JSON, an unknown key, a wrong type and a prompt over the context (-c) become
#     error objects naming their lines, the other lines run, exit 1;
#  4. --resume skips the ids OUT holds (also after a torn last line) and ends with the same OUT
#     as one whole run; Ctrl-C writes the finished lines, exits 130, and --resume finishes;
#  5. an existing OUT without --resume, a directory OUT, --streams 0 and abc, -p are refused
#     with exit 2 and nothing written;
#  6. a chat job on a harmony model (gen's tiny gpt-oss) is rendered as strata run --chat
#     renders it (the same prompt token count) and its line carries "reasoning" beside "text";
#     a ChatML model's chat line has no "reasoning".
set -uo pipefail
strata=$1
model="$2/../../models/strata-default.gguf"
[ -r "$model" ] || { echo "skip: no $model"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
B=(batch -m "$model" --device cpu -t 1)
N=12

# JSON string escapes of text as json-c writes them (enough for the texts here).
json_escape() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\t'/\\t}
    s=${s//$'\r'/\\r}
    printf '%s' "$s"
}
# The (escaped) "text" of OUT's line N.
text_of() { sed -n "${2}s/^{\"id\":[^,]*,\"text\":\"\(.*\)\",\"tokens\":.*/\1/p" "$1"; }
# OUT without its timings (they differ from run to run).
strip() { sed 's/,"timings":{[^}]*}//' "$1"; }

prompts=("def fibonacci(n):" "import os" "class Stack:")
: >"$tmp/in.jsonl"
for p in "${prompts[@]}"; do
    printf '{"prompt":"%s"}\n' "$(json_escape "$p")" >>"$tmp/in.jsonl"
done

# 1. greedy batch == greedy run
"$strata" "${B[@]}" --temp 0 -n $N --streams 3 --input "$tmp/in.jsonl" -o "$tmp/g3.jsonl" \
    2>"$tmp/err" || fail "greedy batch exited $?: $(cat "$tmp/err")"
[ "$(wc -l <"$tmp/g3.jsonl")" = 3 ] || fail "greedy batch wrote $(wc -l <"$tmp/g3.jsonl") lines"
i=0
for p in "${prompts[@]}"; do
    i=$((i + 1))
    out=$("$strata" run -m "$model" --device cpu -t 1 --temp 0 -n $N -p "$p" 2>/dev/null; echo x)
    out=${out%x}
    gen=${out#"$p"}
    [ "$gen" != "$out" ] || fail "run's output does not start with its prompt: $out"
    want=$(json_escape "$gen")
    got=$(text_of "$tmp/g3.jsonl" $i)
    [ "$got" = "$want" ] || fail "line $i: batch text '$got' is not run's '$want'"
    grep -q "^{\"id\":$i,\"text\":.*,\"tokens\":$N,\"finish_reason\":\"length\"" \
        <(sed -n "${i}p" "$tmp/g3.jsonl") || fail "line $i: $(sed -n "${i}p" "$tmp/g3.jsonl")"
    # the same prompt with a stop string: run's text up to its first newline
    if [[ $gen == *$'\n'* ]]; then
        printf '{"prompt":"%s","stop":["\\n"]}\n' "$(json_escape "$p")" >"$tmp/stop.jsonl"
        rm -f "$tmp/stop.out"
        "$strata" "${B[@]}" --temp 0 -n $N --input "$tmp/stop.jsonl" -o "$tmp/stop.out" \
            2>"$tmp/err" || fail "stop batch exited $?: $(cat "$tmp/err")"
        [ "$(text_of "$tmp/stop.out" 1)" = "$(json_escape "${gen%%$'\n'*}")" ] ||
            fail "stop \\n: $(cat "$tmp/stop.out") against run's '$gen'"
        grep -q '"finish_reason":"stop"' "$tmp/stop.out" || fail "stop: $(cat "$tmp/stop.out")"
        echo "ok: line $i with stop \\n is run's text up to its first newline"
    fi
done
echo "ok: 3 greedy prompts decoded together equal strata run's texts"

# 2. --streams 1 == --streams 3, greedy and seeded sampling
"$strata" "${B[@]}" --temp 0 -n $N --streams 1 --input "$tmp/in.jsonl" -o "$tmp/g1.jsonl" \
    2>"$tmp/err" || fail "greedy --streams 1 exited $?: $(cat "$tmp/err")"
diff <(strip "$tmp/g1.jsonl") <(strip "$tmp/g3.jsonl") || fail "greedy: --streams 1 and 3 differ"
: >"$tmp/seeded.jsonl"
for s in 0 1 2 3 4; do
    printf '{"id":"s%d","prompt":"%s","seed":%d,"n_predict":%d}\n' $s \
        "$(json_escape "${prompts[$((s % 3))]}")" $((100 + s)) $((6 + 2 * s)) >>"$tmp/seeded.jsonl"
done
for n in 1 3; do
    "$strata" "${B[@]}" --temp 0.8 --streams $n --input "$tmp/seeded.jsonl" \
        -o "$tmp/t$n.jsonl" 2>"$tmp/err" || fail "seeded --streams $n exited $?: $(cat "$tmp/err")"
done
diff <(strip "$tmp/t1.jsonl") <(strip "$tmp/t3.jsonl") || fail "seeded: --streams 1 and 3 differ"
# prompts joining the steps in chunks of 2 tokens, and every prompt alone first: the same OUT
for c in 0 2; do
    "$strata" "${B[@]}" --temp 0.8 --streams 3 --prefill-chunk $c --input "$tmp/seeded.jsonl" \
        -o "$tmp/c$c.jsonl" 2>"$tmp/err" || fail "--prefill-chunk $c exited $?: $(cat "$tmp/err")"
    diff <(strip "$tmp/t1.jsonl") <(strip "$tmp/c$c.jsonl") || fail "--prefill-chunk $c differs"
done
[ "$(text_of "$tmp/t1.jsonl" 1)" != "$(text_of "$tmp/t1.jsonl" 4)" ] ||
    fail "the same prompt with seeds 100 and 103 gave the same text"
echo "ok: --streams 1 and 3 write the same OUT, greedy and seeded at --temp 0.8, prompts joining"
echo "    the steps in chunks of 2 or 16 tokens or evaluated alone"

# 3. bad lines
long=$(printf 'word %.0s' $(seq 1 100))
{
    echo '{"id":"a","prompt":"def f(x):"}'
    echo '{"id":"b","prompt": "x'
    echo '{"id":"c","prompt":"x","colour":1}'
    echo
    echo '{"id":"d","prompt":"x","n_predict":"4"}'
    echo "{\"id\":\"e\",\"prompt\":\"$long\"}"
    echo '{"id":"f","prompt":"class A:"}'
} >"$tmp/bad.jsonl"
"$strata" "${B[@]}" --temp 0 -n 4 -c 32 --input "$tmp/bad.jsonl" -o "$tmp/bad.out" \
    2>"$tmp/err"
rc=$?
[ "$rc" = 1 ] || fail "bad lines exited $rc, not 1: $(cat "$tmp/err")"
[ "$(wc -l <"$tmp/bad.out")" = 6 ] || fail "bad lines: $(cat "$tmp/bad.out")"
for want in '^{"id":"a","text":' \
    '^{"id":2,"error":"line 2: not valid JSON' \
    '^{"id":"c","error":"line 3: unknown key \\"colour\\"' \
    '^{"id":"d","error":"line 5: \\"n_predict\\" wants an integer in 0..1048576, not \\"4\\""' \
    '^{"id":"e","error":"line 6: the prompt is 101 tokens, and the context holds 32 (-c)' \
    '^{"id":"f","text":'; do
    grep -q "$want" "$tmp/bad.out" || fail "bad lines: no '$want' in: $(cat "$tmp/bad.out")"
done
grep -q "bad.jsonl:3: unknown key" "$tmp/err" || fail "no line number on stderr: $(cat "$tmp/err")"
grep -q "4 of 6 lines failed" "$tmp/err" || fail "no failure count: $(cat "$tmp/err")"
echo "ok: malformed, unknown key, wrong type, too long -> error objects, exit 1"

# 4. --resume
head -1 "$tmp/t1.jsonl" >"$tmp/r.jsonl"
head -2 "$tmp/t1.jsonl" | tail -1 | head -c 20 >>"$tmp/r.jsonl" # a torn line, no newline
"$strata" "${B[@]}" --temp 0.8 --streams 2 --resume --input "$tmp/seeded.jsonl" \
    -o "$tmp/r.jsonl" 2>"$tmp/err" || fail "--resume exited $?: $(cat "$tmp/err")"
grep -q "1 input lines skipped" "$tmp/err" || fail "--resume: $(cat "$tmp/err")"
diff <(strip "$tmp/r.jsonl" | sed 2d) <(strip "$tmp/t1.jsonl") ||
    fail "--resume did not finish OUT as one run does"
"$strata" "${B[@]}" --temp 0.8 --resume --input "$tmp/seeded.jsonl" -o "$tmp/r.jsonl" \
    2>"$tmp/err" || fail "--resume of a finished OUT exited $?: $(cat "$tmp/err")"
[ "$(wc -l <"$tmp/r.jsonl")" = 6 ] || fail "--resume of a finished OUT wrote more lines"
echo "ok: --resume skips the ids in OUT"

# Ctrl-C: the first line is done at once, the others run long; SIGINT once OUT has a line
{
    echo '{"prompt":"def f(x):","n_predict":1}'
    for p in "${prompts[@]}"; do printf '{"prompt":"%s"}\n' "$(json_escape "$p")"; done
} >"$tmp/int.jsonl"
"$strata" "${B[@]}" -n 3000 --streams 2 --input "$tmp/int.jsonl" -o "$tmp/int.out" \
    2>"$tmp/err" &
pid=$!
for _ in $(seq 1 600); do
    [ -s "$tmp/int.out" ] && break
    sleep 0.1
done
kill -INT $pid
wait $pid
rc=$?
[ "$rc" = 130 ] || fail "Ctrl-C exited $rc, not 130: $(cat "$tmp/err")"
grep -q "interrupted (Ctrl-C): 1 of 4 lines done" "$tmp/err" || fail "Ctrl-C: $(cat "$tmp/err")"
"$strata" "${B[@]}" -n 2 --resume --input "$tmp/int.jsonl" -o "$tmp/int.out" 2>"$tmp/err" ||
    fail "--resume after Ctrl-C exited $?: $(cat "$tmp/err")"
[ "$(grep -o '^{"id":[0-9]*' "$tmp/int.out" | tr -d '\n')" = \
    '{"id":1{"id":2{"id":3{"id":4' ] || fail "after Ctrl-C and --resume: $(cat "$tmp/int.out")"
echo "ok: Ctrl-C writes the finished line and exits 130; --resume finishes the rest"

# 5. refusals
refuse() {
    local want=$1; shift
    timeout 60 "$strata" "${B[@]}" "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ "$rc" = 2 ] || fail "$* exited $rc, not 2: $(cat "$tmp/err")"
    grep -qF -- "$want" "$tmp/err" || fail "$*: no '$want' in: $(cat "$tmp/err")"
    echo "ok: $* -> 2: $(head -1 "$tmp/err")"
}
cp "$tmp/g1.jsonl" "$tmp/exists.jsonl"
refuse "exists and is not empty: --resume continues it" --input "$tmp/in.jsonl" \
    -o "$tmp/exists.jsonl"
cmp -s "$tmp/g1.jsonl" "$tmp/exists.jsonl" || fail "a refused OUT was changed"
mkdir "$tmp/dir"
refuse "is a directory" --input "$tmp/in.jsonl" -o "$tmp/dir"
refuse "--streams wants an integer in 1..4096, not '0'" --streams 0 --input "$tmp/in.jsonl" \
    -o "$tmp/new.jsonl"
refuse "--streams wants an integer in 1..4096, not 'abc'" --streams abc \
    --input "$tmp/in.jsonl" -o "$tmp/new.jsonl"
refuse "the prompts come from --input" -p hello --input "$tmp/in.jsonl" -o "$tmp/new.jsonl"
refuse "need --input" -o "$tmp/new.jsonl"
[ ! -e "$tmp/new.jsonl" ] || fail "a refused command created OUT"
# streams that do not fit in memory together: refused with the arithmetic before any is opened
for i in $(seq 1 16); do echo "{\"prompt\": \"x $i\"}"; done >"$tmp/many.jsonl"
timeout 60 "$strata" "${B[@]}" -n 2 --streams 16 -c 1048576 --input "$tmp/many.jsonl" \
    -o "$tmp/many.out" >/dev/null 2>"$tmp/err"
rc=$?
[ "$rc" = 1 ] && grep -q "16 streams of 1048576 positions need 16 x .* such streams fit" "$tmp/err" ||
    fail "16 streams of 1M positions: exit $rc: $(cat "$tmp/err")"
echo "ok: 16 streams of 1M positions refused: $(grep -o 'need .*' "$tmp/err" | head -c 160)"
# harmony chat jobs
"$strata" gen --arch gpt-oss --preset tiny --quant q8_0 -q -o "$tmp/oss.gguf" >/dev/null ||
    fail "gen gpt-oss"
printf '{"messages":[{"role":"user","content":"What is a stack?"}]}\n{"prompt":"hello"}\n' \
    >"$tmp/oss.jsonl"
# (the harmony header carries today's date: a pair of runs across midnight is run again)
for attempt in 1 2; do
    rm -f "$tmp/oss.out"
    timeout 120 "$strata" batch -m "$tmp/oss.gguf" --device cpu -t 1 --temp 0 -n 8 \
        --input "$tmp/oss.jsonl" -o "$tmp/oss.out" 2>"$tmp/err" ||
        fail "batch on gpt-oss: $(cat "$tmp/err")"
    timeout 120 "$strata" run -m "$tmp/oss.gguf" --device cpu -t 1 --temp 0 -n 8 --chat \
        -p "What is a stack?" >/dev/null 2>"$tmp/err" ||
        fail "run --chat on gpt-oss: $(cat "$tmp/err")"
    n_run=$(sed -n 's/^prompt: \([0-9]*\) tokens.*/\1/p' "$tmp/err")
    line1=$(sed -n 1p "$tmp/oss.out")
    echo "$line1" | grep -q "\"prompt_tokens\":$n_run," && break
done
echo "$line1" | grep -q '"reasoning":' || fail "harmony chat line without reasoning: $line1"
echo "$line1" | grep -q "\"prompt_tokens\":$n_run," ||
    fail "harmony chat prompt: run --chat has $n_run tokens, batch: $line1"
sed -n 2p "$tmp/oss.out" | grep -q '"reasoning":' && fail "a plain prompt got reasoning"
printf '{"messages":[{"role":"user","content":"hi"}]}\n' >"$tmp/chatml.jsonl"
timeout 120 "$strata" "${B[@]}" -n 4 --input "$tmp/chatml.jsonl" -o "$tmp/chatml.out" \
    2>"$tmp/err" || fail "chat job on the default model: $(cat "$tmp/err")"
grep -q '"reasoning":' "$tmp/chatml.out" && fail "a ChatML line got reasoning"
echo "ok: harmony chat jobs ($n_run prompt tokens as strata run --chat)"
echo "ok: strata batch"
