#!/usr/bin/env python3
"""Replays a routing trace through victim rules for the GPU's expert cache, per layer.

The trace is tools/lockstep_sim's --save file (int32 header: layers, experts, k, streams,
tokens; then the ids of stream 0 as [token][layer][k]). Each layer owns a fixed share of
the slots (as cuda_devcache's per-layer lists do). The first PROMPT tokens fill each layer's
slots with its most used experts of the prompt (what the host's cache holds when the GPU
takes over); the rest are decode calls, one per token, each looking up the token's distinct
experts of the layer. Printed per pool size (a share of all experts) and rule: the hit rate
of the decode calls, misses per token over all layers, and how many of them were read in place
(not admitted).

Rules (a miss takes the victim the rule names among slots not used by the current call):
  lru      least recent (cuda_devcache before use counts)
  lfu      least use count, then least recent; counts halve every 64 calls (cuda_devcache,
           whose integer counts round the halving down; here they are floats)
  gate     lru's victim, but the miss is read in place when it is used less than the victim
  lfugate  lfu's victim with the same gate
  static   nothing admitted after the prompt
  opt      Belady's: the victim is the expert used again last (knows the future; a bound)

    python3 bench/devcache_replay.py TRACE [PROMPT=512] [SHARES=0.37,0.59]
Environment: SEED=0 starts the counts at zero instead of at the prompt's counts / 8;
DEMAND=1 sizes each layer's slots as the hand-over does with the copy path's counts
(residency/fill_device.c, ec_dev_demand: k + k/2 a layer, then slot by slot the layer whose
next most used expert of the prompt was chosen most often; even shares when the floor does
not fit) instead of an even share.
"""
import array
import os
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        n_layer, n_expert, k, _, n_tok = struct.unpack("5i", f.read(20))
        a = array.array("i")
        a.frombytes(f.read(4 * n_tok * n_layer * k))
    ids = [[a[(t * n_layer + l) * k:(t * n_layer + l + 1) * k] for l in range(n_layer)]
           for t in range(n_tok)]
    return n_layer, n_expert, k, ids


def demand_shares(ids, n_layer, n_expert, k, prompt, total):
    """Slots per layer as ec_dev_demand gives them from the prompt's counts."""
    base = k + k // 2
    if total < n_layer * base:
        return [total // n_layer] * n_layer
    rows = []
    for layer in range(n_layer):
        cnt = [0] * n_expert
        for t in range(prompt):
            for e in ids[t][layer]:
                cnt[e] += 1
        rows.append(sorted(cnt, reverse=True))
    want = [min(base, n_expert)] * n_layer
    left = total - sum(want)
    while left > 0:
        best = -1
        for layer in range(n_layer):
            if want[layer] < n_expert and (
                    best < 0 or rows[layer][want[layer]] > rows[best][want[best]]):
                best = layer
        if best < 0:
            break
        want[best] += 1
        left -= 1
    return want


def replay_opt(ids, layer, prompt, slot_of, slots):
    """Belady's choice, which knows the future: the victim is the expert used again last (or
    never); the bound no rule that admits every miss can beat."""
    held = set(slot_of)
    uses = {}
    for t in range(len(ids) - 1, prompt - 1, -1):
        for e in set(ids[t][layer]):
            uses.setdefault(e, []).append(t)
    hits = misses = 0
    for t in range(prompt, len(ids)):
        used = set(ids[t][layer])
        for e in used:
            uses[e].pop()
        for e in used:
            if e in held:
                hits += 1
                continue
            misses += 1
            if len(held) < slots:
                held.add(e)
                continue
            cand = [o for o in held if o not in used]
            if not cand:
                continue
            v = max(cand, key=lambda o: uses[o][-1] if uses.get(o) else 1 << 30)
            held.discard(v)
            held.add(e)
    return hits, misses, 0


def replay(n_expert, ids, layer, prompt, slots, rule, seeded):
    cnt = [0] * n_expert
    for t in range(prompt):
        for e in ids[t][layer]:
            cnt[e] += 1
    top = sorted(range(n_expert), key=lambda e: (-cnt[e], e))[:slots]
    owner = list(top) + [-1] * (slots - len(top))
    stamp = [0] * slots
    slot_of = {e: i for i, e in enumerate(top)}
    freq = [c / 8 for c in cnt] if seeded else [0.0] * n_expert
    hits = misses = inplace = clock = 0
    if rule == "opt":
        return replay_opt(ids, layer, prompt, slot_of, slots)
    for t in range(prompt, len(ids)):
        clock += 1
        if clock % 64 == 0:
            freq = [x / 2 for x in freq]
        used = sorted(set(ids[t][layer]))
        for e in used:
            freq[e] += 1
            if e in slot_of:
                stamp[slot_of[e]] = clock
                hits += 1
        for e in used:
            if e in slot_of:
                continue
            misses += 1
            cand = [i for i in range(slots) if stamp[i] < clock]
            if rule == "static" or not cand:
                inplace += 1
                continue
            if rule in ("lru", "gate"):
                v = min(cand, key=lambda i: (stamp[i], i))
            else:
                v = min(cand, key=lambda i: (freq[owner[i]] if owner[i] >= 0 else -1, stamp[i], i))
            if rule in ("gate", "lfugate") and owner[v] >= 0 and freq[e] < freq[owner[v]]:
                inplace += 1
                continue
            if owner[v] >= 0:
                del slot_of[owner[v]]
            owner[v], slot_of[e], stamp[v] = e, v, clock
    return hits, misses, inplace


def main():
    path = sys.argv[1]
    prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    shares = [float(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "0.37,0.59").split(",")]
    seeded = os.environ.get("SEED", "1") != "0"
    demand = os.environ.get("DEMAND", "0") == "1"
    n_layer, n_expert, k, ids = load(path)
    steps = len(ids) - prompt
    if steps <= 0:
        sys.exit(f"{path}: {len(ids)} tokens, no decode calls after a prompt of {prompt}")
    for share in shares:
        slots = int(n_expert * share)
        per = (demand_shares(ids, n_layer, n_expert, k, prompt, slots * n_layer) if demand
               else [slots] * n_layer)
        for rule in ("lru", "lfu", "gate", "lfugate", "static", "opt"):
            h = m = ip = 0
            for layer in range(n_layer):
                a, b, c = replay(n_expert, ids, layer, prompt, per[layer], rule, seeded)
                h, m, ip = h + a, m + b, ip + c
            print(f"{share:.0%} ({slots} slots a layer{', by demand' if demand else ''}) "
                  f"{rule:8s} hits {100 * h / (h + m):.1f}%, "
                  f"{m / steps:.1f} misses a token ({ip / steps:.1f} read in place)")


if __name__ == "__main__":
    main()
