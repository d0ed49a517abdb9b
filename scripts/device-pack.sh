#!/usr/bin/env bash
# Builds a commit of this repository in a git worktree (so that uncommitted edits stay out of
# what runs on the GPU machine) and packs its binaries for the device's `carry`:
#   scripts/device-pack.sh [COMMIT] [BINARY...]
# COMMIT defaults to HEAD; the binaries default to strata and every tests/test_cuda_*. They go,
# stripped, into .carry/bin.tar.xz (xz -9e: the test binaries share most of their code, so
# this level packs them about four times smaller than the default, which keeps the checkout
# under the device's 64 MiB). bench/device-env.sh unpacks them into .carry/bin.
set -eu
root=$(git rev-parse --show-toplevel)
commit=$(git -C "$root" rev-parse "${1:-HEAD}")
[ $# -gt 0 ] && shift
wt=${STRATA_PACK_WORKTREE:-/tmp/strata-pack-wt}
if [ -d "$wt" ]; then
    git -C "$wt" checkout -q --detach "$commit"
else
    git -C "$root" worktree add -q --detach "$wt" "$commit"
fi
cmake -S "$wt" -B "$wt/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$wt/build" -j"$(nproc)" >/dev/null
rm -rf "$root/.carry/bin"
mkdir -p "$root/.carry/bin"
if [ $# -eq 0 ]; then
    cp "$wt/build/strata" "$wt"/build/tests/test_cuda_* "$root/.carry/bin/"
else
    for b in "$@"; do cp "$wt/build/$b" "$root/.carry/bin/"; done
fi
strip "$root"/.carry/bin/*
tar -cf - -C "$root/.carry" bin | xz -9e -T"$(nproc)" >"$root/.carry/bin.tar.xz"
echo "packed $(git -C "$root" log --oneline -1 "$commit" | cut -c1-60): $(du -h "$root/.carry/bin.tar.xz" | cut -f1)"
