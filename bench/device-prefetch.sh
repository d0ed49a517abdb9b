#!/usr/bin/env bash
# GPU machine: the expert cache's prediction against the plain cache on W1-real (the shipped
# model inflated to the 30b-a3b shapes, bench/heldout.py's odd texts), steady decode (256
# greedy tokens after 512) at each of BUDGETS (default 1G 2G), plain and --prefetch
# alternated REPS times (default 2) in one process's lease; first TESTS (default
# test_cuda_residency test_cuda_backend) from .carry/bin. Results in $OUT/prefetch.txt.
set -u
. bench/device-env.sh
export STRATA_TEST_DATA=$PWD/tests/data
R=$OUT/prefetch.txt
for t in ${TESTS-test_cuda_residency test_cuda_backend}; do
    (cd tests && timeout 200 "$B/$t" >"$OUT/$t.log" 2>&1)
    echo "$t rc=$?" | tee -a "$R"
    grep FAIL "$OUT/$t.log" | head -5
done
W1=/dev/shm/w1.gguf
s=$(date +%s)
[ -f $W1 ] || "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -o $W1 2>&1 | tail -1
echo "W1-real ready in $(($(date +%s) - s)) s"
[ -f /tmp/eval.txt ] || python3 bench/heldout.py /tmp/warm.txt /tmp/eval.txt --max-texts 160 >/dev/null
for b in ${BUDGETS:-1G 2G}; do
    for i in $(seq "${REPS:-2}"); do
        for p in "" --prefetch; do
            echo "### strata bench -m w1.gguf --vram-budget $b -f eval.txt --tg greedy -p 512 -n 256 $p ($i)" | tee -a "$R"
            # shellcheck disable=SC2086
            timeout 60 "$B/strata" bench -m $W1 --vram-budget $b -f /tmp/eval.txt --tg greedy \
                --bw-gib 0.25 -p 512 -n 256 $p 2>&1 | grep -E "^(pp|tg)[0-9]|^cache |^prefetch " | tee -a "$R"
        done
    done
done
