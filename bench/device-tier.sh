#!/usr/bin/env bash
# GPU machine: the host tier under CUDA's static placement (--placement static --host-budget).
# The 30b-a3b preset is written to the machine's disk (not tmpfs, where O_DIRECT is refused),
# then `strata bench` at --vram-budget 8G with static placement: reading the mapping, and
# through a host tier of 25% and 50% of the CPU layers' experts (the bench probes the disk's
# O_DIRECT bandwidth in the same run and reports the tier's reads against it). A second pass
# with --host-io pread. About 5 minutes. Results in $OUT/bench-tier.txt.
set -u
. bench/device-env.sh
F=${TIER_FILE:-$PWD/30b-disk.gguf}
R=$OUT/bench-tier.txt
[ -f "$F" ] || "$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o "$F" 2>&1 | tail -1
sync
# the CPU layers of static placement at 8 GiB, and their experts' bytes (bench prints them)
run() {
    echo "### strata bench -m 30b-disk.gguf --vram-budget 8G --placement static $*" | tee -a "$R"
    timeout 240 "$B/strata" bench -m "$F" --vram-budget 8G --placement static -p 128 -n 64 \
        --bw-gib 0.5 --tg random "$@" 2>&1 |
        grep -E "^(pp|tg)[0-9]|host tier|^backend|^floor|static|disk" | tee -a "$R"
}
run
# 48 layers of 128 experts of 2.92 MiB (q4_k_m at 30b-a3b shapes): about 17 GiB in all; the
# CPU layers at 8 GiB hold most of them, so these budgets are about 25% and 50% of theirs
for hb in 4G 8G; do
    run --host-budget $hb
done
run --host-budget 4G --host-io pread
rm -f "$F"
