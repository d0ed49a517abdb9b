#!/usr/bin/env bash
# GPU machine: W1-real (the shipped model inflated to the 30b-a3b shapes) under BUDGET
# (default 2G), held-out texts (bench/heldout.py): a residency profile from the even texts
# (strata profile warmup), then on the odd ones the plain copy cache, the GPU's cache in a
# graph, and each with the profile and prediction (--prefetch: the copy path's predicted
# copies after each layer's launch, the GPU's cache's listing and copy kernels on their own
# streams), steady decode (-p 512 -n 256) and a cold chat turn's first 64 tokens (-p 64 -n 64).
# Results in $OUT/w1.txt, the full outputs in $OUT/w1-logs.tar.
set -u
. bench/device-env.sh
bench_budget w1 300
keep="^(pp|tg)[0-9]|hit rate|prefetch |profile|probe|rc="
KEEP_N=10
b=${BUDGET:-2G}
w1_setup
P=/tmp/w1-$b.profile
echo "### profile warmup at $b" | tee -a "$R"
s=$(date +%s)
timeout 120 "$B/strata" profile warmup -m $W1 --vram-budget $b --prompts /tmp/warm.txt \
    --separator '<|sep|>' --max-tokens 256 --decode 32 -o $P 2>&1 | tail -3 | tee -a "$R"
echo "warmup wall $(($(date +%s) - s)) s" | tee -a "$R"
F=(-m $W1 -f /tmp/eval.txt --vram-budget $b --tg greedy)
for n in "512 256" "64 64"; do
    set -- $n
    bench_one "copy-$1" X=1 "${F[@]}" -p $1 -n $2 --placement stream
    bench_one "gpu-$1" X=1 "${F[@]}" -p $1 -n $2 --residency gpu --graph
    bench_one "gpu-prof-pf-$1" X=1 "${F[@]}" -p $1 -n $2 --residency gpu --graph --profile $P \
        --prefetch
    bench_one "copy-prof-pf-$1" X=1 "${F[@]}" -p $1 -n $2 --placement stream --profile $P \
        --prefetch
done
