#!/usr/bin/env bash
# GPU machine's CPU: the AMX gemm kernels (docs/cpu-kernels.md, "AMX") against the AVX-512 VNNI
# ones (STRATA_CPU_AMX=0). Whether the process may run tiles (strata info), test_matmul (the
# AMX outputs bit for bit against the VNNI dots, on the host's tiles), the kernels' m = 64
# rate (bench-kernels), then CPU-only prefill and the greedy logits' md5 of the 30b-a3b preset
# both ways, ROUNDS rounds alternated. Results in $OUT/amx.txt.
# Reads strata and test_matmul from .carry/bin (.carry/bin.tar.xz).
set -u
. bench/device-env.sh
R=$OUT/amx.txt
: >"$R"
"$B/strata" info 2>&1 | grep -E '^cpu|^amx' | tee -a "$R"
echo "== test_matmul" | tee -a "$R"
OMP_NUM_THREADS=16 "$B/test_matmul" 2>&1 | grep -E 'gemm|amx|FAIL|passed' | tee -a "$R"
echo "== bench-kernels --batch 64, tiles then STRATA_CPU_AMX=0" | tee -a "$R"
for e in X=1 STRATA_CPU_AMX=0; do
    env $e "$B/strata" bench-kernels --types q8_0,q4_k,q6_k --mib 256 --seconds 0.5 --batch 64 2>&1 |
        grep -E '^Q|^type' | sed "s/^/$e /" | tee -a "$R"
done
gen_30b
for e in X=1 STRATA_CPU_AMX=0; do
    env $e timeout 200 "$B/strata" logits -m $M --device cpu --ids 1,2,3,4,5,6,7 --greedy 8 \
        -o /tmp/l.bin >/dev/null 2>&1
    echo "logits cpu $e $(md5sum </tmp/l.bin | cut -c1-32)" | tee -a "$R"
    rm -f /tmp/l.bin
done
for i in $(seq "${ROUNDS:-2}"); do
    for e in X=1 STRATA_CPU_AMX=0; do
        echo "$e round $i: $(env $e timeout 200 "$B/strata" bench -m $M --device cpu -p 512 -n 16 \
            --bw-gib 0.5 2>&1 | grep -E '^pp512|^tg16' | tr -s ' ' | tr '\n' ' ')" | tee -a "$R"
    done
done
