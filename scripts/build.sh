#!/usr/bin/env bash
# Builds the strata binary into build/ (Release), installing missing Debian packages first.
# cmake's and the compiler's output go to build/build.log; on failure its last 40 lines are
# printed. Extra arguments go to cmake's configure step, e.g. -DSTRATA_CUDA=OFF or
# -DSTRATA_CUDA_ARCHITECTURES="86;89".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
mkdir -p build
log=build/build.log
if ! { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" &&
       cmake --build build --target strata -j"$(nproc)"; } >"$log" 2>&1; then
  echo "strata: the build failed; the last 40 lines of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
echo "strata built: build/strata (log: $log)"
