#!/usr/bin/env bash
# strata run's prompt checks on the shipped default model: a prompt longer than the context is
# refused before anything is printed (exit 2, the token count and -c named), an empty one too,
# and a prompt that fits runs.
set -uo pipefail
strata=$1
fail() { echo "FAIL: $*"; exit 1; }
long=$(printf 'word %.0s' $(seq 1 200))
out=$("$strata" run --device cpu -c 64 -p "$long" -n 4 2>/tmp/cli-run-prompt.$$); rc=$?
err=$(cat /tmp/cli-run-prompt.$$); rm -f /tmp/cli-run-prompt.$$
[ "$rc" = 2 ] || fail "a prompt over the context exited $rc, not 2: $err"
grep -q "the context holds 64 (-c)" <<<"$err" || fail "no context message in: $err"
[ -z "$out" ] || fail "a refused prompt printed to stdout: $out"
echo "ok: over-long prompt -> 2: $err"
out=$("$strata" run --device cpu -p "" -n 4 2>&1); rc=$?
[ "$rc" = 2 ] || fail "an empty prompt exited $rc, not 2: $out"
echo "ok: empty prompt -> 2: $(tail -1 <<<"$out")"
out=$("$strata" run --device cpu -c 512 -p "$long" -n 4 --temp 0 2>&1); rc=$?
[ "$rc" = 0 ] || fail "a prompt that fits exited $rc: $out"
grep -q "generation: 4 tokens" <<<"$out" || fail "no generation line in: $out"
echo "ok: the same prompt with -c 512 runs"
