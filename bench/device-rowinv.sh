#!/usr/bin/env bash
# GPU machine: is a position's output independent of how many rows its pass holds? For each
# model below, `strata logits` of a 3-token prompt evaluated as one batch and one token at a
# time (--decode-one-by-one) must give the same float32 logits bit for bit (a speculative
# verify pass of k + 1 rows relies on it). Also the one-by-one run twice (determinism). Models:
# MODELS, entries ARCH:LAYERS[:QUANT] (q3n: the qwen3next 80b-a3b preset, moe: the 30b-a3b
# preset, cut to LAYERS; QUANT default q4_k_m), default "q3n:1 q3n:4 moe:4"; each under WHERE
# (comma-separated, default --device cuda, --vram-budget 4G and --device cpu).
set -u
. bench/device-env.sh
R=$OUT/rowinv.txt
cmpf() { # $1 $2: files of float32; prints identical or the largest difference
    python3 - "$1" "$2" <<'PY'
import sys, array
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read()); b.frombytes(open(sys.argv[2], "rb").read())
if len(a) != len(b): print("sizes differ", len(a), len(b))
elif a.tobytes() == b.tobytes(): print("identical")
else:
    d = [abs(x - y) for x, y in zip(a, b)]; i = max(range(len(d)), key=d.__getitem__)
    am = lambda v: max(range(len(v)), key=v.__getitem__)
    print("DIFFER: max |d| %.3g at %d, %d of %d differ, argmax %d vs %d" %
          (d[i], i, sum(1 for x in d if x > 0), len(a), am(a), am(b)))
PY
}
for spec in ${MODELS:-q3n:1 q3n:4 moe:4}; do
    IFS=: read -r arch nl quant <<<"$spec"
    quant=${quant:-q4_k_m}
    f=/dev/shm/rowinv-$arch-$nl-$quant.gguf
    if [ $arch = q3n ]; then
        "$B/strata" gen --arch qwen3next --preset 80b-a3b --layers $nl --quant $quant -q -o $f 2>&1 | tail -1
    else
        "$B/strata" gen --preset 30b-a3b --layers $nl --quant $quant -q -o $f 2>&1 | tail -1
    fi
    IFS=, read -ra where <<<"${WHERE:---device cuda,--vram-budget 4G,--device cpu}"
    for w in "${where[@]}"; do
        for ids in 100,200 100,200,300; do
            # shellcheck disable=SC2086
            for m in "" --decode-one-by-one --decode-one-by-one; do
                timeout 120 "$B/strata" logits -m $f --ids $ids $w $m -o /tmp/l$m.bin >/dev/null 2>&1 ||
                    echo "logits $w $m failed"
                [ -z "$m" ] || { [ -f /tmp/l1.bin ] || cp /tmp/l$m.bin /tmp/l1.bin; }
            done
            echo "$arch $nl layers $quant, $w, ids $ids: batch vs one by one: $(cmpf /tmp/l.bin /tmp/l1.bin);" \
                "one by one twice: $(cmpf /tmp/l1.bin /tmp/l--decode-one-by-one.bin)" | tee -a "$R"
            rm -f /tmp/l*.bin
        done
    done
    rm -f $f
done
