#!/usr/bin/env bash
# GPU machine: what a memory-limit comparison can use there. Prints the memory and disk the
# machine has, the cgroup hierarchy (v1 or v2) and whether a memory cgroup with a limit can be
# made and entered, and whether the page cache can be dropped. Results in $OUT/memprobe.txt.
set -u
. bench/device-env.sh
R=$OUT/memprobe.txt
{
    grep -E "^(MemTotal|MemFree|MemAvailable|Cached|SwapTotal):" /proc/meminfo
    df -h "$PWD" /dev/shm | sed 1d
    findmnt -t cgroup,cgroup2 -o TARGET,FSTYPE,OPTIONS
    cat /proc/self/cgroup
    ls /sys/fs/cgroup | head -40
    echo "controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>&1)"
    echo "subtree: $(cat /sys/fs/cgroup/cgroup.subtree_control 2>&1)"
    G=/sys/fs/cgroup/strata-probe
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        echo +memory >/sys/fs/cgroup/cgroup.subtree_control && echo "enabled +memory"
        mkdir -p $G && echo $((1 << 30)) >$G/memory.max && echo "memory.max: $(cat $G/memory.max)"
        bash -c "echo \$\$ > $G/cgroup.procs && echo entered: \$(cat /proc/self/cgroup) &&
            python3 -c 'b = bytearray(2 << 30); print(\"2 GiB touched under a 1 GiB limit: not killed\")'"
        echo "rc=$? (137: killed by the limit, as wanted)"
        grep -E "^(oom|oom_kill|max) " $G/memory.events 2>/dev/null
        rmdir $G
    elif [ -d /sys/fs/cgroup/memory ]; then
        echo "cgroup v1 memory controller present"
    fi
    sync && echo 3 >/proc/sys/vm/drop_caches && echo "drop_caches: ok"
    grep -E "^(MemAvailable|Cached):" /proc/meminfo
    ulimit -l
} 2>&1 | tee "$R"
