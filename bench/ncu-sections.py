#!/usr/bin/env python3
"""One block per kernel from ncu's section report (--section ...): the kernel, its grid and
block, then the chosen metrics on one line, then the first sentence of each rule that names a
stall reason. Usage: ncu-sections.py FILE."""
import re
import sys

KEEP = {
    "Duration": "us",
    "DRAM Throughput": "dram%",
    "Memory Throughput": "mem%",
    "Compute (SM) Throughput": "sm%",
    "L1/TEX Hit Rate": "l1hit%",
    "L2 Hit Rate": "l2hit%",
    "Registers Per Thread": "regs",
    "Waves Per SM": "waves",
    "Theoretical Occupancy": "occ_th%",
    "Achieved Occupancy": "occ%",
    "Warp Cycles Per Issued Instruction": "cyc/issue",
    "Dynamic Shared Memory Per Block": "dsmem",
    "Static Shared Memory Per Block": "ssmem",
}


def blocks(text):
    out, cur = [], None
    for line in text.split("\n"):
        m = re.match(r"^  (\S.*?) \((\d+, \d+, \d+)\)x\((\d+, \d+, \d+)\), Context", line)
        if m:
            cur = {"name": m.group(1), "grid": m.group(2), "block": m.group(3), "m": {}, "stall": []}
            out.append(cur)
            continue
        if cur is None:
            continue
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) >= 3 and parts[0] == "Memory Throughput" and parts[1].endswith("byte/s"):
            cur["m"]["bw"] = parts[-1] + " " + parts[1]
        elif len(parts) >= 3 and parts[0] in KEEP and parts[0] not in cur["m"]:
            cur["m"][parts[0]] = parts[-1] + ("" if parts[1] in ("%", "") else " " + parts[1])
        s = line.strip()
        if re.match(r"^(OPT|INF|WRN)\s", s):
            cur["para"] = s[3:].strip()
        elif s and "para" in cur and line.startswith("          "):
            cur["para"] += " " + s
        elif "para" in cur:
            m = re.search(r"spends ([\d.]+) cycles being stalled (.*?)\.", cur.pop("para"))
            if m:
                cur["stall"].append(f"stalled {m.group(1)} cycles {m.group(2)}")
    return out


def main(path):
    for b in blocks(open(path, errors="replace").read()):
        name = re.sub(r"\(.*\)$", "", b["name"])[:70]
        print(f"{name}  grid ({b['grid']}) block ({b['block']})")
        print("    " + "  ".join(f"{KEEP.get(k, k)}={v}" for k, v in b["m"].items()))
        for s in b["stall"][:2]:
            print("    " + s)


if __name__ == "__main__":
    main(sys.argv[1])
