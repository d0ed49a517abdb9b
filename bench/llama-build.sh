#!/usr/bin/env bash
# Development machine: builds llama.cpp's llama-bench for the H200 machine, the comparison
# bench/device-oss.sh runs (LLAMA=1, LCPU=1), and packs it into .carry/llama.tar.xz.
#   bash bench/llama-build.sh [WORKDIR]     (default /tmp/llama-build; about 40 minutes on 2 cores)
# The source is the llama.cpp tree that the npm package node-llama-cpp 3.22.1 ships as a git
# bundle (llama/gitRelease.bundle). CUDA for sm_90 with flash attention; the CPU code for the
# H200 machine's Xeon (AVX-512 with VBMI, VNNI and BF16; not AMX, which stopped with an illegal
# instruction there); static ggml libraries, so one binary. Its multi-GPU reductions link
# libnccl.so.2, which one GPU never calls: a stand-in library (bench/nccl_stub.c) goes with it.
# cuBLAS and the CUDA runtime come from the machine's own toolkit (device-oss.sh finds them).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
w=${1:-/tmp/llama-build}
mkdir -p "$w"
cd "$w"
[ -f node-llama-cpp-3.22.1.tgz ] || npm pack node-llama-cpp@3.22.1 >/dev/null
[ -d package ] || tar -xzf node-llama-cpp-3.22.1.tgz
[ -d llama.cpp ] || git clone -q package/llama/gitRelease.bundle llama.cpp
cmake -S llama.cpp -B llama.cpp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
    -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
    -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF >/dev/null
cmake --build llama.cpp/build --target llama-bench -j"$(nproc)"
mkdir -p pack/llama
cp llama.cpp/build/bin/llama-bench pack/llama/
strip pack/llama/llama-bench
gcc -shared -fPIC -O2 -Wl,-soname,libnccl.so.2 -o pack/llama/libnccl.so.2 "$root/bench/nccl_stub.c"
mkdir -p "$root/.carry"
tar -cf - -C pack llama | xz -9e -T"$(nproc)" >"$root/.carry/llama.tar.xz"
echo "packed $(du -h "$root/.carry/llama.tar.xz" | cut -f1): .carry/llama.tar.xz"
