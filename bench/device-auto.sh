#!/usr/bin/env bash
# GPU machine: test_cuda_residency, then the 30b-a3b preset all resident with --graph, and under
# 12, 8 and 4 GiB with the default placement (auto) beside zero-copy in a graph (12 GiB) and
# hybrid (8, 4 GiB): strata bench -p 512 -n 128.
. bench/device-env.sh
(cd tests && timeout 200 "$B/test_cuda_residency" >"$OUT/res.log" 2>&1); echo "test_cuda_residency rc=$?"
grep -E "FAIL|auto" "$OUT/res.log" | head -8
gen_30b
echo "### resident --graph"; "$B/strata" bench -m $M --device cuda --graph -p 512 -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^(pp|tg)[0-9]"
for w in "12G" "12G --residency zerocopy --graph" "8G" "8G --placement hybrid" "4G" "4G --placement hybrid"; do
    echo "### $w"; timeout 150 "$B/strata" bench -m $M --vram-budget $w -p 512 -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^(pp|tg)[0-9]|^cache|auto:"
done
