#!/usr/bin/env bash
# GPU machine: the check of a commit whose decode steps select their experts inside their
# kernels (the expert kernels all resident and with zero-copy misses, the lookup kernel of the
# GPU's own cache). Every test binary of .carry/bin (unless SKIP_TESTS=1); greedy logits' md5
# on the 30b-a3b preset all resident, at 8 GiB on the GPU's cache in a graph and at 12 GiB with
# zero-copy misses in a graph, each with STRATA_CACHE_SELECT=0 (the top-k launch) and without
# (the sums must agree); then tg128 after pp512 (--tg random): all resident and the default
# placement at 12, 8 and 4 GiB (ROUNDS rounds, default 2; 4 GiB once), and the two cached modes
# with and without the selection once each. Results: $OUT/select.txt.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
R=$OUT/select.txt
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$R"
run_tests "$(cd "$B" && ls test_*)" "selected their experts"
grep -h "selecting from the logits" /tmp/test_cuda_moe.log 2>/dev/null | sort | uniq -c | head -6 |
    tee -a "$R"
gen_30b
where() { case $1 in res) echo "--device cuda" ;; 8G) echo "--vram-budget 8G --residency gpu --graph" ;;
    12G) echo "--vram-budget 12G --residency zerocopy --graph" ;; esac; }
for w in res 8G 12G; do
    for s in 1 0; do
        [ $w = res ] && [ $s = 0 ] && continue
        STRATA_CACHE_SELECT=$s timeout 120 "$B/strata" logits -m $M $(where $w) --ids 1,2,3,4,5,6,7 \
            --greedy 40 -o /tmp/l.bin >/dev/null 2>&1
        echo "logits $w select=$s $(md5sum </tmp/l.bin | cut -c1-32)" | tee -a "$R"
        rm -f /tmp/l.bin
    done
done
tg() { # $1: label, the rest: strata bench flags
    local l=$1
    shift
    echo "$l: $(timeout 150 "$B/strata" bench -m $M "$@" -p 512 -n 128 --tg random 2>&1 |
        grep -E '^tg128|placement auto|hit rate' | tr -s ' ' | tr '\n' ' ')" | tee -a "$R"
}
for r in $(seq ${ROUNDS:-2}); do
    tg "resident r$r" --device cuda
    tg "12G auto r$r" --vram-budget 12G
    tg "8G auto r$r" --vram-budget 8G
done
tg "4G auto" --vram-budget 4G
for s in 1 0; do
    STRATA_CACHE_SELECT=$s tg "8G gpu graph select=$s" $(where 8G)
    STRATA_CACHE_SELECT=$s tg "12G zc graph select=$s" $(where 12G)
done
exit 0
