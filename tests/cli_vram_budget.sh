#!/usr/bin/env bash
# --vram-budget and friends on the command line: bad values are refused with the reason and
# exit code 2, before anything is loaded; --residency takes copy, zerocopy or gpu; without a
# GPU a budget fails cleanly (exit 1, the CUDA reason named) and --device auto runs on the
# CPU. The budget's effect is tested on the GPU machine (test_cuda_residency).
set -uo pipefail
strata=$1
fail() { echo "FAIL: $*"; exit 1; }
expect() { # expect CODE PATTERN -- args...
    local code=$1 pat=$2; shift 3
    out=$("$strata" "$@" 2>&1); rc=$?
    [ "$rc" = "$code" ] || fail "strata $* exited $rc, not $code: $out"
    grep -q -- "$pat" <<<"$out" || fail "strata $*: no '$pat' in: $out"
    echo "ok: strata $* -> $rc: $(head -1 <<<"$out")"
}
expect 2 "unknown unit 'X'" -- run --vram-budget 4X -p hi
expect 2 "wants a size such as 8G, 7.5GiB or 8000MB, of 1\.\." -- run --vram-budget 0 -p hi
expect 2 "need --device cuda" -- run --device cpu --vram-budget 4G -p hi
expect 2 "copy, zerocopy or gpu" -- run --residency fast -p hi
expect 2 "unknown unit" -- bench -m x --vram-budget 12Q
# (whole help texts: grep -q quitting early would end strata by SIGPIPE under pipefail)
grep -q -- "--vram-budget SIZE" <<<"$("$strata" run --help)" || fail "run --help lacks --vram-budget"
grep -q -- "--residency" <<<"$("$strata" bench --help)" || fail "bench --help lacks --residency"
expect 2 "auto, cpu or cuda" -- run --device gpu -p hi
expect 2 "stream, hybrid, static or static:N" -- run --placement static:0 -p hi
expect 2 "hybrid needs --vram-budget" -- run --placement hybrid -p hi
expect 2 "picks N from --vram-budget" -- run --placement static -p hi
expect 2 "--placement needs the CUDA backend" -- run --device cpu --placement static:2 -p hi
if "$strata" info 2>/dev/null | grep -q "^cuda: *none"; then
    expect 1 "CUDA" -- run --vram-budget 4G -p hi -n 1
    # --device auto (the default) falls back to the CPU without a GPU
    expect 0 "backend cpu" -- run -p "def f(x):" -n 2 -t 2 -v
fi
