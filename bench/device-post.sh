#!/usr/bin/env bash
# GPU machine: the check of a commit that runs the next layer's add + norm inside the MoE down
# kernel (STRATA_MOE_POST_NORM=0 leaves it to its own launch). Every test binary of .carry/bin
# (unless SKIP_TESTS=1); greedy logits' md5 on the 30b-a3b preset all resident, at 8 GiB on the
# GPU's cache in a graph and at 12 GiB with zero-copy misses in a graph, with the setting 0 and
# 1 (the sums must agree); then tg128 after pp512 (--tg random) all resident, the two settings
# alternated for ROUNDS rounds (default 3), the default placement at 12 and 8 GiB once, and the
# two cached modes under each setting once. Results: $OUT/post.txt.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
R=$OUT/post.txt
V=${V:-STRATA_MOE_POST_NORM}
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$R"
run_tests "$(cd "$B" && ls test_*)" "after the layer"
grep -h "after the layer" /tmp/test_cuda_moe.log 2>/dev/null | sed 's/[0-9]* outputs.*//' |
    sort | uniq -c | tee -a "$R"
gen_30b
where() { case $1 in res) echo "--device cuda" ;; 8G) echo "--vram-budget 8G --residency gpu --graph" ;;
    12G) echo "--vram-budget 12G --residency zerocopy --graph" ;; esac; }
for w in ${MD5:-res 8G 12G}; do
    for s in 1 0; do
        env $V=$s timeout 120 "$B/strata" logits -m $M $(where $w) --ids 1,2,3,4,5,6,7 \
            --greedy 40 -o /tmp/l.bin >/dev/null 2>&1
        echo "logits $w $V=$s $(md5sum </tmp/l.bin | cut -c1-32)" | tee -a "$R"
        rm -f /tmp/l.bin
    done
done
tg() { # $1: label, the rest: strata bench flags
    local l=$1
    shift
    echo "$l: $(timeout 150 "$B/strata" bench -m $M "$@" -p 512 -n 128 --tg random 2>&1 |
        grep -E '^tg128|^pp512|placement auto|hit rate' | tr -s ' ' | tr '\n' ' ')" | tee -a "$R"
}
for r in $(seq ${ROUNDS:-3}); do
    for s in 1 0; do
        (export $V=$s; tg "resident $V=$s r$r" --device cuda)
    done
done
tg "12G auto" --vram-budget 12G
tg "8G auto" --vram-budget 8G
for s in 1 0; do
    (export $V=$s; tg "8G gpu graph $V=$s" $(where 8G); tg "12G zc graph $V=$s" $(where 12G))
done
exit 0
