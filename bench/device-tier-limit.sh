#!/usr/bin/env bash
# GPU machine: the host tier against the page cache under one memory limit (a cgroup v2 of its
# own per run, memory.max set, the page cache dropped before), on the machine's virtio disk
# (not tmpfs: O_DIRECT needs a real file system). For each model and each host budget HB (about
# 25% and 50% of its experts) the limit is HB + MARGIN (default 4G), and under it:
#   - static placement at --vram-budget 8G reading its CPU layers' experts from the mapping
#     (the page cache, what llama.cpp's --n-cpu-moe relies on) and through the tier;
#   - the expert cache (--placement stream: copies) through the tier, and at the first budget also with
#     --host-read-ahead, paced (default) and unpaced (STRATA_TIER_PACE=0);
#   - at the first budget, the expert cache reading the mapping (it registers the whole file
#     as pinned memory, which the limit does not hold), and with no --host-budget at all: the
#     experts do not fit in what the cgroup leaves, so strata takes a tier of that size itself.
# The mapping rows pass --host-budget 0 (never a tier). SKIP_MAP=1 leaves out the first
# budget's static row from the mapping; HYBRID=1 adds the hybrid placement through the tier at
# the first budget; CHUNKS="0 1024" runs each tier row of static placement and the expert cache
# (outside FULL's extra rows) with whole parts and with demand reads in pieces of 1 MiB
# (STRATA_TIER_CHUNK_KIB); BENCH235 sets the 235b runs' -p/-n. ONLY_HYBRID=1 runs the hybrid
# row alone, once for each build folder in HYBRID_BINS (default .carry/bin).
# The 235b runs only static placement from the mapping and through the tier at the first
# budget, and the expert cache through the tier at both.
# Models: the 30b-a3b preset (48 layers, 17.6 GiB of experts) and the 235b-a22b preset cut to
# L235 layers (default 30: 128 experts of 11.7 MiB each, 44 GiB; the file about 48 GB), one
# after the other (the disk has 64 GB free). Each run prints the cgroup's peak memory and OOM
# kills. Results in $OUT/tier-limit.txt.
set -u
. bench/device-env.sh
R=$OUT/tier-limit.txt
F=$PWD/tier-model.gguf
MARGIN=${MARGIN:-4}
keep="^(pp|tg)[0-9]|^host tier|^disk read|^cache |^placement|^lanes|^backend +cuda|^strata: (static|--host-budget|host tier)|rror|refused|failed"
CGROOT=${CGROOT:-/sys/fs/cgroup}
echo +memory >"$CGROOT/cgroup.subtree_control"
n=0
# limited GIB ARGS...: strata bench -m $F --vram-budget 8G ARGS under a fresh cgroup of GIB GiB.
limited() {
    local lim=$1 cg=$CGROOT/strata-tier-$n
    shift
    n=$((n + 1))
    mkdir -p "$cg"
    echo $((lim << 30)) >"$cg/memory.max"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    echo "### [memory.max ${lim}G] ${PRE:+$PRE }${SB:+$SB/}strata bench -m $(basename "$F") --vram-budget 8G $*" | tee -a "$R"
    local t0=$SECONDS
    # shellcheck disable=SC2086
    env ${PRE:-} timeout "${TMO:-90}" bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" \
        "${SB:-$B}/strata" bench -m "$F" --vram-budget 8G --bw-gib 0.5 --tg random $BENCH_N "$@" 2>&1 |
        grep -E "$keep" | tee -a "$R"
    local rc=${PIPESTATUS[0]} peak
    peak=$(cat "$cg/memory.peak" 2>/dev/null || echo 0)
    echo "rc=$rc wall=$((SECONDS - t0)) s peak=$((peak >> 20)) MiB $(grep oom_kill "$cg/memory.events" 2>/dev/null)" | tee -a "$R"
    rmdir "$cg"
}
model() { # NAME BUDGET1 BUDGET2 GEN-ARGS... ($FULL: every run above, else the short list)
    local name=$1 b1=$2 b2=$3
    shift 3
    echo "## $name" | tee -a "$R"
    local t0=$SECONDS
    "$B/strata" gen "$@" -q -o "$F" 2>&1 | tail -1 | tee -a "$R"
    sync
    echo "gen + sync: $((SECONDS - t0)) s" | tee -a "$R"
    local l1=$((${b1%G} + MARGIN)) l2=$((${b2%G} + MARGIN)) hb
    if [ -n "${ONLY_HYBRID:-}" ]; then
        for hb in ${HYBRID_BINS:-$B}; do SB=$hb limited $l1 --placement hybrid --host-budget "$b1"; done
        rm -f "$F"
        return
    fi
    [ -n "${SKIP_MAP:-}" ] || limited $l1 --placement static --host-budget 0
    tiered $l1 --placement static --host-budget "$b1"
    tiered $l1 --placement stream --host-budget "$b1"
    [ -z "${HYBRID:-}" ] || limited $l1 --placement hybrid --host-budget "$b1"
    if [ -n "${FULL:-}" ]; then
        limited $l1 --placement stream --host-budget "$b1" --host-read-ahead
        PRE=STRATA_TIER_PACE=0 limited $l1 --placement stream --host-budget "$b1" --host-read-ahead
        TMO=60 limited $l1 --placement stream --host-budget 0
        limited $l1 --placement stream
        limited $l2 --placement static --host-budget 0
        limited $l2 --placement static --host-budget "$b2"
    fi
    tiered $l2 --placement stream --host-budget "$b2"
    rm -f "$F"
}
# tiered GIB ARGS...: limited, once for each demand-read piece size in CHUNKS (KiB; 0, the
# default: whole parts)
tiered() {
    local c
    for c in ${CHUNKS:-0}; do
        if [ "$c" = 0 ]; then limited "$@"; else PRE=STRATA_TIER_CHUNK_KIB=$c limited "$@"; fi
    done
}
[ -n "${SKIP_30B:-}" ] || FULL=1 BENCH_N="-p 32 -n 16" model 30b-a3b 5G 9G --preset 30b-a3b --quant q4_k_m
[ -n "${SKIP_235B:-}" ] || BENCH_N=${BENCH235:-"-p 16 -n 8"} TMO=${TMO235:-120} \
    model "235b-a22b cut to ${L235:-30} layers" 11G 22G --preset 235b-a22b --layers "${L235:-30}" --quant q4_k_m
