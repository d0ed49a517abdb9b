#!/usr/bin/env bash
# GPU machine: the GPU's own expert cache (--residency gpu) in a graph, against all resident
# and the copy path. W1-real (the shipped model inflated to the 30b-a3b shapes, bench/heldout.py's
# odd texts, 256 greedy tokens after 512): all resident in a graph, then --residency gpu --graph
# at each of BUDGETS (default 4G 2G 1G; at 4 GiB every expert fits, so its difference from all
# resident is the per-layer lookup alone), with PF=1 also with --prefetch, for each binary of
# BINS (default strata; names in .carry/bin, e.g. an older build packed beside it); then the
# copy path (--placement stream) at COPY_BUDGETS (default 2G 1G) with strata. REPS
# (default 1) rounds. With NCU=1 also ncu's per-kernel time of gpu --graph decode at 2 GiB.
# Results in $OUT/gpulookup.txt.
set -u
. bench/device-env.sh
R=$OUT/gpulookup.txt
w1_setup
keep="^(pp|tg)[0-9]|^cache |^prefetch |^placement|error"
F=(-m $W1 -f /tmp/eval.txt --tg greedy --bw-gib 0.25 -p 512 -n 256)
for i in $(seq "${REPS:-1}"); do
    for bin in ${BINS:-strata}; do
        bench_keep "${F[@]}" --device cuda --graph
        for b in ${BUDGETS:-4G 2G 1G}; do
            bench_keep "${F[@]}" --vram-budget $b --residency gpu --graph
            [ -z "${PF:-}" ] || bench_keep "${F[@]}" --vram-budget $b --residency gpu --graph --prefetch
        done
    done
    bin=strata
    for b in ${COPY_BUDGETS:-2G 1G}; do
        bench_keep "${F[@]}" --vram-budget $b --placement stream
    done
done
if [ -n "${NCU:-}" ]; then
    f=$OUT/ncu-gpu2g.txt
    timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip ${NCU_SKIP:-2000} \
        --launch-count ${NCU_COUNT:-600} --print-summary per-kernel "$B/strata" bench "${F[@]}" \
        --vram-budget 2G --residency gpu --graph -n 32 >"$f" 2>&1
    echo "ncu rc=$?" | tee -a "$R"
    python3 bench/ncu-summary.py "$f" | tee -a "$R"
fi
