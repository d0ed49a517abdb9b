#!/usr/bin/env python3
"""strata serve against a real HTTP client (Python's http.client), on the shipped default model
on the CPU: usage `serve_check.py STRATA MODEL`. Exit 0 when every check holds, 1 otherwise.

Checks:
 1. /health, /v1/models, /metrics and the chat page at /;
 2. /v1/completions, streamed and not, equals `strata run` with the same seed and settings
    (greedy and sampled), and /v1/chat/completions equals `strata run --chat`; every streamed
    chunk is whole UTF-8;
 3. 8 clients sending 64 requests at once (--parallel 4) all get the text each request gets
    alone (4 clients and 24 requests under STRATA_TEST_QUICK=1, which sanitizer builds set);
 4. prefix reuse: a second turn that resends the first turn's history evaluates fewer prompt
    tokens (usage.prompt_tokens_details.cached_tokens) and gives the same text as on a server
    that never saw the first turn;
 5. bad input: malformed JSON, a body over --max-body, an unknown model, a missing or wrong API
    key, max_tokens over --max-tokens, n = 2, a prompt over the context, wrong methods and
    paths, wrong types: each answered with its status and an error object;
 6. a full queue answers 429 with Retry-After;
 7. a client that disconnects mid-stream frees its stream (running back to 0, counted as
    cancelled), and the server goes on serving;
 8. SIGTERM while a request runs: that request completes, the server exits 0 (under ASan this
    is also where leaks would fail it);
 9. --spec ngram: greedy completions, alone and 12 at once (6 when quick), equal `strata run`'s,
    and drafts were verified (/metrics);
10. a random-weight model (strata gen's tiny preset), whose byte tokens make ill-formed UTF-8:
    completions, streamed and not, are valid UTF-8 JSON whose text is strata run's output with
    each maximal ill-formed subsequence replaced by U+FFFD (Python's decoder does the same), and
    at least one of them needed a replacement; and four identical sampled requests without a
    seed each report a different seed (53 random bits: a collision has probability 6 / 2^53),
    and a request sent again with a reported seed gives that reply.
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

STRATA, MODEL = sys.argv[1], sys.argv[2]
FAILS = []
QUICK = os.environ.get("STRATA_TEST_QUICK") == "1"


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what, flush=True)
    return cond


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, *args, model=None):
        self.port = free_port()
        self.log = open(os.path.join(TMP, "serve-%d.log" % self.port), "w+")
        self.p = subprocess.Popen(
            [STRATA, "serve", "-m", model or MODEL, "--device", "cpu", "-t", "2", "--port", str(self.port)]
            + list(args), stdout=self.log, stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < 120:
            if self.p.poll() is not None:
                break
            try:
                st, body, _ = self.req("GET", "/health")
                if st == 200 and json.loads(body)["status"] == "ready":
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit("server did not start: " + self.output())

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def req(self, method, path, body=None, headers=None, raw=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        out = r.read()
        hdrs = dict(r.getheaders())
        c.close()
        return r.status, out, hdrs

    def post(self, path, body, headers=None):
        st, out, h = self.req("POST", path, body, headers)
        return st, json.loads(out), h

    def stream(self, path, body):
        """The concatenated text of a streamed request, its chunks' JSON, and whether every
        chunk was whole UTF-8."""
        body = dict(body, stream=True)
        st, out, _ = self.req("POST", path, body)
        assert st == 200, (st, out)
        text, chunks, utf8_ok, done = "", [], True, False
        for ev in out.split(b"\n\n"):
            if not ev.strip():
                continue
            assert ev.startswith(b"data: "), ev
            data = ev[6:]
            if data == b"[DONE]":
                done = True
                continue
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                utf8_ok = False
            j = json.loads(data)
            chunks.append(j)
            c = j["choices"][0]
            text += c.get("text", "") if "text" in c else c.get("delta", {}).get("content", "")
        return text, chunks, utf8_ok and done

    def stop(self, sig=signal.SIGTERM, timeout=180):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return -9


def run_text(prompt, n, temp, seed, chat=False, model=None):
    args = [STRATA, "run", "-m", model or MODEL, "--device", "cpu", "-t", "2", "-n", str(n), "--temp",
            str(temp), "-s", str(seed), "-p", prompt] + (["--chat"] if chat else [])
    out = subprocess.run(args, capture_output=True, check=True).stdout.decode("utf-8", "replace")
    return out


def completion_text(j):
    c = j["choices"][0]
    return c["text"] if "text" in c else c["message"]["content"]


PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:", "# 中文注释\nx = '"]


def check_basics(sv):
    st, body, h = sv.req("GET", "/v1/models")
    j = json.loads(body)
    check(st == 200 and j["data"][0]["id"] == "strata-default.gguf", "/v1/models: %s" % body)
    st, body, h = sv.req("GET", "/")
    check(st == 200 and b"<" in body and "text/html" in h.get("Content-Type", ""), "GET /")
    st, body, _ = sv.req("GET", "/metrics")
    check(st == 200 and b"strata_requests_total" in body, "/metrics")


def check_run_equal(sv):
    for i, p in enumerate(PROMPTS):
        for temp, seed in ((0, 1), (0.8, 17 + i)):
            want = run_text(p, 12, temp, seed)
            ok = check(want.startswith(p), "run echoes its prompt: %r" % want)
            want = want[len(p):] if ok else want
            req = {"prompt": p, "max_tokens": 12, "temperature": temp, "seed": seed}
            st, j, _ = sv.post("/v1/completions", req)
            check(st == 200 and completion_text(j) == want,
                  "completion %r temp %g: %r, run %r" % (p, temp, j, want))
            check(j.get("usage", {}).get("completion_tokens", 0) <= 12, "usage %r" % j)
            text, chunks, ok = sv.stream("/v1/completions", req)
            check(ok and text == want, "streamed completion %r temp %g: %r, run %r" %
                  (p, temp, text, want))
    # chat: one user message is what strata run --chat renders
    want = run_text("What does a stack do?", 16, 0, 1, chat=True)
    req = {"messages": [{"role": "user", "content": "What does a stack do?"}], "max_tokens": 16,
           "temperature": 0}
    st, j, _ = sv.post("/v1/chat/completions", req)
    got = completion_text(j) if st == 200 else None
    check(got is not None and want.endswith(got) and got, "chat %r, run --chat %r" % (got, want))
    text, chunks, ok = sv.stream("/v1/chat/completions", req)
    check(ok and text == got and chunks[0]["choices"][0]["delta"].get("role") == "assistant",
          "streamed chat %r against %r" % (text, got))
    check(chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"), "finish reason")


def check_concurrent(sv):
    n, clients, n_alone = (24, 4, 8) if QUICK else (64, 8, 16)
    reqs = []
    for k in range(n):
        p = PROMPTS[k % len(PROMPTS)] + "\n" * (k % 3)
        reqs.append({"prompt": p, "max_tokens": 8 + k % 5, "temperature": 0.7, "seed": k})
    alone = []
    for r in reqs[:n_alone]:
        st, j, _ = sv.post("/v1/completions", r)
        alone.append(completion_text(j) if st == 200 else None)
    results = [None] * n

    def client(c):
        for k in range(c, n, clients):
            try:
                if k % 2:
                    st, j, _ = sv.post("/v1/completions", reqs[k])
                    results[k] = completion_text(j) if st == 200 else ("status %d" % st)
                else:
                    results[k] = sv.stream("/v1/completions", reqs[k])[0]
            except Exception as e:  # noqa: BLE001 (the check below reports it)
                results[k] = "error %r" % e

    ts = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.time() - t0
    bad = [k for k in range(n_alone) if results[k] != alone[k]]
    check(not bad, "concurrent requests differ from alone: %r" %
          [(k, results[k], alone[k]) for k in bad[:3]])
    # the same request (k and k + 16 * m share prompt, max_tokens and seed only when equal)
    same = {}
    for k, r in enumerate(reqs):
        key = json.dumps(r, sort_keys=True)
        same.setdefault(key, set()).add(results[k])
    check(all(len(v) == 1 for v in same.values()), "equal requests gave different texts")
    check(all(isinstance(x, str) and not x.startswith(("error", "status")) for x in results),
          "some concurrent requests failed: %r" % [x for x in results if
                                                   not isinstance(x, str) or
                                                   x.startswith(("error", "status"))][:3])
    print("concurrent: %d requests from %d clients in %.1f s" % (n, clients, dt))


def check_prefix_reuse():
    first = [{"role": "user", "content": "Write a function that adds two numbers."}]
    fresh = Server("--parallel", "2")
    try:
        st, a1, _ = fresh.post("/v1/chat/completions",
                               {"messages": first, "max_tokens": 12, "temperature": 0})
        turn2 = first + [{"role": "assistant", "content": completion_text(a1)},
                         {"role": "user", "content": "Now make it subtract."}]
        st, b_seen, _ = fresh.post("/v1/chat/completions",
                                   {"messages": turn2, "max_tokens": 12, "temperature": 0})
    finally:
        fresh.stop()
    other = Server("--parallel", "2")
    try:
        st, b_new, _ = other.post("/v1/chat/completions",
                                  {"messages": turn2, "max_tokens": 12, "temperature": 0})
    finally:
        other.stop()
    cached = b_seen["usage"]["prompt_tokens_details"]["cached_tokens"]
    cached_new = b_new["usage"]["prompt_tokens_details"]["cached_tokens"]
    check(cached > 0 and cached_new == 0,
          "prefix reuse: cached %d (after the first turn), %d (fresh)" % (cached, cached_new))
    check(completion_text(b_seen) == completion_text(b_new),
          "prefix reuse changed the text: %r vs %r" % (completion_text(b_seen),
                                                       completion_text(b_new)))
    print("prefix reuse: second turn of %d prompt tokens, %d reused" %
          (b_seen["usage"]["prompt_tokens"], cached))


def check_bad_input():
    sv = Server("--parallel", "1", "-c", "64", "--max-tokens", "32", "--max-body", "4K",
                "--api-key", "sekrit")
    auth = {"Authorization": "Bearer sekrit"}
    try:
        def expect(status, method, path, body=None, raw=None, headers=auth, what=""):
            st, out, h = sv.req(method, path, body, headers, raw)
            ok = st == status
            if ok and status >= 400:
                try:
                    ok = "message" in json.loads(out)["error"]
                except (ValueError, KeyError):
                    ok = False
            check(ok, "%s: %s %s gave %d %r, want %d" % (what, method, path, st, out[:200],
                                                         status))
            return h

        good = {"prompt": "x = 1", "max_tokens": 4, "temperature": 0}
        expect(200, "POST", "/v1/completions", good, what="good request")
        expect(401, "POST", "/v1/completions", good, headers={}, what="no key")
        expect(401, "POST", "/v1/completions", good, headers={"Authorization": "Bearer sekriT"},
               what="wrong key")
        expect(401, "GET", "/v1/models", headers={"Authorization": "Bearer x"}, what="models key")
        expect(400, "POST", "/v1/completions", raw="{\"prompt\": ", what="malformed JSON")
        expect(400, "POST", "/v1/completions", raw="[1, 2]", what="not an object")
        expect(400, "POST", "/v1/completions", raw="", what="empty body")
        expect(413, "POST", "/v1/completions", raw=json.dumps({"prompt": "x" * 8000}),
               what="body over --max-body")
        expect(404, "POST", "/v1/completions", dict(good, model="gpt-4"), what="unknown model")
        expect(400, "POST", "/v1/completions", dict(good, max_tokens=33), what="max_tokens")
        expect(400, "POST", "/v1/completions", dict(good, n=2), what="n = 2")
        expect(400, "POST", "/v1/completions", dict(good, temperature="hot"), what="type")
        expect(400, "POST", "/v1/completions", dict(good, stream="yes"), what="stream type")
        expect(400, "POST", "/v1/completions", dict(good, stop=[1]), what="stop type")
        expect(400, "POST", "/v1/completions", {"max_tokens": 4}, what="no prompt")
        expect(400, "POST", "/v1/chat/completions", {"messages": [{"role": "robot",
                                                                   "content": "hi"}]},
               what="bad role")
        expect(400, "POST", "/v1/completions", dict(good, prompt="x " * 200),
               what="prompt over the context")
        expect(405, "GET", "/v1/completions", what="GET on a POST endpoint")
        expect(404, "GET", "/v2/whatever", what="unknown path")
        expect(200, "GET", "/health", headers={}, what="health needs no key")
        st, j, _ = sv.post("/v1/completions", dict(good, max_tokens=32), auth)
        check(st == 200 and j["choices"][0]["finish_reason"] in ("length", "stop"),
              "the context ends a long generation: %r" % j)
    finally:
        check(sv.stop() == 0, "bad-input server exit status")


def check_queue_and_disconnect():
    sv = Server("--parallel", "1", "--queue", "1")
    try:
        long_req = {"prompt": "def f():", "max_tokens": 200, "temperature": 0.9, "seed": 3,
                    "ignore": "unknown keys are ignored"}
        statuses, retry = [], []

        def one():
            st, out, h = sv.req("POST", "/v1/completions", long_req)
            statuses.append(st)
            if st == 429:
                retry.append(h.get("Retry-After"))

        ts = [threading.Thread(target=one) for _ in range(5)]
        for t in ts:
            t.start()
            time.sleep(0.05)
        for t in ts:
            t.join()
        check(statuses.count(200) >= 2 and statuses.count(429) >= 1 and all(retry),
              "queue bound: statuses %r, Retry-After %r" % (statuses, retry))
        # a client that leaves mid-stream
        s = socket.create_connection(("127.0.0.1", sv.port))
        body = json.dumps(dict(long_req, stream=True, max_tokens=2000)).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = s.recv(4096)
        check(b"200" in got.split(b"\r\n")[0], "stream before disconnect: %r" % got[:100])
        s.close()
        # the request may still be queued or running when the client is gone: wait (180 s at
        # most) until it is counted as cancelled and nothing runs or waits
        t0, health, out = time.time(), None, b""
        while time.time() - t0 < 180:
            st, out, _ = sv.req("GET", "/metrics")
            health = json.loads(sv.req("GET", "/health")[1])
            if (b'outcome="cancelled"} 1' in out and health["running"] == 0 and
                    health["queued"] == 0):
                break
            time.sleep(0.1)
        check(b'outcome="cancelled"} 1' in out and health["running"] == 0 and
              health["queued"] == 0,
              "disconnect: health %r, metrics %r" % (health, out.decode()[:1500]))
        st, j, _ = sv.post("/v1/completions", {"prompt": "x", "max_tokens": 2})
        check(st == 200, "serving after a disconnect")
    finally:
        check(sv.stop() == 0, "queue server exit status")


def check_shutdown():
    sv = Server("--parallel", "2")
    result = {}

    def one():
        result["r"] = sv.stream("/v1/completions", {"prompt": "class A:", "max_tokens": 96,
                                                     "temperature": 0})

    t = threading.Thread(target=one)
    t.start()
    t0 = time.time()  # the signal goes once the request runs (60 s at most)
    while time.time() - t0 < 60 and json.loads(sv.req("GET", "/health")[1])["running"] == 0:
        time.sleep(0.02)
    rc = sv.stop(signal.SIGTERM, timeout=300)  # a loaded CI machine is slow; the finish counts
    t.join(60)
    text, chunks, ok = result.get("r", ("", [], False))
    check(rc == 0, "SIGTERM exit status %r: %s" % (rc, sv.output()[-2000:]))
    check(ok and chunks and chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop"),
          "the running request finished across SIGTERM: %r" % (chunks[-1:] if chunks else None))


def check_spec():
    sv = Server("--parallel", "4", "--spec", "ngram", "--draft-max", "6")
    try:
        wants = {}
        for p in PROMPTS[:3]:
            want = run_text(p, 24, 0, 1)
            wants[p] = want[len(p):]
            st, j, _ = sv.post("/v1/completions", {"prompt": p, "max_tokens": 24,
                                                    "temperature": 0})
            check(st == 200 and completion_text(j) == wants[p],
                  "--spec greedy %r: %r, run %r" % (p, j, wants[p]))
        n = 6 if QUICK else 12
        results = [None] * n

        def one(k):
            p = PROMPTS[k % 3]
            if k % 2:
                results[k] = sv.stream("/v1/completions", {"prompt": p, "max_tokens": 24,
                                                            "temperature": 0})[0]
            else:
                st, j, _ = sv.post("/v1/completions", {"prompt": p, "max_tokens": 24,
                                                        "temperature": 0})
                results[k] = completion_text(j) if st == 200 else "status %d" % st

        ts = [threading.Thread(target=one, args=(k,)) for k in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        bad = [k for k in range(n) if results[k] != wants[PROMPTS[k % 3]]]
        check(not bad, "--spec concurrent greedy differs from run: %r" %
              [(k, results[k]) for k in bad[:3]])
        st, out, _ = sv.req("GET", "/metrics")
        drafted = [ln for ln in out.decode().splitlines()
                   if ln.startswith("strata_spec_drafted_total ")]
        check(drafted and int(drafted[0].split()[1]) > 0, "--spec: no drafts in /metrics")
    finally:
        check(sv.stop() == 0, "spec server exit status")


TMP = os.environ.get("TMPDIR", "/tmp")


def check_ill_formed():
    model = os.path.join(TMP, "random-tiny.gguf")
    subprocess.run([STRATA, "gen", "--preset", "tiny", "-q", "-o", model], check=True,
                   capture_output=True)
    sv = Server("--parallel", "2", model=model)
    replaced = 0
    try:
        for seed in range(1, 5):
            want = run_text("a", 24, 1.0, seed, model=model)
            ok = check(want.startswith("a"), "run echoes its prompt: %r" % want)
            want = want[1:] if ok else want
            replaced += "\ufffd" in want
            req = {"prompt": "a", "max_tokens": 24, "temperature": 1.0, "seed": seed}
            st, body, _ = sv.req("POST", "/v1/completions", req)
            try:
                j = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                check(False, "ill-formed model output, seed %d: %s: %r" % (seed, e, body))
                continue
            check(st == 200 and completion_text(j) == want,
                  "ill-formed model output, seed %d: %r, run %r" % (seed, j, want))
            try:
                text, _, ok = sv.stream("/v1/completions", req)
            except (UnicodeDecodeError, ValueError) as e:
                text, ok = str(e), False
            check(ok and text == want, "streamed ill-formed model output, seed %d: %r, run %r" %
                  (seed, text, want))
        seeds, first = set(), None
        for _ in range(4):
            req = {"prompt": "a", "max_tokens": 24, "temperature": 1.0}
            st, j, _ = sv.post("/v1/completions", req)
            seeds.add(j.get("seed") if st == 200 else None)
            first = first or (j.get("seed"), completion_text(j))
        check(len(seeds) == 4 and None not in seeds,
              "4 sampled requests without a seed reported the seeds %r" % seeds)
        if first[0] is not None:
            st, j, _ = sv.post("/v1/completions", dict(req, seed=first[0]))
            check(st == 200 and completion_text(j) == first[1] and j.get("seed") == first[0],
                  "the reported seed %r did not repeat the reply: %r" % (first[0], j))
    finally:
        check(sv.stop() == 0, "random-model server exit status: " + sv.output()[-2000:])
    check(replaced > 0, "no ill-formed UTF-8 in 4 samples of the random model: the check saw none")


T0 = [time.time()]


def lap(what):
    """Prints the seconds since the last lap (where a slow machine spends the test's time)."""
    now = time.time()
    print("time: %s %.1f s" % (what, now - T0[0]), flush=True)
    T0[0] = now


def main():
    sv = Server("--parallel", "4")
    try:
        check_basics(sv)
        lap("basics")
        check_run_equal(sv)
        lap("equal to strata run")
        check_concurrent(sv)
        lap("concurrent")
    finally:
        check(sv.stop() == 0, "main server exit status: " + sv.output()[-2000:])
    check_prefix_reuse()
    lap("prefix reuse")
    check_bad_input()
    lap("bad input")
    check_queue_and_disconnect()
    lap("queue and disconnect")
    check_shutdown()
    lap("shutdown")
    check_spec()
    lap("spec")
    check_ill_formed()
    lap("ill-formed UTF-8")
    if FAILS:
        print("%d checks failed" % len(FAILS))
        return 1
    print("serve: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
