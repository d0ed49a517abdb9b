#!/usr/bin/env bash
# GPU machine: residency profiles and prefetch depth. W1-real = the shipped model inflated to
# the 30b-a3b preset's per-layer shapes (routing kept), warmed up on half of its held-out text
# (bench/heldout.py) and measured on the other half, at --vram-budget 2 and 4 GiB:
#   - time to first token and the first 64 greedy decode tokens, cold cache against a restored
#     profile (frozen, and seeding the cache);
#   - steady decode (256 greedy tokens) for the plain cache, --prefetch, --prefetch-depth 2..4,
#     the profile, the profile with prefetch, and hybrid with and without the profile;
# then (unless SKIP_30B=1) the 30b-a3b preset (random weights, random decode ids) at 4 and
# 8 GiB: plain cache, profile, profile + prefetch depth 2. First the GPU tests and the hostile
# input table (unless SKIP_TESTS=1). Binaries: .carry/bin.tar.xz (scripts/device-pack.sh).
set -u
. bench/device-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -z "${SKIP_TESTS:-}" ]; then
    for t in test_cuda_gather test_cuda_residency test_cuda_backend test_cuda_moe test_cuda_ops test_cuda_matmul test_api; do
        [ -x "$B/$t" ] || continue
        timeout 300 "$B/$t" >/tmp/$t.log 2>&1; echo "$t rc=$?" | tee -a "$OUT/tests.log"
        cat /tmp/$t.log >>"$OUT/tests.log"
        grep -E "FAIL|failed" /tmp/$t.log | head -10
    done
    timeout 300 bash tests/cli_hostile.sh "$B/strata" tests/data >"$OUT/cli_hostile.log" 2>&1
    echo "cli_hostile rc=$? ($(tail -1 "$OUT/cli_hostile.log"))"
    grep FAIL "$OUT/cli_hostile.log" | head -10
fi
R="$OUT/bench-profiles.txt"
: >"$R"
keep="^(pp|tg|cache |prefetch |profile |cpu lane|floor )|probe|restor|planned|error"
run() { echo "### strata bench $*" | tee -a "$R"; timeout 200 "$B/strata" bench "$@" 2>&1 | grep -E "$keep" | tee -a "$R"; }
W1=/dev/shm/w1.gguf
[ -f $W1 ] || "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -o $W1 2>&1 | tail -1
python3 bench/heldout.py /tmp/warm.txt /tmp/eval.txt
for b in ${BUDGETS-2G 4G}; do
    P=/tmp/w1-$b.profile
    echo "### profile warmup at $b" | tee -a "$R"
    /usr/bin/time -f "warmup wall %e s" "$B/strata" profile warmup -m $W1 --vram-budget $b \
        --prompts /tmp/warm.txt --separator '<|sep|>' --max-tokens 256 --decode 32 -o $P 2>&1 | tail -2 | tee -a "$R"
    "$B/strata" profile show $P | head -24 | tee -a "$R"
    F=(-m $W1 --vram-budget $b -f /tmp/eval.txt --tg greedy --bw-gib 0.5)
    # the first 64 tokens: cold, restored and frozen, restored as a seed
    run "${F[@]}" -p 512 -n 64
    run "${F[@]}" -p 512 -n 64 --profile $P --profile-freeze
    run "${F[@]}" -p 512 -n 64 --profile $P
    # steady decode
    run "${F[@]}" -p 512 -n 256
    run "${F[@]}" -p 512 -n 256 --prefetch
    for d in 2 3 4; do run "${F[@]}" -p 512 -n 256 --prefetch-depth $d; done
    run "${F[@]}" -p 512 -n 256 --profile $P --profile-freeze
    for d in 1 2 3; do run "${F[@]}" -p 512 -n 256 --profile $P --profile-freeze --prefetch-depth $d; done
    run "${F[@]}" -p 512 -n 256 --placement hybrid
    run "${F[@]}" -p 512 -n 256 --placement hybrid --profile $P --profile-freeze
done
if [ -z "${SKIP_30B:-}" ]; then
    gen_30b
    for b in 4G 8G; do
        P=/tmp/30b-$b.profile
        echo "### 30b-a3b profile warmup at $b" | tee -a "$R"
        "$B/strata" profile warmup -m $M --vram-budget $b --prompts /tmp/warm.txt --separator '<|sep|>' \
            --max-tokens 256 --decode 32 -o $P 2>&1 | tail -1 | tee -a "$R"
        G=(-m $M --vram-budget $b --tg random --bw-gib 0.5 -p 512 -n 128)
        run "${G[@]}"
        run "${G[@]}" --profile $P --profile-freeze
        run "${G[@]}" --profile $P --profile-freeze --prefetch-depth 2
    done
fi
cp /tmp/*.profile "$OUT/" 2>/dev/null
