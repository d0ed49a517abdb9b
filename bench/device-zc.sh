#!/usr/bin/env bash
# GPU machine: the zero-copy path's tests (test_cuda_residency, _backend, _batch, _spec), then
# the 30b-a3b preset resident (eager, --graph) and under 12 and 8 GiB in zero-copy with a graph,
# copy and auto (strata bench -p 512 -n 128).
. bench/device-env.sh
for t in test_cuda_residency test_cuda_backend test_cuda_batch test_cuda_spec; do
    (cd tests && timeout 200 "$B/$t" >"$OUT/$t.log" 2>&1); echo "$t rc=$?"; grep -E "FAIL" "$OUT/$t.log" | head -5
done
gen_30b
for g in --no-graph --graph; do echo "### resident $g"; "$B/strata" bench -m $M --device cuda $g -p 512 -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^(pp|tg)[0-9]"; done
for b in 12G 8G; do for f in "--residency zerocopy --graph" "--residency copy" ""; do
    echo "### $b $f"; timeout 150 "$B/strata" bench -m $M --vram-budget $b $f -p 512 -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^(pp|tg)[0-9]|^cache|auto:"
done; done
