#!/usr/bin/env bash
# GPU machine: strata serve under load, bench/serve_load.py with 1, 4 and 16 concurrent
# streaming clients (REQS requests each, MAXTOK tokens per request): aggregate tok/s, time to
# first token and time between chunks as the client sees them, and the server's per-token
# timings. RUNS lists MODEL:BUDGET pairs (default "30b:8G w1:2G"): 30b is the 30b-a3b preset
# (random weights, whose filler tokens decode to no text: the client's chunk timings are not
# per token there), w1 the shipped model inflated to 30b-a3b shapes (W1-real: trained routing
# and real text).
# Binaries: .carry/bin.tar.xz (scripts/device-pack.sh).
set -u
. bench/device-env.sh
ldd "$B/strata" | grep "not found" && exit 1
port=18090
for run in ${RUNS:-30b:8G w1:2G}; do
    name=${run%%:*}
    budget=${run#*:}
    if [ "$name" = 30b ]; then
        gen_30b
        f=$M
    else
        f=/dev/shm/w1.gguf
        [ -f $f ] || "$B/strata" gen --inflate models/strata-default.gguf --preset 30b-a3b -o $f 2>&1 | tail -1
    fi
    log="$OUT/serve-$name-$budget.log"
    "$B/strata" serve -m "$f" --vram-budget "$budget" --parallel 16 --park 0 -c 512 --port $port \
        >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
        curl -s localhost:$port/health | grep -q '"ready"' && break
        sleep 0.2
    done
    echo "### strata serve -m $name --vram-budget $budget --parallel 16 --park 0 -c 512" | tee -a "$OUT/serve-load.txt"
    timeout 240 python3 bench/serve_load.py $port ${CONC:-1,4,16} ${REQS:-2} ${MAXTOK:-64} | tee -a "$OUT/serve-load.txt"
    curl -s localhost:$port/metrics | grep -v "^#" >>"$OUT/serve-load.txt"
    kill -TERM $pid
    wait $pid
    echo "serve exit $?" | tee -a "$OUT/serve-load.txt"
    port=$((port + 1))
done
