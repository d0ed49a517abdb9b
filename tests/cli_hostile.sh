#!/usr/bin/env bash
# Hostile command lines and input files for every strata command: a table of cases, each the
# exit code and a piece of stderr it must give. Bad numbers ('abc', '1e3', '0x', nan, overflow,
# negatives) exit 2 naming the option; -t above the CPUs is capped with a notice; prompt files
# that are directories, empty or hold a NUL byte are refused, pipes and '-' are read; no case
# may die of a signal (exit >= 128) or hang (timeout's 124). Valid controls run beside them.
# Runs on the shipped default model in a few seconds (also under ASan).
set -uo pipefail
strata=$1
model="$2/../../models/strata-default.gguf"
[ -r "$model" ] || { echo "skip: no $model"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'def f(x):' >"$tmp/prompt.txt"
: >"$tmp/empty.txt"
printf 'ab\0cd' >"$tmp/nul.txt"
printf 'def f(x):\xff\xfe return' >"$tmp/badutf8.txt"
printf '\n\n' >"$tmp/blank.txt"
mkdir "$tmp/dir"
head -c 20000 /dev/zero | tr '\0' 'a' >"$tmp/longline.txt"
printf '/exit\n' >>"$tmp/longline.txt"
printf 'hello\n/exit\n' >"$tmp/chat.txt"
printf 'a\0b\n/exit\n' >"$tmp/chatnul.txt"
M=(-m "$model")
fails=0 n=0

# check NAME CODE 'stderr piece' [stdout piece]: judges the run whose output is in $tmp/out, err.
check() {
    local code=$1 want=$2 got=$3 pat=$4 what=$5
    n=$((n + 1))
    if [ "$got" -ge 124 ]; then
        echo "FAIL: $what: exit $got (signal or timeout)"; fails=$((fails + 1)); return
    fi
    if [ "$got" != "$code" ]; then
        echo "FAIL: $what: exit $got, not $code: $(head -c 400 "$tmp/err")"
        fails=$((fails + 1)); return
    fi
    if [ -n "$pat" ] && ! grep -qF -- "$pat" "$tmp/err"; then
        echo "FAIL: $what: no '$pat' on stderr: $(head -c 400 "$tmp/err")"
        fails=$((fails + 1)); return
    fi
    echo "ok: $what -> $got: $(grep -F -- "$pat" "$tmp/err" | head -1 | head -c 160)"
}

# t CODE 'stderr piece' ARGS...: runs strata ARGS with stdin from /dev/null.
t() {
    local code=$1 pat=$2; shift 2
    timeout 60 "$strata" "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
    check "$code" "$pat" $? "$pat" "strata $*"
}

# tin FILE CODE 'stderr piece' ARGS...: the same with stdin from FILE (a pipe).
tin() {
    local in=$1 code=$2 pat=$3; shift 3
    cat "$in" | timeout 60 "$strata" "$@" >"$tmp/out" 2>"$tmp/err"
    check "$code" "$pat" "${PIPESTATUS[1]}" "$pat" "strata $* < $(basename "$in")"
}

ncpu=$(getconf _NPROCESSORS_ONLN)
run=(run --device cpu -n 1 -t 1)

# strata run (and chat: the same options): numbers
t 2 "-s wants an integer in 0..18446744073709551615, not 'abc'" "${run[@]}" -p x -s abc
t 2 "-s wants an integer in 0..18446744073709551615, not '1e3'" "${run[@]}" -p x -s 1e3
t 2 "--seed wants an integer in 0..18446744073709551615, not '-1'" "${run[@]}" -p x --seed -1
t 2 "-s wants an integer in 0..18446744073709551615, not '18446744073709551616'" \
    "${run[@]}" -p x -s 18446744073709551616
t 2 "-n wants an integer in 0..1048576, not '-5'" run -p x -n -5
t 2 "-t wants an integer in 1..4096, not '0x'" run -p x -t 0x
t 2 "-t wants an integer in 1..4096, not ''" run -p x -t ""
t 2 "-t wants an integer in 1..4096, not ' 4'" run -p x -t " 4"
t 2 "-t wants an integer in 1..4096, not '100000'" run -p x -t 100000
t 2 "-c wants an integer in 16..1048576, not '99999999999999999999'" run -p x -c 99999999999999999999
t 2 "--temp wants a number in 0..100, not 'nan'" run -p x --temp nan
t 2 "--temp wants a number in 0..100, not 'inf'" run -p x --temp inf
t 2 "--top-p wants a number in 0..1, not '0.5x'" run -p x --top-p 0.5x
t 2 "--prefetch-top wants an integer in 1..32, not '0'" run -p x --prefetch-top 0
t 2 "--vram-budget wants a size such as 8G" run -p x --vram-budget 4X
t 2 "--vram-budget wants a size such as 8G" run -p x --vram-budget -1G
t 2 "static:N (N >= 1), not 'static:1x'" run -p x --placement static:1x
# the host tier
t 2 "--host-budget wants a size such as 8G" run -p x --device cpu --host-budget 1Q
t 2 "--host-budget runs on the CPU device, or on CUDA under --vram-budget (the expert cache) or with --placement static" run -p x --host-budget 1G
t 2 "add one of --device cpu, --vram-budget or --placement static" run -p x --host-budget 1G --placement hybrid
t 2 "not with --residency zerocopy" run -p x --host-budget 1G --vram-budget 4G --residency zerocopy
t 2 "--host-io auto, uring or pread, not 'aio'" "${run[@]}" -p x --host-budget 1G --host-io aio
t 2 "--host-io, --host-buffered and --host-read-ahead need --host-budget" "${run[@]}" -p x --host-buffered
t 2 "--no-mmap copies them all to memory" "${run[@]}" -p x --host-budget 1G --no-mmap
t 1 "one layer has 128: at least" "${run[@]}" -p x --host-budget 1M
t 0 "generation: 1 tokens" "${run[@]}" -p x --host-budget 64M --host-io pread --host-buffered
t 0 "generation: 1 tokens" "${run[@]}" -p x --host-budget 64M --host-read-ahead
t 0 "strata: --host-budget auto: " "${run[@]}" -p x --host-budget auto -v
t 0 "generation: 1 tokens" "${run[@]}" -p x --host-budget 0
t 0 "host tier: the disk as learned from its reads: " "${run[@]}" -p x --host-budget 64M --stats
t 2 "-s wants an integer" chat -s abc
# strata run: prompt files
t 2 "-f $tmp/dir: is a directory" "${run[@]}" -f "$tmp/dir"
t 2 "-f $tmp/empty.txt: the file is empty" "${run[@]}" -f "$tmp/empty.txt"
t 2 "-f $tmp/nul.txt: a NUL byte at byte offset 2" "${run[@]}" -f "$tmp/nul.txt"
t 0 "generation: 1 tokens" "${run[@]}" -f "$tmp/badutf8.txt" # invalid UTF-8: kept as bytes
t 1 "-f $tmp/missing.txt: No such file" "${run[@]}" -f "$tmp/missing.txt"
tin "$tmp/prompt.txt" 0 "generation: 1 tokens" "${run[@]}" -f /dev/stdin
tin "$tmp/prompt.txt" 0 "generation: 1 tokens" "${run[@]}" -f -
timeout 60 "$strata" "${run[@]}" -f <(printf 'def f(x):') >"$tmp/out" 2>"$tmp/err"
check 0 "" $? "generation: 1 tokens" "strata run -f <(printf ...)"
# threads above the CPUs: capped, with a notice
t 0 "-t 4096 is more than the $ncpu CPUs here; using $ncpu" run --device cpu -n 1 -p x -t 4096
# -c above the trained context: a warning, not an error
t 0 "is above the" "${run[@]}" -p x -c 2048
# valid controls
t 0 "generation: 2 tokens" run --device cpu -t 2 -p "def f(x):" -s 7 -n 2
t 0 "generation: 2 tokens" run --device cpu -t 2 -p "def f(x):" -s 0x10 -n 2 --temp 0.5
grep -q "a NUL byte is refused" <(timeout 60 "$strata" run --help) ||
    { echo "FAIL: run --help does not say a NUL byte is refused"; fails=$((fails + 1)); }

# strata chat: a piped transcript has no '> ' prompts; a line longer than any buffer is read
# whole (and refused by the context, the session going on)
tin "$tmp/chat.txt" 0 "" chat --device cpu -t 1 -n 2 --temp 0
t 2 "--chat is an option of strata run" chat --device cpu -t 1 --chat
if grep -q '^> ' "$tmp/out"; then echo "FAIL: chat printed '> ' to a pipe"; fails=$((fails + 1)); fi
tin "$tmp/chatnul.txt" 0 "a NUL byte at byte offset 1 of this message" chat --device cpu -t 1
tin "$tmp/longline.txt" 0 "does not fit in the context" chat --device cpu -t 1 -c 64

# strata bench
bench=(bench "${M[@]}" -t 1 -p 4 -n 1 --bw-gib 0.01)
t 2 "-p wants an integer in 1..1048576, not 'abc'" bench "${M[@]}" -p abc
t 2 "-n wants an integer in 1..1048576, not '0'" bench "${M[@]}" -n 0
t 2 "-t wants an integer in 0..4096, not '-1'" bench "${M[@]}" -t -1
t 2 "--bw-gib wants a probe of at most half the physical memory" bench "${M[@]}" --bw-gib 100000
t 2 "--bw-gib wants a number in 0..1048576, not 'nan'" bench "${M[@]}" --bw-gib nan
t 2 "--bw-gib wants a positive number of GiB, not '0'" bench "${M[@]}" --bw-gib 0
t 2 "-f $tmp/dir: is a directory" "${bench[@]}" -f "$tmp/dir"

# strata stats-routing
sr=(stats-routing "${M[@]}" -t 1)
t 2 "--prompts $tmp/dir: is a directory" "${sr[@]}" --prompts "$tmp/dir"
t 2 "holds no text" "${sr[@]}" --prompts "$tmp/empty.txt"
t 2 "holds no text" "${sr[@]}" --prompts "$tmp/blank.txt"
t 2 "more than half the physical memory" "${sr[@]}" --prompts "$tmp/prompt.txt" \
    --max-tokens 1000000000
t 2 "--max-tokens wants an integer in 1..1073741823, not '1x'" "${sr[@]}" --prompts x \
    --max-tokens 1x
t 2 "-t wants an integer in 0..4096, not 'x'" stats-routing -t x

# strata logits
t 2 "--greedy wants an integer in 0..1048576, not '-1'" logits "${M[@]}" -p x --greedy -1
t 2 "--threads wants an integer in 1..4096, not 'abc'" logits "${M[@]}" -p x -t abc
t 2 "--ids expects comma-separated" logits "${M[@]}" --ids 1,x
t 2 "--ids expects comma-separated" logits "${M[@]}" --ids "1, 2"
t 0 "" logits "${M[@]}" -t 1 --ids 1,2

# strata gen, convert, bench-kernels, inspect
t 2 "--seed wants an integer in 0..18446744073709551615, not '-5'" gen --seed -5 -o "$tmp/g"
t 2 "--threads wants an integer in 1..1024, not '0x'" gen --threads 0x -o "$tmp/g"
t 2 "--layers wants an integer in 1..100000, not '1e3'" gen --layers 1e3 -o "$tmp/g"
t 2 "--threads wants an integer in 1..4096, not 'abc'" convert --threads abc -o "$tmp/c" "$tmp"
t 2 "--seconds wants a number in 0..3600, not 'nan'" bench-kernels --seconds nan
t 2 "--seconds wants a duration in seconds, 0 < S < 3600, not '0'" bench-kernels --seconds 0
t 2 "--rows wants an integer in 1..4294967296, not '1e3'" bench-kernels --rows 1e3
t 2 "--batch wants an integer in 1.." bench-kernels --batch 99
t 0 "" inspect
t 2 "unexpected argument '--bogus'" inspect --bogus
t 0 "" inspect "$model"

# tpath DIR CODE 'stderr piece' ARGS...: t with PATH=DIR (a PATH with or without gnuplot).
tpath() {
    local dir=$1 code=$2 pat=$3; shift 3
    timeout 60 env PATH="$dir" "$strata" "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
    check "$code" "$pat" $? "$pat" "PATH=$dir strata $*"
}

# options only the CUDA backend takes, on the CPU backend: refused, naming the option
needs="needs the CUDA backend (--device cuda); this run uses the CPU"
cpu=(--device cpu -t 1)
t 2 "strata run: --graph $needs" run "${cpu[@]}" -p x --graph
t 2 "strata run: --prefetch $needs" run "${cpu[@]}" -p x --prefetch
t 2 "strata run: --stats $needs" run "${cpu[@]}" -p x --stats
t 2 "strata run: --stats-json $needs" run "${cpu[@]}" -p x --stats-json "$tmp/s.json"
t 2 "strata run: --residency $needs" run "${cpu[@]}" -p x --residency zerocopy
t 2 "strata run: --streaming $needs" run "${cpu[@]}" -p x --streaming kernel
t 2 "strata run: --placement $needs" run "${cpu[@]}" -p x --placement static:2
t 2 "strata chat: --stats $needs" chat "${cpu[@]}" --stats
t 2 "strata bench: --graph $needs" bench "${cpu[@]}" --graph
t 2 "strata bench: --prefetch $needs" bench -t 1 --prefetch
t 2 "strata bench: --placement $needs" bench "${cpu[@]}" --placement stream
t 2 "strata logits: --streaming $needs" logits "${cpu[@]}" -p x --streaming dma
t 2 "strata logits: --graph $needs" logits -t 1 -p x --graph
[ -e "$tmp/s.json" ] && { echo "FAIL: a refused run wrote --stats-json"; fails=$((fails + 1)); }
# chat takes no prompt: -p/-f are refused, and its --help does not offer them
t 2 "strata chat: -p: chat takes no prompt" chat "${cpu[@]}" -p hi
t 2 "strata chat: --file: chat takes no prompt" chat "${cpu[@]}" --file "$tmp/prompt.txt"
timeout 60 "$strata" chat --help >"$tmp/out" 2>&1
if grep -qE -- '--prompt|--file' "$tmp/out"; then
    echo "FAIL: chat --help lists -p/-f"; fails=$((fails + 1))
fi
# no GPU here: --device auto means the CPU, so the same options are refused; --device cuda
# and strata info say that no CUDA device was found (a build with CUDA only)
info=$(timeout 60 "$strata" info 2>&1)
if grep -q '^cuda [0-9]' <<<"$info"; then
    echo "skip: a GPU is present; the no-GPU cases do not apply"
else
    t 2 "strata run: --graph $needs (no CUDA device found)" run -t 1 -p x --device auto --graph
    t 2 "strata chat: --prefetch $needs (no CUDA device found)" chat -t 1 --prefetch
    t 2 "strata logits: --residency $needs" logits -t 1 -p x --device auto --residency copy
    if grep -q 'without the CUDA backend' <<<"$info"; then
        echo "skip: built without CUDA; no driver message to check"
    else
        grep -q '^cuda: *none (no CUDA device found' <<<"$info" ||
            { echo "FAIL: strata info: $info"; fails=$((fails + 1)); }
        t 1 "no CUDA device found" run -t 1 -p x -n 1 --device cuda
    fi
fi

# the shipped default model without -m / FILE
t 0 "" logits -t 1 --ids 1,2
t 0 "" bench -t 1 -p 4 -n 1 --bw-gib 0.01
t 0 "" stats-routing -t 1 --prompts "$tmp/prompt.txt" --max-tokens 16
for c in bench logits stats-routing inspect; do
    grep -q "default: the shipped default model\|defaults to the shipped default model" \
        <(timeout 60 "$strata" "$c" --help) ||
        { echo "FAIL: $c --help does not name the default model"; fails=$((fails + 1)); }
done

# stats-routing --plot: gnuplot is looked for on PATH before the run
mkdir "$tmp/nobin" "$tmp/bin"
printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/gnuplot"
chmod +x "$tmp/bin/gnuplot"
tpath "$tmp/nobin" 2 "--plot needs gnuplot, which is not on PATH (Debian/Ubuntu: apt-get install gnuplot-nox" \
    stats-routing -t 1 --prompts "$tmp/prompt.txt" --plot "$tmp/p.png"
tpath "$tmp/bin" 2 "--prompts $tmp/missing.txt: No such file or directory" \
    stats-routing -t 1 --prompts "$tmp/missing.txt" --plot "$tmp/p.png"
# texts from standard input
tin "$tmp/prompt.txt" 0 "" stats-routing -t 1 --prompts - --max-tokens 16

# strata profile: warmup (counts on the CPU), show, and what is refused
w=(profile warmup -t 1 --device cpu --max-tokens 16 --decode 2)
printf 'def f(x):\n    return x\nhello world\n' >"$tmp/texts.txt"
t 0 "3 texts" "${w[@]}" --prompts "$tmp/texts.txt" -o "$tmp/a.profile"
t 0 "" profile show "$tmp/a.profile"
grep -q "^    0 " "$tmp/out" || { echo "FAIL: profile show: no layer 0 row"; fails=$((fails + 1)); }
tin "$tmp/texts.txt" 0 "3 texts" "${w[@]}" --prompts - -o "$tmp/b.profile"
t 2 "--prompts $tmp/dir: is a directory" "${w[@]}" --prompts "$tmp/dir" -o "$tmp/c.profile"
t 2 "holds no text" "${w[@]}" --prompts "$tmp/empty.txt" -o "$tmp/c.profile"
t 2 "is a directory, not a regular file" "${w[@]}" --prompts "$tmp/texts.txt" -o "$tmp/dir"
t 2 "unknown option '--temp'" "${w[@]}" --prompts "$tmp/texts.txt" -o "$tmp/c.profile" --temp 0
t 2 "need --prompts FILE and -o NAME.profile" "${w[@]}" --prompts "$tmp/texts.txt"
t 2 "--dynamic wants an integer in 0..100" "${w[@]}" --prompts "$tmp/texts.txt" -o x --dynamic 101
t 2 "--placement needs the CUDA backend" "${w[@]}" --prompts "$tmp/texts.txt" -o x \
    --placement static:1
[ -e "$tmp/c.profile" ] && { echo "FAIL: a refused warmup wrote its profile"; fails=$((fails + 1)); }
head -n 12 "$tmp/a.profile" >"$tmp/cut.profile"
t 1 "no 'end' line: the file is truncated" profile show "$tmp/cut.profile"
t 1 "not a strata profile" profile show "$tmp/texts.txt"
t 1 "is a directory, not a profile" profile show "$tmp/dir"
t 2 "unexpected '--bogus'" profile show "$tmp/a.profile" --bogus
t 2 "unknown subcommand 'freeze'" profile freeze
tpath "$tmp/nobin" 2 "--plot needs gnuplot" profile show "$tmp/a.profile" --plot "$tmp/p.png"
# restoring needs the expert cache (CUDA with --vram-budget)
t 2 "--profile restores experts into the expert cache, which needs --vram-budget" \
    run "${cpu[@]}" -p x --profile "$tmp/a.profile"
t 2 "--profile-freeze and --profile-optional go with --profile" run -t 1 -p x --profile-freeze
t 0 "the profile is not used (--profile-optional)" run "${cpu[@]}" -p x -n 1 \
    --profile "$tmp/a.profile" --profile-optional

echo "$((n - fails)) of $n cases passed"
[ "$fails" = 0 ]
