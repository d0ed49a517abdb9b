#!/usr/bin/env bash
# GPU machine: where the 30b-a3b preset's budgets lose against its resident decode, and where
# CPU decode loses its 16th thread.
#   resident: default flags (graph steps) and --no-graph;
#   12G and 8G: auto at -n 128 and -n 512, and each fixed mode at -n 128 (MODES_12G, MODES_8G);
#   CPU=1: --device cpu at -t 12 and -t 16 (and -t 16 --bind), with the process's threads'
#   CPU time sampled from /proc during decode (BIND=1: also -t 16 --bind, which on the H200
#   machine's guest ran for over 8 minutes, its threads mostly asleep, and was cut off).
set -u
. bench/device-env.sh
R=$OUT/probe.txt
gen_30b
sb() { # $1: label, the rest: strata bench flags (default -p 512 -n 128 unless given)
    local lab=$1
    shift
    echo "### [$lab] $*" | tee -a "$R"
    timeout 150 "$B/strata" bench -m $M --bw-gib 0.5 --tg random "$@" >"$OUT/sb-$lab.txt" 2>&1
    echo "rc=$?" | tee -a "$R"
    grep -E "^(pp|tg)[0-9]|hit rate|placement|^lanes|^floor" "$OUT/sb-$lab.txt" | head -12 | tee -a "$R"
}
sb resident --device cuda -p 512 -n 128
sb resident-eager --device cuda --no-graph -p 512 -n 128
for b in ${BUDGETS:-12G 8G}; do
    sb "$b-auto" --vram-budget $b -p 512 -n 128
    sb "$b-auto-512" --vram-budget $b -p 512 -n 512
    v=MODES_$b
    for mode in ${!v:-zc gpu hybrid}; do
        case $mode in
        hybrid) f=(--placement hybrid) ;;
        zc) f=(--residency zerocopy --graph) ;;
        gpu) f=(--residency gpu --graph) ;;
        copy) f=(--residency copy) ;;
        esac
        sb "$b-$mode" --vram-budget $b "${f[@]}" -p 512 -n 128
    done
done
[ -n "${CPU:-}" ] || exit 0
cpu_run() { # $1: label, the rest: flags; samples per-thread utime+stime twice, 2 s apart
    local lab=$1
    shift
    echo "### [cpu-$lab] $*" | tee -a "$R"
    timeout 90 "$B/strata" bench -m $M --device cpu -p 16 -n 256 --bw-gib 0.5 --tg random "$@" \
        >"$OUT/cpu-$lab.txt" 2>&1 &
    local pid=$!
    sleep ${CPU_WAIT:-8}
    snap() { for t in /proc/$pid/task/*; do echo "$(basename $t) $(awk '{print $14+$15, $39}' $t/stat 2>/dev/null)"; done; }
    snap | sort >/tmp/s1
    sleep 2
    snap | sort >/tmp/s2
    join /tmp/s1 /tmp/s2 | awk '{printf "tid %s cpu %s ticks %d in 2 s (last on cpu %s)\n", $1, $5, $4-$2, $3}' | tee -a "$R"
    wait $pid
    echo "rc=$?" | tee -a "$R"
    grep -E "^(pp|tg)[0-9]|threads|timed|^floor|^host read" "$OUT/cpu-$lab.txt" | head -8 | tee -a "$R"
}
cpu_run t16 -t 16
cpu_run t12 -t 12
[ -n "${BIND:-}" ] && cpu_run t16-bind -t 16 --bind
