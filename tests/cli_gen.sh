#!/usr/bin/env bash
# cli_gen: `strata gen` from the command line: help, argument errors (exit 2 with a message that
# names the bad value), determinism across --threads (sha256 of the files), --layers, and an
# interrupted write that must leave nothing behind; a gpt-oss file that inspect reads and run refuses;
# qwen3next and qwen35moe files (deterministic, their layer kinds' tensors).
# usage: cli_gen.sh STRATA_BINARY [DATA_DIR]
set -u
strata=$1
dir=$(mktemp -d /tmp/strata-cli-gen.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
passes=0

ok() { passes=$((passes + 1)); }
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# expect_error WANT_SUBSTRING ARGS...: exit code 2 and the substring on stderr, no file written.
expect_error() {
    local want=$1
    shift
    "$strata" gen "$@" >"$dir/out" 2>"$dir/err"
    local rc=$?
    if [ $rc -ne 2 ]; then
        fail "strata gen $*: exit $rc, want 2"
    elif ! grep -qF -- "$want" "$dir/err"; then
        fail "strata gen $*: stderr lacks '$want': $(cat "$dir/err")"
    else
        ok
    fi
}

"$strata" gen --help >"$dir/help" 2>&1 && grep -q "30b-a3b" "$dir/help" && grep -q "q4_k_m" "$dir/help" \
    && ok || fail "gen --help"

expect_error "unknown preset 'huge'" --preset huge -o "$dir/x.gguf"
expect_error "unknown quant mix 'q3_k'" --quant q3_k -o "$dir/x.gguf"
expect_error "unknown architecture 'llama'" --arch llama -o "$dir/x.gguf"
expect_error "missing output file" --preset tiny
expect_error "--threads wants" --threads 0 -o "$dir/x.gguf"
expect_error "--layers wants" --layers -3 -o "$dir/x.gguf"
expect_error "--seed wants" --seed abc -o "$dir/x.gguf"
expect_error "unexpected argument 'extra'" -o "$dir/x.gguf" extra
[ ! -e "$dir/x.gguf" ] && ok || fail "a failed gen wrote $dir/x.gguf"

# Same seed, different thread counts: identical files; another seed: a different file.
"$strata" gen --preset tiny --quant q4_k_m --seed 7 --threads 1 -q -o "$dir/a.gguf" >/dev/null &&
"$strata" gen --preset tiny --quant q4_k_m --seed 7 --threads 3 -q -o "$dir/b.gguf" >/dev/null &&
"$strata" gen --preset tiny --quant q4_k_m --seed 8 -q -o "$dir/c.gguf" >/dev/null || fail "tiny gen failed"
ha=$(sha256sum <"$dir/a.gguf" | cut -d' ' -f1)
hb=$(sha256sum <"$dir/b.gguf" | cut -d' ' -f1)
hc=$(sha256sum <"$dir/c.gguf" | cut -d' ' -f1)
[ "$ha" = "$hb" ] && ok || fail "seed 7 with 1 and 3 threads: $ha vs $hb"
[ "$ha" != "$hc" ] && ok || fail "seeds 7 and 8 gave the same file"
size=$(stat -c %s "$dir/a.gguf")
[ "$size" -lt 10000000 ] && ok || fail "tiny q4_k_m is $size bytes"

# gpt-oss: gen writes it, inspect reads it, run generates (on the CPU here).
"$strata" gen --arch gpt-oss --preset tiny -q -o "$dir/oss.gguf" >/dev/null &&
"$strata" inspect --tensors "$dir/oss.gguf" | grep -q "blk.3.attn_sinks.weight" && ok || fail "gpt-oss gen/inspect"
"$strata" run -m "$dir/oss.gguf" -p hi -n 8 --temp 0 >"$dir/out" 2>"$dir/err" &&
[ "$(wc -c <"$dir/out")" -gt 2 ] && ok || fail "gpt-oss run: $(cat "$dir/err")"
# --chat renders harmony: the system header with the reasoning effort, the developer message,
# the assistant's opening; chat keeps a conversation over two messages
"$strata" run -m "$dir/oss.gguf" --chat --system "be brief" -p hi -n 4 >"$dir/out" 2>"$dir/err" &&
grep -q "Reasoning: medium" "$dir/out" && grep -q "<|start|>developer<|message|># Instructions" "$dir/out" &&
grep -q "<|start|>user<|message|>hi<|end|><|start|>assistant" "$dir/out" && ok || fail "gpt-oss --chat: $(cat "$dir/err")"
"$strata" run -m "$dir/oss.gguf" --chat --no-think -p hi -n 1 2>/dev/null | grep -q "Reasoning: low" && ok || fail "gpt-oss --chat --no-think"
printf 'hi\nthere\n' | "$strata" chat -m "$dir/oss.gguf" -n 4 >/dev/null 2>"$dir/err" && ok || fail "gpt-oss chat: $(cat "$dir/err")"
expect_error "unknown preset '30b-a3b' for gpt-oss" --arch gpt-oss --preset 30b-a3b -o "$dir/x.gguf"

# qwen3next / qwen35moe: listed by --help, written deterministically across --threads, with
# the GDN tensors of their kind (inspect reads the file only; the forward is not tested here).
grep -q "qwen3next *80b-a3b" "$dir/help" && grep -q "qwen35moe *35b-a3b" "$dir/help" && ok ||
    fail "gen --help lacks the hybrid presets"
for arch in qwen3next qwen35moe; do
    "$strata" gen --arch $arch --preset tiny --seed 5 --threads 1 -q -o "$dir/$arch-1.gguf" >/dev/null &&
    "$strata" gen --arch $arch --preset tiny --seed 5 --threads 2 -q -o "$dir/$arch-2.gguf" >/dev/null ||
        fail "$arch tiny gen failed"
    cmp -s "$dir/$arch-1.gguf" "$dir/$arch-2.gguf" && ok || fail "$arch: 1 and 2 threads differ"
    "$strata" inspect --tensors "$dir/$arch-1.gguf" >"$dir/out" 2>&1 || fail "$arch inspect"
    grep -q "blk.1.attn_q.weight" "$dir/out" && grep -q "blk.0.ssm_a " "$dir/out" &&
    ! grep -q "blk.1.ssm_a " "$dir/out" && ok || fail "$arch layer kinds: $(cat "$dir/out")"
    rm -f "$dir/$arch-2.gguf"
done
grep -q "blk.0.ssm_ba.weight" <("$strata" inspect --tensors "$dir/qwen3next-1.gguf") && ok ||
    fail "qwen3next: no ssm_ba"
"$strata" inspect --tensors "$dir/qwen35moe-1.gguf" >"$dir/out" 2>&1
grep -q "blk.0.ssm_beta.weight" "$dir/out" && grep -q "blk.0.ssm_alpha.weight" "$dir/out" &&
! grep -q "ssm_ba.weight" "$dir/out" && ok || fail "qwen35moe: ssm_beta/ssm_alpha"
"$strata" inspect "$dir/qwen35moe-1.gguf" 2>&1 | grep -q "rope.dimension_sections .*3, 3, 2, 0" &&
    ok || fail "qwen35moe: rope.dimension_sections"
rm -f "$dir"/qwen3*.gguf
expect_error "unknown preset 'huge' for qwen3next (known: tiny, 80b-a3b)" --arch qwen3next --preset huge -o "$dir/x.gguf"
expect_error "unknown preset '80b-a3b' for qwen35moe (known: tiny, 35b-a3b)" --arch qwen35moe --preset 80b-a3b -o "$dir/x.gguf"
expect_error "--inflate grows qwen3moe models only" --arch qwen3next --inflate "$dir/none.gguf" -o "$dir/x.gguf"

# --layers changes block_count and the file size.
"$strata" gen --preset tiny --layers 1 -q -o "$dir/one.gguf" >"$dir/out" || fail "--layers 1"
grep -q "1 layers" "$dir/out" && ok || fail "--layers 1 summary: $(cat "$dir/out")"
[ "$(stat -c %s "$dir/one.gguf")" -lt "$size" ] && ok || fail "--layers 1 file is not smaller"

# An interrupted write leaves no file and no temp file. A 30b-a3b layer is ~0.9 GB: SIGINT
# arrives long before the end, and the temp file is removed.
rm -f "$dir"/*.gguf
"$strata" gen --preset 30b-a3b --layers 1 --threads 1 -q -o "$dir/big.gguf" >/dev/null 2>"$dir/err" &
pid=$!
for _ in $(seq 50); do
    ls "$dir"/big.gguf.tmp.* >/dev/null 2>&1 && break
    sleep 0.05
done
kill -INT $pid
wait $pid
rc=$?
if [ $rc -eq 0 ]; then
    echo "note: the write finished before SIGINT; interrupt check not exercised" >&2
    rm -f "$dir/big.gguf"
else
    grep -q "interrupted" "$dir/err" && ok || fail "SIGINT message: $(cat "$dir/err")"
fi
[ -z "$(ls -A "$dir" | grep gguf)" ] && ok || fail "interrupted write left: $(ls "$dir")"

echo "cli_gen: $passes passed, $fails failed"
[ $fails -eq 0 ]
