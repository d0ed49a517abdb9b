#!/usr/bin/env python3
"""Load on a running strata serve: C concurrent clients, each sending R streamed completions in
turn (random-id-free: fixed prompts, temperature 0.8, distinct seeds), for C in the list given.
Prints per concurrency: requests, aggregate generated tok/s over the wall time, time to first
token (p50 / p99) and the time between streamed chunks (p50 / p99), as the client sees them;
then the server's own timings of the same requests (the final chunk's "timings"): time to the
first token (queued + prompt) and each request's mean time per generated token (p50 / p99).
A chunk carries text only, so on a model whose tokens often decode to nothing (the random
presets' filler vocabulary) the client's figures are per chunk, not per token; the server's
are per token on any model.

usage: serve_load.py PORT CONCURRENCIES (e.g. 1,4,16) [REQUESTS_PER_CLIENT] [MAX_TOKENS]
"""
import http.client
import json
import sys
import threading
import time

PORT = int(sys.argv[1])
CONC = [int(x) for x in sys.argv[2].split(",")]
PER = int(sys.argv[3]) if len(sys.argv) > 3 else 4
MAXTOK = int(sys.argv[4]) if len(sys.argv) > 4 else 64
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:", "for i in range(",
           "# parse the arguments\n", "with open(path) as f:", "try:\n    import numpy",
           "def main():\n    "]


def one(k, out):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    body = {"prompt": PROMPTS[k % len(PROMPTS)], "max_tokens": MAXTOK, "temperature": 0.8,
            "seed": k, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.time()
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first, last, gaps, n_tok, buf, tm = None, None, [], 0, b"", None
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev[6:] == b"[DONE]":
                continue
            now = time.time()
            j = json.loads(ev[6:])
            if j.get("usage"):
                n_tok = j["usage"]["completion_tokens"]
            if j.get("timings"):
                tm = j["timings"]
            if j["choices"][0].get("text"):
                if first is None:
                    first = now - t0
                elif last is not None:
                    gaps.append(now - last)
                last = now
    c.close()
    srv = (None, None)
    if tm:
        pps = tm.get("predicted_per_second", 0)
        srv = ((tm.get("queued_ms", 0) + tm.get("prompt_ms", 0)) / 1e3, 1 / pps if pps else None)
    out.append((first, gaps, n_tok, srv))


def pct(xs, p):
    xs = sorted(x for x in xs if x is not None)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1e3 if xs else float("nan")


one(0, [])  # warm-up: the first request pays for the first touches of the weights
for conc in CONC:
    res, ts = [], []
    t0 = time.time()

    def client(ci):
        for i in range(PER):
            one(ci * PER + i, res)

    ts = [threading.Thread(target=client, args=(ci,)) for ci in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.time() - t0
    toks = sum(r[2] for r in res)
    gaps = [g for r in res for g in r[1]]
    print("clients %2d: %3d requests, %6d tokens in %6.1f s: %8.1f tok/s aggregate | "
          "first token p50 %7.1f ms p99 %7.1f ms | between chunks p50 %6.1f ms p99 %6.1f ms"
          % (conc, len(res), toks, wall, toks / wall, pct([r[0] for r in res], 50),
             pct([r[0] for r in res], 99), pct(gaps, 50), pct(gaps, 99)), flush=True)
    ttft = [r[3][0] for r in res]
    tpt = [r[3][1] for r in res]
    print("    server:  first token (queued + prompt) p50 %7.1f ms p99 %7.1f ms | time per token "
          "(mean of each request) p50 %6.1f ms p99 %6.1f ms"
          % (pct(ttft, 50), pct(ttft, 99), pct(tpt, 50), pct(tpt, 99)), flush=True)
