#!/usr/bin/env bash
# GPU machine: the host tier under CUDA (--host-budget), for static placement's CPU layers and
# for the expert cache's misses. The 30b-a3b preset is written to the machine's disk (not
# tmpfs, where O_DIRECT is refused), then `strata bench` at --vram-budget 8G, static placement
# and the expert cache (stream placement) each: reading the mapping, and through a host tier of
# HOST_BUDGETS (default 4G and 8G: about 25% and 50% of the experts; the bench probes the
# disk's O_DIRECT bandwidth in the same run and reports the tier's reads against it); then the
# cache with --host-read-ahead, hybrid without and with a 4G tier, and static with --host-io
# pread. About 7 minutes. Results in
# $OUT/bench-tier.txt.
set -u
. bench/device-env.sh
F=${TIER_FILE:-$PWD/30b-disk.gguf}
R=$OUT/bench-tier.txt
[ -f "$F" ] || "$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o "$F" 2>&1 | tail -1
sync
# the CPU layers of static placement at 8 GiB, and their experts' bytes (bench prints them)
run() {
    echo "### strata bench -m 30b-disk.gguf --vram-budget 8G $*" | tee -a "$R"
    timeout 150 "$B/strata" bench -m "$F" --vram-budget 8G -p 128 -n 64 \
        --bw-gib 0.5 --tg random "$@" 2>&1 |
        grep -E "^(pp|tg)[0-9]|host tier|^backend|^floor|static|disk|^cache " | tee -a "$R"
}
# 48 layers of 128 experts of 2.92 MiB (q4_k_m at 30b-a3b shapes): about 17 GiB in all; the
# CPU layers of static placement at 8 GiB hold most of them, so 4G and 8G are about 25% and
# 50% of theirs. The expert cache (stream placement) copies its misses on from the tier.
for p in "--placement static" ""; do
    # shellcheck disable=SC2086
    run $p
    for hb in ${HOST_BUDGETS:-4G 8G}; do
        # shellcheck disable=SC2086
        run $p --host-budget $hb
    done
done
run --host-budget 4G --host-read-ahead
run --placement hybrid
run --placement hybrid --host-budget 4G
run --placement static --host-budget 4G --host-io pread
rm -f "$F"
