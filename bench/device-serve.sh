#!/usr/bin/env bash
# GPU machine: strata serve on the 30b-a3b preset under an 8 GiB budget, loaded by
# bench/serve_load.py with 1, 4 and 16 concurrent streaming clients (REQS requests each, MAXTOK
# tokens per request): aggregate tok/s, time to first token, time between streamed chunks.
# Binaries: .carry/bin.tar.xz (scripts/device-pack.sh).
set -u
. bench/device-env.sh
ldd "$B/strata" | grep "not found" && exit 1
gen_30b
port=18090
"$B/strata" serve -m $M --vram-budget ${BUDGET:-8G} --parallel 16 --park 0 -c 512 --port $port \
    >"$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
    curl -s localhost:$port/health | grep -q '"ready"' && break
    sleep 0.2
done
echo "### strata serve -m 30b-a3b --vram-budget ${BUDGET:-8G} --parallel 16 --park 0 -c 512" | tee "$OUT/serve-load.txt"
timeout 240 python3 bench/serve_load.py $port ${CONC:-1,4,16} ${REQS:-2} ${MAXTOK:-64} | tee -a "$OUT/serve-load.txt"
curl -s localhost:$port/metrics | grep -v "^#" | tee -a "$OUT/serve-load.txt"
kill -TERM $pid
wait $pid
echo "serve exit $?" | tee -a "$OUT/serve-load.txt"
