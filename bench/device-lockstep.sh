#!/usr/bin/env bash
# GPU machine: lockstep decode. First (unless SKIP_TESTS=1) the GPU tests, test_cuda_batch
# among them. Then strata bench --streams N for N in NS (default 1 2 4 8 16) on W1-real (the
# shipped model inflated to the 30b-a3b preset's shapes) under 8 GiB, 2 GiB and all resident,
# and with P30B=1 on the 30b-a3b preset (random weights) under 8 GiB and all resident: aggregate
# decode tok/s and expert bytes moved per generated token. Then strata batch on W1 at 8 GiB:
# 32 prompts, --streams 1 against 8. Binaries: .carry/bin.tar.xz (scripts/device-pack.sh).
set -u
. bench/device-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
R="$OUT/bench-lockstep.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
    for t in "$B"/test_*; do
        (cd tests && timeout 300 "$t" >"$OUT/$(basename "$t").log" 2>&1)
        echo "$(basename "$t") rc=$?"
        grep -E "lockstep|another order|FAIL" "$OUT/$(basename "$t").log" | head -40
    done
fi
W1=/dev/shm/w1.gguf
[ -f $W1 ] || "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -o $W1 2>&1 | tail -1
keep="^(tg|cache |lockstep |backend|--vram)"
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
sweep $W1 W1 "--vram-budget 8G" "--device cuda" "--vram-budget 2G"
if [ -n "${P30B:-}" ]; then
    gen_30b
    sweep $M 30b-a3b "--vram-budget 8G" "--device cuda"
fi
# strata batch end to end: 32 prompts (lines of the docs), 64 tokens each
python3 - >/tmp/batch-in.jsonl <<'PY'
import json, glob
lines = [l.strip() for f in sorted(glob.glob("docs/*.md")) for l in open(f) if len(l.strip()) > 60]
for i, l in enumerate(lines[:32]):
    print(json.dumps({"id": i, "prompt": l[:160]}))
PY
for n in 1 8; do
    rm -f /tmp/batch-out-$n.jsonl
    echo "### strata batch -m W1 --vram-budget 8G --temp 0 -n 64 --streams $n (32 prompts)" | tee -a "$R"
    /usr/bin/time -f "%e s wall" timeout 120 "$B/strata" batch -m $W1 --vram-budget 8G --temp 0 -n 64 \
        --streams $n --input /tmp/batch-in.jsonl -o /tmp/batch-out-$n.jsonl 2>&1 | tr '\r' '\n' | tail -3 | tee -a "$R"
done
cmp <(sed 's/,"timings":{[^}]*}//' /tmp/batch-out-1.jsonl) <(sed 's/,"timings":{[^}]*}//' /tmp/batch-out-8.jsonl) &&
    echo "batch: --streams 1 and 8 wrote the same texts" | tee -a "$R" ||
    python3 - <<'PY' | tee -a "$R"
import json
a = [json.loads(l) for l in open("/tmp/batch-out-1.jsonl")]
b = [json.loads(l) for l in open("/tmp/batch-out-8.jsonl")]
same = sum(x.get("text") == y.get("text") for x, y in zip(a, b))
print(f"batch: {same} of {len(a)} texts identical between --streams 1 and 8")
PY
