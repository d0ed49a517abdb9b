#!/usr/bin/env bash
# GPU machine: the hybrid placement with the CPU lane's rate learned from its calls (the build
# in .carry/bin) against the same split on the rate measured at open (a build before that, in
# .carry/base; BUILDS: other folders of builds in .carry, e.g. a third, mid/; ENVS: settings
# each build's hybrid runs under, e.g. "X=1 STRATA_LANE_LEARN=0"), side by side in one lease: the 30b-a3b preset at --vram-budget 8G and 4G
# (ROUNDS rounds, the builds interleaved; `strata bench -p 64 -n 64 --tg random`), the copy
# path at both once for reference, then unless SKIP_TIER=1 the 235b-a22b preset cut to 30 layers
# through an 11 GiB host tier under a 15 GiB memory limit (bench/device-tier-limit.sh's hybrid
# row, -p 16 -n 24, both builds). Results in $OUT/lanes.txt and $OUT/tier-limit.txt.
set -u
. bench/device-env.sh
R=$OUT/lanes.txt
keep="^(pp|tg)[0-9]|^lanes|^cache |^placement|hybrid lanes|rror|failed"
gen_30b
for round in $(seq "${ROUNDS:-2}"); do
    for budget in 8G 4G; do
        for bin in ${BUILDS:-.carry/base .carry/bin}; do
            for e in ${ENVS:-X=1}; do
                echo "### round $round: $e $bin/strata bench -m 30b.gguf --vram-budget $budget --placement hybrid -p 64 -n 64 --tg random" | tee -a "$R"
                env "$e" timeout 120 "$bin/strata" bench -m $M --vram-budget $budget --placement hybrid \
                    -p 64 -n 64 --tg random --bw-gib 0.5 2>&1 | grep -E "$keep" | tee -a "$R"
            done
        done
    done
done
for budget in 8G 4G; do
    echo "### .carry/bin/strata bench -m 30b.gguf --vram-budget $budget --placement stream -p 64 -n 64 --tg random" | tee -a "$R"
    timeout 120 "$B/strata" bench -m $M --vram-budget $budget --placement stream -p 64 -n 64 \
        --tg random --bw-gib 0.5 2>&1 | grep -E "$keep" | tee -a "$R"
done
rm -f $M
[ -n "${SKIP_TIER:-}" ] || SKIP_30B=1 ONLY_HYBRID=1 HYBRID_BINS="${BUILDS:-.carry/base .carry/bin}" \
    BENCH235="-p 16 -n 24" TMO235=80 bash bench/device-tier-limit.sh
