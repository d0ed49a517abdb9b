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
for w in res 8G 12G; do
    for s in 1 0; do
        [ $w = res ] && [ $s = 0 ] && continue
        logits_md5 $w STRATA_CACHE_SELECT=$s
    done
done
for r in $(seq ${ROUNDS:-2}); do
    tg_line "resident r$r" --device cuda
    tg_line "12G auto r$r" --vram-budget 12G
    tg_line "8G auto r$r" --vram-budget 8G
done
tg_line "4G auto" --vram-budget 4G
for s in 1 0; do
    STRATA_CACHE_SELECT=$s tg_line "8G gpu graph select=$s" $(where_of 8G)
    STRATA_CACHE_SELECT=$s tg_line "12G zc graph select=$s" $(where_of 12G)
done
exit 0
