#!/usr/bin/env python3
"""The loss curve of a training run (train_moe.py's training.json) drawn with gnuplot: batch
training loss every 100 steps, held-out loss every 500 (4 batches) and at the end (16), against tokens seen, with the
shape trials' final held-out losses as points.

    python3 tools/train/plot_loss.py docs/data/default-model-training.json docs/default-model-loss.png
"""
import json
import os
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().split("\n\n")[-1].strip())
    run = json.load(open(sys.argv[1]))
    per_step = run["args"]["batch"] * run["args"]["seq"] / 1e6  # M tokens per step
    with tempfile.TemporaryDirectory() as d:
        train, held, trials, final = (os.path.join(d, n) for n in
                                      ("train.dat", "held.dat", "trials.dat", "final.dat"))
        with open(final, "w") as f:
            f.write(f"{run['tokens_seen'] / 1e6:.2f} {run['held_out_loss']}\n")
        with open(train, "w") as f:
            for r in run["curve"]:
                f.write(f"{r['step'] * per_step:.2f} {r['loss']}\n")
        with open(held, "w") as f:
            for r in run["curve"]:
                if "held_out_loss" in r:
                    f.write(f"{r['step'] * per_step:.2f} {r['held_out_loss']}\n")
        with open(trials, "w") as f:
            for t in run.get("trials", []):
                f.write(f"{t['tokens_seen'] / 1e6:.2f} {t['held_out_loss']} "
                        f"{t['layers']}x{t['hidden']}x{t['expert_ffn']}\n")
        script = f"""
set terminal pngcairo size 900,520 font ',10'
set output '{sys.argv[2]}'
set xlabel 'tokens seen (M)'
set ylabel 'cross-entropy (nats per token)'
set yrange [1:5]
set grid
set key top right
set title '{run["layers"]} layers x hidden {run["hidden"]} x expert FFN {run["expert_ffn"]}: {run["steps"]} steps, {run["train_seconds"] / 60:.0f} min'
plot '{train}' using 1:2 with lines lw 1 lc rgb '#9999cc' title 'train (batch)', \\
     '{held}' using 1:2 with linespoints lw 2 pt 7 lc rgb '#cc3333' title 'held out (4 batches)', \\
     '{final}' using 1:2 with points pt 9 ps 1.6 lc rgb '#cc3333' title 'held out at the end (16 batches)', \\
     '{trials}' using 1:2 with points pt 5 ps 1.2 lc rgb '#333333' title 'shape trials (0.75 min each)', \\
     '{trials}' using 1:2:3 with labels offset 1,0.6 left notitle
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)


if __name__ == "__main__":
    main()
