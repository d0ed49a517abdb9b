#!/usr/bin/env bash
# The CPU device's host tier against the page cache under one memory limit (a cgroup v1
# memory controller; run as root): LIMIT_MIB=3072 bash bench/dev-host-tier.sh. W1 is the
# shipped model inflated to 30b-a3b shapes: strata gen --inflate models/strata-default.gguf
# --preset 30b-a3b -o /tmp/w1.gguf. Each run starts with the page cache dropped.
set -u
S=${S:-build/strata}
W1=${W1:-/tmp/w1.gguf}
CG=/sys/fs/cgroup/memory/strata-tier
mkdir -p $CG
echo $((LIMIT_MIB << 20)) > $CG/memory.limit_in_bytes
run() { # label, args...
    local label=$1; shift
    sync; echo 3 > /proc/sys/vm/drop_caches
    echo "### $label: strata bench -m W1 --device cpu -t 2 -p 32 -n 16 --bw-gib 0.1 $* (memory limit ${LIMIT_MIB} MiB)"
    bash -c "echo \$\$ > $CG/cgroup.procs; exec $S bench -m $W1 --device cpu -t 2 -p 32 -n 16 --bw-gib 0.1 $*" 2>&1 |
        grep -E "^(pp|tg|host tier|disk|first|floor)"
    echo "memory.max_usage_in_bytes $(cat $CG/memory.max_usage_in_bytes), failcnt $(cat $CG/memory.failcnt)"
    echo 0 > $CG/memory.max_usage_in_bytes 2>/dev/null
}
run "page cache (mapping)"
run "host tier 2 GiB" --host-budget 2G
run "host tier 2 GiB, read-ahead" --host-budget 2G --host-read-ahead
run "host tier 2 GiB, pread" --host-budget 2G --host-io pread
