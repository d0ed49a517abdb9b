#!/usr/bin/env bash
# GPU machine: every way of serving W1-real (the shipped model inflated to the 30b-a3b shapes,
# bench/heldout.py's odd texts) at each of BUDGETS (default 1G 2G), steady decode (256 greedy
# tokens after 512): all resident (ops, --graph), copy, copy + --prefetch, zero-copy in a
# graph, hybrid, auto. EXTRA_MODES adds more (each a quoted flag list, ; separated). Results in
# $OUT/w1modes.txt.
set -u
. bench/device-env.sh
R=$OUT/w1modes.txt
w1_setup
keep="^(pp|tg)[0-9]|^cache |^prefetch |^cpu lane|^placement|^auto|error"
run() {
    echo "### strata bench -m w1.gguf -f eval.txt --tg greedy -p 512 -n 256 $*" | tee -a "$R"
    # shellcheck disable=SC2086
    timeout 90 "$B/strata" bench -m $W1 -f /tmp/eval.txt --tg greedy --bw-gib 0.25 -p 512 -n 256 "$@" 2>&1 |
        grep -E "$keep" | tee -a "$R"
}
run --device cuda
run --device cuda --graph
for b in ${BUDGETS:-1G 2G}; do
    run --vram-budget $b
    run --vram-budget $b --prefetch
    run --vram-budget $b --residency zerocopy --graph
    run --vram-budget $b --placement hybrid
    run --vram-budget $b --placement auto --graph
    IFS=';' read -ra xs <<<"${EXTRA_MODES:-}"
    for x in "${xs[@]}"; do
        # shellcheck disable=SC2086
        run --vram-budget $b $x
    done
done
