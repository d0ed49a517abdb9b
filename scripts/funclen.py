#!/usr/bin/env python3
"""Lists C/CUDA functions longer than N lines (brace matching at file top level)."""
import re, sys, os
lim = int(sys.argv[1]); paths = sys.argv[2:]
for root in paths:
    for dp, dn, fn in os.walk(root):
        for f in fn:
            if not f.endswith(('.c', '.h', '.cu', '.cuh')): continue
            p = os.path.join(dp, f); src = open(p, errors='replace').read().split('\n')
            depth = 0; start = None; name = None
            for i, line in enumerate(src):
                s = re.sub(r'"(\\.|[^"\\])*"', '""', line); s = re.sub(r"'(\\.|[^'\\])*'", "''", s)
                s = re.sub(r'//.*', '', s)
                if depth == 0 and '{' in s:
                    j = i
                    while j > 0 and '(' not in src[j]: j -= 1
                    m = re.search(r'(\w+)\s*\(', src[j]); name = m.group(1) if m else '?'; start = i
                depth += s.count('{') - s.count('}')
                if depth == 0 and start is not None:
                    n = i - start + 1
                    if n > lim and name not in ('struct', 'enum', 'union'): print(f"{n:5d} {p}:{start+1} {name}")
                    start = None
