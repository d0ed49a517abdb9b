#!/usr/bin/env bash
# GPU machine, the check of a final commit: every GPU test (bench/device-check.sh without the
# qwen3next bench and the server), then bench/device-placement.sh with auto beside copy,
# zero-copy in a graph and hybrid at 12, 8 and 4 GiB, resident eager and --graph, and CPU
# decode with the thread count timed (def) and fixed.
SKIP_Q3N=1 SKIP_SERVE=1 bash bench/device-check.sh 2>&1 | grep -v "^$" | tail -40
MODES="auto copy zc hybrid" THREADS="def 8 12 16" bash bench/device-placement.sh 2>&1
