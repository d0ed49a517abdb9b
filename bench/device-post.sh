#!/usr/bin/env bash
# GPU machine: the check of a kernel variant behind an environment setting V (1: the variant, 0:
# without; default STRATA_MOE_POST_NORM, the setting of bench/post-norm.patch applied to
# e6415f1, which runs the next layer's add + norm inside the MoE down kernel; V=STRATA_MOE_GU16:
# the one-token gate/up kernel in clusters of two 16-row blocks). Every test binary of .carry/bin
# (unless SKIP_TESTS=1) with V=1 (TEST_V=0: without it); greedy logits' md5 on the 30b-a3b
# preset (MD5: which of res, 8G, 12G; default all) all resident, at 8 GiB on the GPU's cache in
# a graph and at 12 GiB with zero-copy misses in a graph, with the setting 0 and 1 (the sums
# must agree); then tg128 after pp512 (--tg random) all resident, the two settings alternated
# for ROUNDS rounds (default 3), the default placement at 12 and 8 GiB once, and the two cached
# modes under each setting once. Results: $OUT/post.txt.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
R=$OUT/post.txt
V=${V:-STRATA_MOE_POST_NORM}
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$R"
(export $V=${TEST_V:-1}; run_tests "$(cd "$B" && ls test_*)" "after the layer")
grep -h "after the layer" /tmp/test_cuda_moe.log 2>/dev/null | sed 's/[0-9]* outputs.*//' |
    sort | uniq -c | tee -a "$R"
gen_30b
for w in ${MD5-res 8G 12G}; do
    for s in 1 0; do
        logits_md5 $w $V=$s
    done
done
for r in $(seq ${ROUNDS:-3}); do
    for s in 1 0; do
        (export $V=$s; tg_line "resident $V=$s r$r" --device cuda)
    done
done
tg_line "12G auto" --vram-budget 12G
tg_line "8G auto" --vram-budget 8G
for s in 1 0; do
    (export $V=$s; tg_line "8G gpu graph $V=$s" $(where_of 8G); tg_line "12G zc graph $V=$s" $(where_of 12G))
done
exit 0
