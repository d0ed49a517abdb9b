#!/usr/bin/env bash
# GPU machine: what each kernel of a decode layer costs inside the step, read by leaving it out.
# The binaries are built from a commit with bench/ablate.patch applied (STRATA_ABLATE names the
# kernels not launched: topk, router, rope, attn (attention and its merge), combine (the merge),
# qkv, oproj, norm (the two norms with the residual add), moe); the outputs are wrong and only
# the times mean anything. The 30b-a3b q4_k_m preset all resident, tg128 eager and --graph
# after a 512-token prompt, ROUNDS rounds of the settings in ABL (commas inside one setting).
set -u
. bench/device-env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
gen_30b
ABL=${ABL:-"none topk router rope combine attn qkv oproj norm moe topk,rope,combine"}
for round in $(seq ${ROUNDS:-1}); do
    for a in $ABL; do
        for g in --no-graph --graph; do
            echo "### round $round STRATA_ABLATE=$a bench --device cuda $g"
            STRATA_ABLATE=$a "$B/strata" bench -m $M --device cuda $g -p 512 -n 128 --bw-gib 0.5 --tg random 2>&1 | grep -E "^tg"
        done
    done
done
