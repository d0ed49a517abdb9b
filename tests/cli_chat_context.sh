#!/usr/bin/env bash
# strata chat on the shipped default model with a tiny context: a reply cut off by the context
# and a message that no longer fits are both said on stderr, the session goes on, /reset
# empties the context so the next message fits again, and the session ends with exit 0.
set -uo pipefail
strata=$1
fail() { echo "FAIL: $*"; exit 1; }
err=$(printf 'hello there, how are you today?\nhi\n/reset\nhi\n/exit\n' |
    "$strata" chat --device cpu -c 26 -n 16 --temp 0 2>&1 >/dev/null); rc=$?
[ "$rc" = 0 ] || fail "chat exited $rc: $err"
grep -q "the context is full" <<<"$err" || fail "no 'context is full' in: $err"
grep -q "does not fit in the context" <<<"$err" || fail "no 'does not fit' in: $err"
grep -q "the conversation is forgotten" <<<"$err" || fail "no /reset message in: $err"
[ "$(grep -c 'does not fit' <<<"$err")" = 1 ] || fail "the message after /reset did not fit: $err"
echo "ok: chat with -c 26 ran on through a full context and /reset"
