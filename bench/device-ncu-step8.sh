#!/usr/bin/env bash
# GPU machine: ncu's speed-of-light, memory, occupancy, launch and warp-state sections for a
# window of kernels of an eight-stream lockstep step (LSKIP launches skipped, default 10700,
# LCOUNT profiled, default 40: about four layers) and of a one-stream decode step (NCU_SKIP,
# default 3000, NCU_COUNT 20), the 30b-a3b q4_k_m preset all resident, eager; each kernel's
# lines reduced by bench/ncu-sections.py. ENVS: settings (commas between them; X=1: none) the
# lockstep window runs under, one pass each. Raw reports in $OUT/ncu-step8-*.txt.
. bench/device-env.sh
gen_30b
sec="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy"
sec="$sec --section LaunchStats --section WarpStateStats"
for e in ${ENVS:-X=1}; do
    f=$OUT/ncu-step8-${e//[=,]/-}.txt
    env ${e//,/ } timeout 240 ncu --clock-control none $sec --launch-skip ${LSKIP:-10700} \
        --launch-count ${LCOUNT:-40} "$B/strata" bench -m $M --device cuda -p 16 -n 8 --bw-gib 0.1 \
        --streams 8 --tg random >"$f" 2>&1
    echo "### lockstep 8 streams, $e: rc=$?"
    python3 bench/ncu-sections.py "$f"
done
f=$OUT/ncu-step1.txt
timeout 200 ncu --clock-control none $sec --launch-skip ${NCU_SKIP:-3000} --launch-count ${NCU_COUNT:-20} \
    "$B/strata" bench -m $M --device cuda -p 64 -n 16 --bw-gib 0.5 --tg random >"$f" 2>&1
echo "### one stream: rc=$?"
python3 bench/ncu-sections.py "$f"
