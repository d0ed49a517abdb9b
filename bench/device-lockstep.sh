#!/usr/bin/env bash
# GPU machine: lockstep decode. First (unless SKIP_TESTS=1) every GPU test in .carry/bin, then
# strata bench --streams N for N in NS (default 1 2 4 8 16) on W1-real (the shipped model
# inflated to the 30b-a3b preset's shapes) for each placement in W1_WHERE, and with P30B=1 on
# the 30b-a3b preset (random weights) for each in P30B_WHERE: aggregate and per-stream decode
# tok/s and expert bytes moved per generated token. Then (BATCH=1) strata batch on W1 at 8 GiB:
# 32 prompts, --streams 1 against 8, and --streams 8 all resident with --graph. TESTS names the
# test binaries to run (default: all). Binaries: .carry/bin.tar.xz (scripts/device-pack.sh).
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
R="$OUT/bench-lockstep.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
    for t in ${TESTS:-"$B"/test_*}; do
        t="$B/$(basename "$t")"
        (cd tests && timeout 300 "$t" >"$OUT/$(basename "$t").log" 2>&1)
        echo "$(basename "$t") rc=$?"
        grep -E "lockstep|another order|chunks|FAIL|attention rows .*16 rows" "$OUT/$(basename "$t").log" | head -40
    done
    grep "bench: moe" "$OUT/test_cuda_moe.log"
fi
W1=/dev/shm/w1.gguf
[ -f $W1 ] || "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -o $W1 2>&1 | tail -1
keep="^(tg|cache |lockstep |backend)"
sweep() { # model label, where...
    local m=$1 label=$2
    shift 2
    for where in "$@"; do
        for n in ${NS-1 2 4 8 16}; do
            echo "### strata bench -m $label $where -p 64 -n 64 --streams $n --tg random" | tee -a "$R"
            timeout 90 "$B/strata" bench -m $m $where -p 64 -n 64 --bw-gib 0.1 --streams $n --tg random 2>&1 |
                grep -E "$keep" | tee -a "$R"
        done
    done
}
IFS=, read -ra w1w <<<"${W1_WHERE:---device cuda,--device cuda --graph,--vram-budget 8G,--vram-budget 2G}"
sweep $W1 W1 "${w1w[@]}"
if [ -n "${P30B:-}" ]; then
    gen_30b
    IFS=, read -ra pw <<<"${P30B_WHERE:---device cuda,--device cuda --graph,--vram-budget 8G}"
    sweep $M 30b-a3b "${pw[@]}"
fi
[ -n "${BATCH:-}" ] || exit 0
# strata batch end to end: 32 prompts (lines of the docs), 64 tokens each
python3 - >/tmp/batch-in.jsonl <<'PY'
import json, glob
lines = [l.strip() for f in sorted(glob.glob("docs/*.md")) for l in open(f) if len(l.strip()) > 60]
for i, l in enumerate(lines[:32]):
    print(json.dumps({"id": i, "prompt": l[:160]}))
PY
batch() { # output name, streams, where...
    local o=$1 n=$2
    shift 2
    rm -f /tmp/batch-out-$o.jsonl
    echo "### strata batch -m W1 $* --temp 0 -n 64 --streams $n (32 prompts)" | tee -a "$R"
    /usr/bin/time -f "%e s wall" timeout 120 "$B/strata" batch -m $W1 "$@" --temp 0 -n 64 \
        --streams $n --input /tmp/batch-in.jsonl -o /tmp/batch-out-$o.jsonl 2>&1 | tr '\r' '\n' | tail -3 | tee -a "$R"
}
batch 1 1 --vram-budget 8G
batch 8 8 --vram-budget 8G
batch 8g 8 --device cuda --graph
python3 - <<'PY' | tee -a "$R"
import json
a = [json.loads(l) for l in open("/tmp/batch-out-1.jsonl")]
for o in ("8", "8g"):
    b = [json.loads(l) for l in open(f"/tmp/batch-out-{o}.jsonl")]
    same = sum(x.get("text") == y.get("text") for x, y in zip(a, b))
    print(f"batch: {same} of {len(a)} texts identical between --streams 1 and {o}")
PY
