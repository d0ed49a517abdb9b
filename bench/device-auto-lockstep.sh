#!/usr/bin/env bash
# GPU machine: test_cuda_batch and test_cuda_residency, then lockstep decode of 8 streams of the
# 30b-a3b preset under 8 GiB with the default placement (auto) beside copy and hybrid
# (strata bench -p 64 -n 64 --streams 8).
. bench/device-env.sh
for t in test_cuda_batch test_cuda_residency; do
    (cd tests && timeout 200 "$B/$t" >"$OUT/$t.log" 2>&1); echo "$t rc=$?"; grep -E "FAIL" "$OUT/$t.log" | head -5
done
gen_30b
for f in "" "--residency copy" "--placement hybrid"; do
    echo "### 8G $f --streams 8"
    timeout 200 "$B/strata" bench -m $M --vram-budget 8G $f -p 64 -n 64 --bw-gib 0.1 --streams 8 --tg random 2>&1 | grep -E "^(tg|lockstep)|auto:|^placement"
done
