#!/usr/bin/env bash
# GPU machine: one build (.carry/bin) of a comparison, the builds run back to back on one
# machine (two builds packed together no longer fit beside the checkout): with CHECK=1 its
# test binaries first (as bench/device-check.sh, without the qwen3next bench and the server);
# then the md5 of its greedy logits on the 30b-a3b preset (eager and --graph; the builds
# compared should print the same sums), and bench/device-fuse.sh on it alone (ROUNDS,
# LOCKSTEP, NS, NCU as there).
set -u
[ -n "${CHECK:-}" ] && SKIP_Q3N=1 SKIP_SERVE=1 bash bench/device-check.sh
. bench/device-env.sh
gen_30b
for g in "" --graph; do
    "$B/strata" logits -m $M --device cuda $g --ids 1,2,3,4,5,6,7 --greedy 40 -o /tmp/l$g.bin \
        >/dev/null 2>&1
    echo "logits$g $(md5sum </tmp/l$g.bin | cut -c1-32)"
done
TESTS= BUILDS=.carry/bin bash bench/device-fuse.sh
