#!/usr/bin/env bash
# GPU machine: residency profiles and prefetch. W1-real = the shipped model inflated to the
# 30b-a3b preset's per-layer shapes (routing kept), warmed up on half of 160 texts of its
# held-out text (bench/heldout.py) and measured on the other half, at each of BUDGETS (default
# 2G 4G):
#   - the first 64 greedy tokens after a 64-token prompt: cold cache, restored profile
#     (seeding the cache), restored and frozen;
#   - steady decode (256 greedy tokens after 512): plain cache, --prefetch, --prefetch-depth 2,
#     the profile, the frozen profile, the profile with --prefetch, hybrid, hybrid with the
#     profile;
# with P30B=1 also the 30b-a3b preset (random weights and decode ids) at 4 and 8 GiB: plain,
# profile, profile + prefetch. QUICK=1 keeps the cold / seeded / frozen runs only. First the
# GPU tests and the hostile input table, unless SKIP_TESTS=1. Binaries: .carry/bin.tar.xz
# (scripts/device-pack.sh).
set -u
. bench/device-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -z "${SKIP_TESTS:-}" ]; then
    for t in test_cuda_gather test_cuda_residency test_cuda_backend test_cuda_moe test_cuda_ops test_cuda_matmul test_api; do
        [ -x "$B/$t" ] || continue
        s=$(date +%s)
        timeout 300 "$B/$t" >/tmp/$t.log 2>&1; echo "$t rc=$? ($(($(date +%s) - s)) s)" | tee -a "$OUT/tests.log"
        cat /tmp/$t.log >>"$OUT/tests.log"
        grep -E "FAIL|failed" /tmp/$t.log | head -10
    done
    timeout 300 bash tests/cli_hostile.sh "$B/strata" tests/data >"$OUT/cli_hostile.log" 2>&1
    echo "cli_hostile rc=$? ($(tail -1 "$OUT/cli_hostile.log"))"
    grep FAIL "$OUT/cli_hostile.log" | head -10
fi
R="$OUT/bench-profiles.txt"
keep="^(pp|tg|cache |prefetch |profile |cpu lane|floor )|probe|planned|replaying|error|warmup"
run() { echo "### strata bench $*" | tee -a "$R"; timeout 120 "$B/strata" bench "$@" 2>&1 | grep -E "$keep" | tee -a "$R"; }
W1=/dev/shm/w1.gguf
[ -f $W1 ] || "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -o $W1 2>&1 | tail -1
[ -f /tmp/warm.txt ] || python3 bench/heldout.py /tmp/warm.txt /tmp/eval.txt --max-texts 160
for b in ${BUDGETS-2G 4G}; do
    P=/tmp/w1-$b.profile
    echo "### profile warmup at $b" | tee -a "$R"
    s=$(date +%s)
    "$B/strata" profile warmup -m $W1 --vram-budget $b --prompts /tmp/warm.txt --separator '<|sep|>' \
        --max-tokens 256 --decode 32 -o $P 2>&1 | grep -E "replaying|texts" | tail -2 | tee -a "$R"
    echo "warmup wall $(($(date +%s) - s)) s" | tee -a "$R"
    "$B/strata" profile show $P | head -6 | tee -a "$R"
    F=(-m $W1 --vram-budget $b -f /tmp/eval.txt --tg greedy --bw-gib 0.25)
    run "${F[@]}" -p 64 -n 64
    run "${F[@]}" -p 64 -n 64 --profile $P
    run "${F[@]}" -p 64 -n 64 --profile $P --profile-freeze
    run "${F[@]}" -p 512 -n 256
    [ -n "${QUICK:-}" ] || run "${F[@]}" -p 512 -n 256 --prefetch
    [ -n "${QUICK:-}" ] || run "${F[@]}" -p 512 -n 256 --prefetch-depth 2
    run "${F[@]}" -p 512 -n 256 --profile $P
    run "${F[@]}" -p 512 -n 256 --profile $P --profile-freeze
    [ -n "${QUICK:-}" ] && continue
    run "${F[@]}" -p 512 -n 256 --profile $P --prefetch
    run "${F[@]}" -p 512 -n 256 --placement hybrid
    run "${F[@]}" -p 512 -n 256 --placement hybrid --profile $P
done
if [ -n "${P30B:-}" ]; then
    gen_30b
    for b in 4G 8G; do
        P=/tmp/30b-$b.profile
        echo "### 30b-a3b profile warmup at $b" | tee -a "$R"
        "$B/strata" profile warmup -m $M --vram-budget $b --prompts /tmp/warm.txt --separator '<|sep|>' \
            --max-tokens 128 --decode 16 -o $P 2>&1 | grep -E "replaying|texts" | tail -2 | tee -a "$R"
        G=(-m $M --vram-budget $b --tg random --bw-gib 0.25 -p 512 -n 128)
        run "${G[@]}"
        run "${G[@]}" --profile $P
        run "${G[@]}" --profile $P --prefetch
    done
fi
cp /tmp/*.profile "$OUT/" 2>/dev/null
true
