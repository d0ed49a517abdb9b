#!/bin/sh
# The training run of docs/default-model.md on the GPU machine. Expects a stripped, statically
# linked strata binary in .carry/train/ (for the conversion and the logit check).
# A 20-second smoke run of the whole pipeline first (so a bug after training costs no
# training), then the real one; the GGUF is also written in 16 MB pieces (gguf.partNN) to $OUT.
set -u
OUT=${OUT:-out}
W=/dev/shm/strata-train
rm -rf "$W"; mkdir -p "$W" "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/train.log"
python3 -c 'import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)' >> "$OUT/train.log" 2>&1
python3 tools/train/train_moe.py --out "$W/smoke" --minutes 0.1 --corpus-mb 3 --tokenizer-mb 1 \
    --vocab 1024 --layers 2 --seq 64 --batch 8 --strata .carry/train/strata > "$OUT/smoke.log" 2>&1 \
    || { echo "smoke run failed"; tail -30 "$OUT/smoke.log"; exit 1; }
tail -5 "$OUT/smoke.log"
python3 tools/train/train_moe.py --out "$W/run" --minutes "${MINUTES:-5}" \
    --strata .carry/train/strata >> "$OUT/train.log" 2>&1
rc=$?
tail -25 "$OUT/train.log"
cp "$W/run/training.json" "$W/run/check.json" "$W/run/heldout.txt" "$OUT/" 2>/dev/null
[ -f "$W/run/model-q4_k_m.gguf" ] && split -b 16000000 -d "$W/run/model-q4_k_m.gguf" "$OUT/gguf.part"
ls -la "$OUT"
exit $rc
