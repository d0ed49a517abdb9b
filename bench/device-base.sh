#!/usr/bin/env bash
# GPU machine: two builds side by side (.carry/base, .carry/bin): test_cuda_matmul of bin,
# resident pp512/tg128 eager and --graph twice each, greedy logits of both (same bytes?), and
# ncu per kernel of bin in graph decode.
. bench/device-env.sh
(cd tests && timeout 300 $B/test_cuda_matmul > $OUT/mm.log 2>&1; echo "test_cuda_matmul rc=$?"; grep -E "top-k|FAIL|passed" $OUT/mm.log | head -14)
gen_30b
for i in 1 2; do for bin in .carry/base .carry/bin; do for g in --no-graph --graph; do
  echo "### $i $bin $g"; $bin/strata bench -m $M --device cuda $g -p 512 -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^(pp|tg)[0-9]"
done; done; done
for bin in .carry/base .carry/bin; do for g in "" --graph; do
  $bin/strata logits -m $M --device cuda $g --ids 1,2,3,4,5,6,7 --greedy 40 -o $OUT/l-$(basename $bin)$g.bin > /dev/null 2>&1; done; done
md5sum $OUT/l-*.bin
B=$PWD/.carry/bin NCU_SKIP=2500 NCU_COUNT=400 ncu_decode $OUT/ncu-bin.txt --graph | sort -rn | head -14
