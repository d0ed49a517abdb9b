#!/usr/bin/env bash
# GPU machine, one call for what the open issues still need measured there (about 8 minutes):
#   1. every GPU test in .carry/bin (TESTS names some; SKIP_TESTS=1 none);
#   2. gpt-oss, qwen3next and qwen35moe against transformers: tests/hf/compare_gptoss.py and
#      compare_qwen3next.py (strata on the CPU, torch on the GPU), their CI references in
#      logs/hf-gptoss/ci-ref-gptoss/ and logs/hf-qwen3next/ci-ref-{qwen3next,qwen35moe}/ (in
#      $OUT/logs.tar, with every log);
#   3. speculative decoding on SPEC_MODELS (default w1: W1-real, the shipped model inflated to
#      the 30b-a3b shapes; 30b: the 30b-a3b preset) under WHERE (default --vram-budget 4G, then
#      2G, 8G and resident): plain against --spec ngram and against --spec draft with the
#      shipped model as the draft (on the GPU), greedy generation after the first 256 tokens
#      of SPEC_TEXT (default cli/serve.c; KINDS: the draft kinds, default "ngram draft");
#      q3n: the qwen3next 80b-a3b preset cut to 8 layers with an MTP block, plain against
#      --spec ngram and --spec mtp, and greedy `strata run` text with --spec mtp compared
#      with plain (--graph, and --vram-budget 4G);
#   4. unless SKIP_SERVE=1, bench/device-serve.sh (strata serve under load: the 30b-a3b preset
#      at 8 GiB, W1-real at 2 GiB);
#   5. when tests/data/npm was carried, tools/tokref/hf_check.py (the tokenizer corpora against
#      Hugging Face tokenizers, gpt-oss's o200k included).
# Binaries: .carry/bin.tar.xz (scripts/device-pack.sh).
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
# a call brings back only a few files: logs and the HF outputs come back packed in logs.tar
L=$OUT/logs
mkdir -p "$L"
trap 'tar -cf "$OUT/logs.tar" -C "$OUT" logs && rm -rf "$L"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
ldd "$B/strata" | grep "not found"
if [ -z "${SKIP_TESTS:-}" ]; then
    for t in ${TESTS:-"$B"/test_*}; do
        t="$B/$(basename "$t")"
        (cd tests && timeout "${TEST_TIMEOUT:-300}" "$t" >"$L/$(basename "$t").log" 2>&1)
        echo "$(basename "$t") rc=$?"
        grep -E "FAIL" "$L/$(basename "$t").log" | head -20
    done
fi
if [ -z "${SKIP_HF:-}" ]; then
    timeout 240 python3 tests/hf/compare_gptoss.py --strata "$B/strata" --out "$L/hf-gptoss" \
        --device cuda --threads 16 >"$L/hf-gptoss.log" 2>&1
    echo "compare_gptoss rc=$?"
    tail -25 "$L/hf-gptoss.log"
    timeout 300 python3 tests/hf/compare_qwen3next.py --strata "$B/strata" \
        --out "$L/hf-qwen3next" --device cuda --threads 16 >"$L/hf-qwen3next.log" 2>&1
    echo "compare_qwen3next rc=$?"
    tail -40 "$L/hf-qwen3next.log"
fi
W1=/dev/shm/w1.gguf
R="$OUT/bench-spec.txt"
IFS=, read -ra where <<<"${WHERE:---vram-budget 4G,--vram-budget 2G,--vram-budget 8G,--device cuda}"
for model in ${SPEC_MODELS:-w1}; do
    kinds=${KINDS:-ngram draft}
    if [ "$model" = 30b ]; then
        gen_30b
        f=$M
    elif [ "$model" = q3n ]; then
        f=/dev/shm/q3n-mtp.gguf
        kinds="ngram mtp"
        [ -f $f ] || "$B/strata" gen --arch qwen3next --preset 80b-a3b --layers 8 --mtp 1 -q -o $f 2>&1 | tail -1
        for w in "--device cuda --graph" "--vram-budget 4G"; do
            # shellcheck disable=SC2086
            for spec in "" "--spec mtp"; do
                timeout 120 "$B/strata" run -m $f $w --temp 0 -n 64 -p "def main():" $spec \
                    >"$L/q3n-run${spec:+-mtp}.txt" 2>"$L/q3n-run${spec:+-mtp}.err"
            done
            if cmp -s "$L/q3n-run.txt" "$L/q3n-run-mtp.txt"; then
                echo "q3n $w: --spec mtp greedy text identical" | tee -a "$R"
            else
                echo "q3n $w: --spec mtp CHANGED the greedy text" | tee -a "$R"
            fi
            grep -h "^speculative" "$L/q3n-run-mtp.err" | tee -a "$R"
        done
    else
        [ -f $W1 ] || "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -o $W1 2>&1 | tail -1
        f=$W1
    fi
    for w in "${where[@]}"; do
        for kind in $kinds; do
            extra=()
            [ $kind = draft ] && extra=(-md models/strata-default.gguf --draft-device cuda)
            echo "### strata bench -m $model $w -f ${SPEC_TEXT:-cli/serve.c} -p 256 -n 128 --tg greedy --spec $kind ${extra[*]}" | tee -a "$R"
            timeout 120 "$B/strata" bench -m $f $w -f "${SPEC_TEXT:-cli/serve.c}" -p 256 -n 128 \
                --bw-gib 0.5 --tg greedy --spec $kind "${extra[@]}" 2>&1 |
                grep -E "^(tg|spec|cache |backend)|draft model|error" | tee -a "$R"
        done
    done
done
[ -n "${SKIP_SERVE:-}" ] || bash bench/device-serve.sh
if [ -d tests/data/npm/tokenizer-gptoss ]; then
    python3 tools/tokref/hf_check.py \
        tests/data/npm/tokenizer-qwen3/models/tokenizer.json tests/data/tokenizer/qwen3-expected.jsonl \
        tests/data/npm/tokenizer-gptoss/models/tokenizer.json tests/data/tokenizer/gptoss-expected.jsonl \
        tests/data/npm/tokenizer-deepseek_v3/models/tokenizer.json tests/data/tokenizer/deepseek_v3-expected.jsonl \
        >"$OUT/hf-tokenizers.log" 2>&1
    echo "hf_check rc=$?"
    tail -5 "$OUT/hf-tokenizers.log"
fi
