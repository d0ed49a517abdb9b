#!/usr/bin/env python3
"""Checks strata's layering (docs/DESIGN.md): every #include "..." of the library and command
sources resolves to a header of a folder at the same layer or below, no two folders use each
other (directly or around a circle), and no two modules of different folders include each
other in a circle. A module is a file name without its
extension (x.h and x.c are one module). Prints the folder graph and exits 1 on a violation.

    scripts/layers.py [--graph]
"""
import os
import re
import sys

# Bottom to top. Folders of one layer may use each other, without circles between files.
LAYERS = [
    ["cpu_kernels", "cuda_kernels"],
    ["core"],
    ["residency", "prefetch", "profiles", "moe"],
    ["runtime", "runtime/arch", "include", "tools/gen", "tools/convert"],
    ["cli"],
    ["examples"],
]
RANK = {folder: i for i, layer in enumerate(LAYERS) for folder in layer}
SOURCE = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def files(root):
    for folder in RANK:
        path = os.path.join(root, folder)
        if not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            if name.endswith(SOURCE):
                yield folder, os.path.join(path, name)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    where = {}  # header base name -> folder
    sources = list(files(root))
    for folder, path in sources:
        name = os.path.basename(path)
        if name.endswith((".h", ".cuh")):
            if name in where and where[name] != folder:
                print(f"layers: header {name} is in both {where[name]}/ and {folder}/")
                return 1
            where[name] = folder
    bad = []
    edges = {}  # module -> modules it includes (modules named folder/base)
    folder_edges = {}
    for folder, path in sources:
        text = open(path, encoding="utf-8", errors="replace").read()
        src = f"{folder}/{os.path.splitext(os.path.basename(path))[0]}"
        for inc in INCLUDE.findall(text):
            base = os.path.basename(inc)
            target = where.get(base)
            if target is None:  # a file of its own folder that is not a header (e.g. .c body)
                continue
            if RANK[target] > RANK[folder]:
                bad.append(f"{os.path.relpath(path, root)} includes {target}/{base} (upward)")
            dst = f"{target}/{os.path.splitext(base)[0]}"
            if dst != src:
                edges.setdefault(src, set()).add(dst)
            # a subfolder (runtime/arch) is part of its folder's module for this check
            top_src, top_dst = folder.split("/")[0], target.split("/")[0]
            if top_src != top_dst and not folder.startswith("tools"):
                folder_edges.setdefault(top_src, set()).add(top_dst)
            elif folder.startswith("tools") and target != folder:
                folder_edges.setdefault(folder, set()).add(target)
    # circles of modules that span folders: strongly connected components (Tarjan)
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    for comp in comps:
        folders = {m.rsplit("/", 1)[0] for m in comp}
        if len(folders) > 1:
            bad.append("circle across folders: " + " -> ".join(sorted(comp)))
    # and circles of folders (folders of one layer may use each other, but only one way)
    def reach(a, b, seen=None):
        seen = seen or set()
        for n in folder_edges.get(a, ()):
            if n == b or (n not in seen and not seen.add(n) and reach(n, b, seen)):
                return True
        return False
    for a in sorted(folder_edges):
        for b in sorted(folder_edges[a]):
            if a < b and reach(b, a):
                bad.append(f"folders {a}/ and {b}/ use each other")
    if "--graph" in sys.argv:
        for folder in sorted(folder_edges, key=lambda f: (-RANK[f], f)):
            print(f"{folder} -> {', '.join(sorted(folder_edges[folder]))}")
    for line in bad:
        print("layers: " + line)
    n_inc = sum(len(v) for v in edges.values())
    print(f"layers: {len(sources)} files, {n_inc} module includes, "
          f"{len(bad)} violations (upward includes, circles of folders or of files across folders)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
