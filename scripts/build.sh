#!/usr/bin/env bash
# Builds strata into build/ (Release), installing missing Debian packages first.
# Extra arguments go to cmake's configure step, e.g. -DSTRATA_CUDA=OFF or
# -DSTRATA_CUDA_ARCHITECTURES="86;89".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
