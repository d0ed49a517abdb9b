#!/usr/bin/env python3
"""One line per kernel from `ncu --print-summary per-kernel --metrics gpu__time_duration.sum`:
mean duration (us), launches in the window, grid, kernel name. Usage: ncu-summary.py FILE."""
import re
import sys


def summary(text):
    rows, name = [], None
    for line in text.split("\n"):
        m = re.match(r"^  (\S.*?) \((\d+, \d+, \d+)\)x.*Invocations (\d+)", line)
        if m:
            name = (m.group(1), m.group(2), int(m.group(3)))
            continue
        m = re.match(r"^\s+gpu__time_duration.sum\s+(ns|us|ms)\s+([\d.,]+)\s+([\d.,]+)\s+([\d.,]+)", line)
        if m and name:
            us = float(m.group(4).replace(",", "")) * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[m.group(1)]
            rows.append(f"{us:8.2f} us  x{name[2]:4d}  grid ({name[1]})  {name[0]}")
            name = None
    return rows


if __name__ == "__main__":
    print("\n".join(summary(open(sys.argv[1]).read())))
