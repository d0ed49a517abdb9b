#!/usr/bin/env bash
# GPU machine: ncu's per-kernel GPU time over a window of lockstep decode steps of NS streams
# (default 8; eager) of the 30b-a3b q4_k_m preset, all resident, then the same over
# single-stream decode steps, one line per kernel (bench/ncu-summary.py). The window: LSKIP
# launches skipped (default 10600: past the single-stream run and the streams' prompts of
# `-p 16 -n 8`, about 4,900 launches per eight-stream step set), LCOUNT counted (default 980,
# two steps).
. bench/device-env.sh
gen_30b
n=${NS:-8}
timeout 250 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip ${LSKIP:-10600} \
    --launch-count ${LCOUNT:-980} --print-summary per-kernel "$B/strata" bench -m $M --device cuda \
    -p 16 -n 8 --bw-gib 0.1 --streams $n --tg random >/tmp/ncu-lockstep.txt 2>&1
echo "### lockstep $n streams rc=$?"
grep -E "^(tg|lockstep)" /tmp/ncu-lockstep.txt
python3 bench/ncu-summary.py /tmp/ncu-lockstep.txt | sort -rn
echo "### one stream"
ncu_decode /tmp/ncu-one.txt | sort -rn
