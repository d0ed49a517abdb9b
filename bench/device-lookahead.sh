#!/usr/bin/env bash
# GPU machine: the lookahead (docs/speculative.md) with and without drafts. For each text of
# TEXTS (default cli/serve.c and tools/train/train_moe.py) and each placement of WHERE, one
# `strata bench --spec ngram` process, which generates the same greedy tokens six times: plain
# without, with (--lookahead always) and again without the lookahead, then with prompt-lookup
# drafts the same way (--lookahead drafts). Models: W1-real (the shipped model inflated to the
# 30b-a3b shapes, its routing kept) and, with P30B=1, the 30b-a3b preset at WHERE30 (random
# weights). Results in $OUT/lookahead.txt.
set -u
. bench/device-env.sh
R=$OUT/lookahead.txt
W1=/dev/shm/w1.gguf
[ -f $W1 ] || "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -o $W1 2>&1 | tail -1
IFS=';' read -r -a where <<<"${WHERE:---vram-budget 1G --residency copy;--vram-budget 2G --residency copy;--vram-budget 1G --placement hybrid}"
run() { # model file, where, text, label
    echo "### strata bench -m $4 $2 -f $3 -p 256 -n ${N:-128} --tg greedy --spec ngram" | tee -a "$R"
    timeout 150 "$B/strata" bench -m "$1" $2 -f "$3" -p 256 -n "${N:-128}" --bw-gib 0.5 \
        --tg greedy --spec ngram 2>&1 | grep -E "^(tg|spec|cache )|error" | tee -a "$R"
}
for text in ${TEXTS:-cli/serve.c tools/train/train_moe.py}; do
    for w in "${where[@]}"; do
        run $W1 "$w" "$text" w1.gguf
    done
done
if [ -n "${P30B:-}" ]; then
    gen_30b
    IFS=';' read -r -a w30 <<<"${WHERE30:---vram-budget 4G --residency copy}"
    for w in "${w30[@]}"; do
        run $M "$w" cli/serve.c 30b.gguf
    done
fi
