#!/usr/bin/env python3
"""Held-out text of the shipped default model, split in two for profile benchmarks.

The training run (tools/train/train_moe.py) held out the Python files whose path hash falls
below 2% (split_heldout); run on the machine it trained on, this finds the same files and
writes them, cut into texts of LINES lines, to two files with texts separated by a
'<|sep|>' line: WARM (every even-numbered text) for `strata profile warmup --prompts`, EVAL
(the odd ones) for the runs that are measured, so the two never share a text.

    python3 bench/heldout.py WARM EVAL [--lines 60] [--corpus-mb 160] [--max-texts N]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "train"))
import train_moe  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("warm")
    ap.add_argument("eval")
    ap.add_argument("--lines", type=int, default=60)
    ap.add_argument("--corpus-mb", type=float, default=160.0)
    ap.add_argument("--max-texts", type=int, default=0, help="at most this many texts (0: all)")
    a = ap.parse_args()
    files = train_moe.corpus_files(int(a.corpus_mb * 1e6))
    _, held = train_moe.split_heldout(files, 0.02)
    texts = []
    for t in held:
        lines = [ln for ln in t.splitlines() if ln.strip() != "<|sep|>"]
        for i in range(0, len(lines), a.lines):
            chunk = "\n".join(lines[i:i + a.lines]).strip()
            if len(chunk) > 200:
                texts.append(chunk)
    if a.max_texts:
        texts = texts[:a.max_texts]
    with open(a.warm, "w") as w, open(a.eval, "w") as e:
        for i, t in enumerate(texts):
            (w if i % 2 == 0 else e).write(t + "\n<|sep|>\n")
    print(f"{len(held)} held-out files, {len(texts)} texts: {len(texts[0::2])} warmup, "
          f"{len(texts[1::2])} measured")


if __name__ == "__main__":
    main()
