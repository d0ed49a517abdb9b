# Sourced by the bench/device-*.sh scripts on the GPU machine: CUDA tools on PATH, OUT (the
# results folder), B (the stripped binaries in .carry/bin, unpacked from .carry/bin.tar.xz,
# which scripts/device-pack.sh makes from a commit), M (the 30b-a3b q4_k_m preset, made by
# gen_30b).
export PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-device-out}
mkdir -p "$OUT"
B=$PWD/.carry/bin
[ -f .carry/bin.tar.xz ] && tar -xJf .carry/bin.tar.xz -C .carry
M=/dev/shm/30b.gguf

# The preset in tmpfs (11-14 s on the H200's host), unless an earlier run left it there.
gen_30b() {
    [ -f $M ] || "$B/strata" gen --preset 30b-a3b --quant q4_k_m -q -o $M 2>&1 | tail -1
}

# ncu's per-kernel GPU time over a window of all-resident decode steps, then one line per
# kernel (mean µs, launches, grid, name) from bench/ncu-summary.py. $1: the output file, the
# rest: extra strata bench flags (e.g. --graph).
ncu_decode() {
    local f=$1
    shift
    timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip ${NCU_SKIP:-3000} \
        --launch-count ${NCU_COUNT:-1000} --print-summary per-kernel "$B/strata" bench -m $M --device cuda "$@" \
        -p 64 -n 16 --bw-gib 0.5 --tg random >"$f" 2>&1
    echo "ncu $* rc=$?"
    python3 bench/ncu-summary.py "$f"
}

# The placements the checks of one change run the preset in: all resident (res), 8 GiB on the
# GPU's cache in a graph (8G), 12 GiB with zero-copy misses in a graph (12G).
where_of() {
    case $1 in
    res) echo "--device cuda" ;;
    8G) echo "--vram-budget 8G --residency gpu --graph" ;;
    12G) echo "--vram-budget 12G --residency zerocopy --graph" ;;
    esac
}

# The md5 of the preset's greedy logits (7 prompt ids, 40 greedy steps) in placement $1 under
# the environment setting $2 (VAR=value), one line appended to $R.
logits_md5() {
    env $2 timeout 120 "$B/strata" logits -m $M $(where_of $1) --ids 1,2,3,4,5,6,7 --greedy 40 \
        -o /tmp/l.bin >/dev/null 2>&1
    echo "logits $1 $2 $(md5sum </tmp/l.bin | cut -c1-32)" | tee -a "$R"
    rm -f /tmp/l.bin
}

# `strata bench -m $M "${@:2}" -p 512 -n 128 --tg random` as one line labelled $1 (pp512,
# tg128, the placement's choice and the hit rate), appended to $R.
tg_line() {
    local l=$1
    shift
    echo "$l: $(timeout 150 "$B/strata" bench -m $M "$@" -p 512 -n 128 --tg random 2>&1 |
        grep -E '^tg128|^pp512|placement auto|hit rate' | tr -s ' ' | tr '\n' ' ')" | tee -a "$R"
}

# W1-real (the shipped model inflated to the 30b-a3b shapes) in tmpfs, and bench/heldout.py's
# held-out texts (/tmp/warm.txt: the even ones, /tmp/eval.txt: the odd ones), unless an earlier
# run left them there.
W1=/dev/shm/w1.gguf
w1_setup() {
    [ -f $W1 ] || "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -o $W1 2>&1 | tail -1
    [ -f /tmp/eval.txt ] || python3 bench/heldout.py /tmp/warm.txt /tmp/eval.txt --max-texts 160 >/dev/null
}

# `strata bench "$@"` by the binary $bin of .carry/bin (default strata) under BENCH_TIMEOUT
# seconds (default 90): the command, then the output lines matching $keep, appended to $R.
bench_keep() {
    echo "### ${bin:-strata} bench $*" | tee -a "$R"
    timeout "${BENCH_TIMEOUT:-90}" "$B/${bin:-strata}" bench "$@" 2>&1 | grep -E "$keep" | tee -a "$R"
}


# `strata bench "$@"` under the environment settings $1 (commas between them; X=1: none), as
# bench_keep does.
bench_env() {
    local e=$1
    shift
    echo "### $e bench $*" | tee -a "$R"
    env ${e//,/ } timeout "${BENCH_TIMEOUT:-90}" "$B/${bin:-strata}" bench "$@" 2>&1 | grep -E "$keep" | tee -a "$R"
}

# The test binaries named in $1 from .carry/bin, each with its rc and time, then the lines of
# its log matching $2 (FAIL lines and failures always), appended to $R; nothing when SKIP_TESTS=1.
run_tests() {
    [ -n "${SKIP_TESTS:-}" ] && return 0
    local t s
    for t in $1; do
        s=$(date +%s)
        (cd tests && timeout 250 "$B/$t" >"/tmp/$t.log" 2>&1)
        echo "$t rc=$? ($(($(date +%s) - s)) s)" | tee -a "$R"
        grep -E "FAIL|failed${2:+|$2}" "/tmp/$t.log" | head -20 | tee -a "$R"
    done
}

# llama.cpp's llama-bench (.carry/llama.tar.xz, made by bench/llama-build.sh) as $LB, with
# cuBLAS and the CUDA runtime of the machine's toolkit (or of its PyTorch) on the library path.
llama_setup() {
    [ -f .carry/llama.tar.xz ] && tar -xJf .carry/llama.tar.xz -C .carry
    LB=$PWD/.carry/llama/llama-bench
    local libs rt
    libs=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt -name "libcublasLt.so.13*" 2>/dev/null |
        head -1 | xargs -r dirname)
    rt=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt -name "libcudart.so.13*" 2>/dev/null |
        head -1 | xargs -r dirname)
    export LD_LIBRARY_PATH=$PWD/.carry/llama:$libs:$rt:${LD_LIBRARY_PATH:-}
    echo "llama-bench libraries: cublas from $libs, cudart from $rt"
}

# A script's results and time budget: R=$OUT/$1.txt, every b-*.txt (and the test logs) tarred
# into $OUT/$1-logs.tar on exit, and left() true while fewer than BUDGET_S (default $2) seconds
# have passed.
bench_budget() {
    R=$OUT/$1.txt
    trap "cd \"\$OUT\" && { tar -cf $1-logs.tar b-*.txt /tmp/test_*.log 2>/dev/null; rm -f b-*.txt; }" EXIT
    t0=$(date +%s)
    BUDGET_DEFAULT=$2
}
left() { [ $(($(date +%s) - t0)) -lt ${BUDGET_S:-$BUDGET_DEFAULT} ]; }

# One `strata bench --bw-gib 0.5 "$@"` by the binary $bin of .carry/bin (default strata) under a
# time budget: $1 a label, $2 environment settings (commas between them; X=1: none). Skipped
# once `left` (bench_budget's) says the budget is spent; the full output in $OUT/b-<label>.txt,
# the command, rc and the first KEEP_N (default 8) lines matching $keep appended to $R.
bench_one() {
    local lab=$1 e=$2
    shift 2
    left || return 0
    echo "### [$lab] $e $*" | tee -a "$R"
    env ${e//,/ } timeout 100 "$B/${bin:-strata}" bench --bw-gib 0.5 "$@" >"$OUT/b-$lab.txt" 2>&1
    echo "rc=$?" | tee -a "$R"
    grep -E "$keep" "$OUT/b-$lab.txt" | head -"${KEEP_N:-8}" | tee -a "$R"
}
