#!/usr/bin/env python3
"""How often a model's sampled code repeats itself, per sampling setting: ten fixed code prompts,
three seeds each, N tokens, through `strata run`. A line repeats when it equals an earlier
non-empty line of the same output; an output "loops" when half its lines repeat.

usage: sampling_loops.py STRATA [MODEL] [N]
Prints one line per setting: the mean share of repeated lines and the outputs that loop. The
first setting is the defaults a plain `strata run` uses (the model file's general.sampling.*
keys, then strata's own); `--repeat-penalty 1.0` is the same without a penalty.
"""
import subprocess
import sys

STRATA = sys.argv[1]
MODEL = sys.argv[2] if len(sys.argv) > 2 else None
N = int(sys.argv[3]) if len(sys.argv) > 3 else 96
PROMPTS = ["def fibonacci(n):", "import os", "class Stack:", "def read_config(path):",
           "for i in range(10):", "# parse the command line arguments", "def merge_sort(items):",
           'with open("data.csv") as f:', "class Node:", "def main():"]
SETTINGS = [[], ["--repeat-penalty", "1.0"], ["--repeat-penalty", "1.1"], ["--repeat-penalty", "1.2"],
            ["--repeat-penalty", "1.3"], ["--min-p", "0.1"],
            ["--repeat-penalty", "1.1", "--min-p", "0.1"], ["--temp", "0.6", "--repeat-penalty", "1.1"]]


def repeated(text):
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    seen, r = set(), 0
    for ln in lines:
        r += ln in seen
        seen.add(ln)
    return r / len(lines) if lines else 0.0


def main():
    for st in SETTINGS:
        shares = []
        for p in PROMPTS:
            for seed in (1, 2, 3):
                cmd = [STRATA, "run", "-p", p, "-n", str(N), "-s", str(seed), "-t", "2"] + st
                if MODEL:
                    cmd += ["-m", MODEL]
                out = subprocess.run(cmd, capture_output=True, check=True).stdout
                shares.append(repeated(out.decode("utf-8", "replace")[len(p):]))
        print("%-38s repeated lines %.3f, outputs that loop %d of %d"
              % (" ".join(st) or "the defaults (the model file's, then strata's)", sum(shares) / len(shares),
                 sum(s >= 0.5 for s in shares), len(shares)), flush=True)


if __name__ == "__main__":
    main()
