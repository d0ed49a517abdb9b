#!/bin/bash
# The training run of docs/default-model.md on the GPU machine, in phases that each fit one
# command (10 minutes), while the machine stays up between them:
#
#   tools/train/device-train.sh start   smoke run of the whole pipeline (20 s, so that a bug
#                                       after training costs no training), then the real run
#                                       started in its own session (it outlives the command),
#                                       then, unless SKIP_TESTS=1, bench/device-check.sh's GPU
#                                       tests beside it; then waits as `wait` does
#   tools/train/device-train.sh wait    waits for the run until WAIT_S seconds (default 560)
#                                       after the command's start;
#                                       once it has ended: its files to $OUT (the q4_k_m GGUF in
#                                       16 MB pieces gguf.partNN, the rest in train.tar), and
#                                       unless SKIP_W1=1 W1-real (each model inflated to 30b-a3b
#                                       shapes) benched for the new and the shipped model
#
# Binaries: .carry/bin.tar.xz (scripts/device-pack.sh; strata, stripped and static).
# The run: MINUTES (default 12) after TRIALS (shapes LAYERSxHIDDENxFFN, TRIAL_MINUTES each; the
# lowest held-out loss is trained), on CORPUS_MB of Python sources, with REPEAT_PENALTY written
# as the model's default.
set -u
. bench/device-env.sh
W=/dev/shm/strata-train
RUN=$W/run
phase=${1:-start}
deadline=$((SECONDS + ${WAIT_S:-560}))  # for the wait, counted from the command's start

finished() { [ -f "$W/rc" ]; }

progress() {
    grep -E "^(corpus|tokenizer|tokens|reference|shape|trial|trials|run)|held-out|check|strata " \
        "$W/train.log" 2>/dev/null | grep -vE '"step": [0-9]*[1-46-9]00,' | tail -${1:-6}
}

wait_run() {
    while ! finished && [ $SECONDS -lt $deadline ]; do
        sleep 5
    done
    progress 40
    finished || { echo "still training at ${SECONDS} s"; return 1; }
    echo "training ended, rc $(cat "$W/rc")"
}

collect() {
    local T=$OUT/train
    mkdir -p "$T"
    cp "$W/train.log" "$W/smoke.log" "$T/" 2>/dev/null
    cp "$RUN/training.json" "$RUN/check.json" "$RUN/heldout.txt" "$T/" 2>/dev/null
    cp "$RUN/hf/config.json" "$T/config.json" 2>/dev/null
    [ -f "$RUN/model-q4_k_m.gguf" ] && split -b 16000000 -d "$RUN/model-q4_k_m.gguf" "$OUT/gguf.part"
}

# W1-real for the new and the shipped model: pp512 / tg128 on held-out text, greedy; all
# resident and at 2 GiB (copy, hybrid).
w1() {
    local R=$OUT/train/w1.txt new=/dev/shm/w1-new.gguf old=/dev/shm/w1-old.gguf
    "$B/strata" gen --inflate "$RUN/model-q4_k_m.gguf" --preset 30b-a3b -q -o $new &
    "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -q -o $old
    wait
    for m in new old; do
        for args in "--device cuda" "--vram-budget 2G" "--vram-budget 2G --placement hybrid"; do
            echo "### $m: strata bench $args -p 512 -n 128 -f heldout.txt --tg greedy" | tee -a "$R"
            # shellcheck disable=SC2086
            timeout 120 "$B/strata" bench -m /dev/shm/w1-$m.gguf $args -p 512 -n 128 --bw-gib 0.5 \
                -f "$RUN/heldout.txt" --tg greedy 2>&1 |
                grep -E "^(pp|tg)[0-9]|hit rate|^backend|^floor" | tee -a "$R"
        done
    done
    rm -f $new $old
}

case $phase in
start)
    rm -rf "$W"
    mkdir -p "$W"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$W/train.log"
    python3 -c 'import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)' >>"$W/train.log" 2>&1
    python3 tools/train/train_moe.py --out "$W/smoke" --minutes 0.1 --corpus-mb 3 --tokenizer-mb 1 \
        --vocab 1024 --trials 2x256x32,1x256x64 --trial-minutes 0.05 --ref-corpus-mb 1.5 \
        --seq 64 --batch 8 --strata "$B/strata" >"$W/smoke.log" 2>&1 ||
        { echo "smoke run failed"; tail -30 "$W/smoke.log"; exit 1; }
    grep -E "trial|held-out|strata |check" "$W/smoke.log" | tail -8
    pen=()
    [ -n "${REPEAT_PENALTY:-}" ] && pen=(--repetition-penalty "$REPEAT_PENALTY")
    PYTHONUNBUFFERED=1 setsid sh -c "python3 tools/train/train_moe.py --out $RUN \
        --minutes ${MINUTES:-12} --trials ${TRIALS:-16x256x32,9x256x64,7x512x32} \
        --trial-minutes ${TRIAL_MINUTES:-0.75} --corpus-mb ${CORPUS_MB:-400} --ref-corpus-mb 160 \
        --strata $B/strata ${pen[*]} >>$W/train.log 2>&1; echo \$? >$W/rc" </dev/null >/dev/null 2>&1 &
    sleep 5
    if [ -z "${SKIP_TESTS:-}" ]; then
        SKIP_Q3N=1 SKIP_SERVE=1 bash bench/device-check.sh >"$OUT/check-console.txt" 2>&1
        grep -E "rc=|FAIL" "$OUT/check.txt"
    fi
    wait_run
    ;;
wait)
    wait_run || exit 0
    collect
    [ -n "${SKIP_W1:-}" ] || w1
    tar -cf "$OUT/train.tar" -C "$OUT" train && rm -rf "$OUT/train"
    ls -la "$OUT"
    ;;
*)
    echo "usage: $0 start|wait" >&2
    exit 2
    ;;
esac
