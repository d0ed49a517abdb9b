#!/usr/bin/env bash
# strata serve's chat page (cli/serve_page.html) in headless Chromium, on the shipped default
# model (CPU, greedy):
#  1. the server starts on a free port and /health reaches "ready";
#  2. curl asks POST /v1/chat/completions without streaming for the expected reply;
#  3. Chromium opens /?q=...&max_tokens=12&temperature=0: the page sends q by itself and streams
#     the reply; the DOM, once body has data-done="1", holds the element reply-1 whose text is
#     curl's reply and whose data-finish is curl's finish_reason;
#  4. a screenshot of the page (1000x700) after the reply is a non-empty PNG.
# Chromium is driven through the DevTools protocol on --remote-debugging-pipe (JSON messages
# ended by NUL on fds 3 and 4): --dump-dom and --screenshot do not wait for a streamed fetch.
# Skips (77) without chromium, curl or python3, or when this strata has no serve command.
set -uo pipefail
strata=$1
model="$2/../../models/strata-default.gguf"
[ -r "$model" ] || { echo "skip: no $model"; exit 77; }
chromium=$(command -v chromium || command -v chromium-browser) ||
    { echo "skip: no chromium"; exit 77; }
for tool in curl python3; do
    command -v $tool >/dev/null || { echo "skip: no $tool"; exit 77; }
done
"$strata" serve --help >/dev/null 2>&1 || { echo "skip: $strata has no serve command"; exit 77; }

tmp=$(mktemp -d)
server=
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    [ -s "$tmp/server.log" ] && { echo "--- server log:"; tail -20 "$tmp/server.log"; }
    exit 1
}

# 1. the server on a free port
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
"$strata" serve -m "$model" --device cpu -t 2 --host 127.0.0.1 --port "$port" --parallel 2 \
    >"$tmp/server.log" 2>&1 &
server=$!
status=
for _ in $(seq 120); do
    kill -0 "$server" 2>/dev/null || fail "strata serve exited"
    status=$(curl -s --max-time 2 "$url/health" |
        python3 -c 'import json, sys; print(json.load(sys.stdin).get("status", ""))' 2>/dev/null)
    [ "$status" = ready ] && break
    sleep 0.5
done
[ "$status" = ready ] || fail "/health not ready after 60 s (last status '$status')"
echo "ok: strata serve is ready on port $port"

# 2. the expected reply, without streaming
curl -s --max-time 120 -H 'Content-Type: application/json' -o "$tmp/want.json" \
    -d '{"messages":[{"role":"user","content":"def fibonacci(n):"}],"max_tokens":12,"temperature":0,"stream":false}' \
    "$url/v1/chat/completions" || fail "curl POST /v1/chat/completions failed"
python3 - "$tmp/want.json" "$tmp/want.txt" "$tmp/want.finish" <<'EOF' ||
import json, sys
c = json.load(open(sys.argv[1]))["choices"][0]
open(sys.argv[2], "w").write(c["message"]["content"])
open(sys.argv[3], "w").write(c["finish_reason"])
EOF
    fail "no choices[0].message.content in $(head -c 500 "$tmp/want.json")"
[ -s "$tmp/want.txt" ] || fail "the reply is empty: $(cat "$tmp/want.json")"
echo "ok: curl's reply is $(python3 -c 'import sys; print(repr(open(sys.argv[1]).read()))' "$tmp/want.txt") ($(cat "$tmp/want.finish"))"

# 3. + 4. the page in Chromium: wait for data-done, save the DOM and a screenshot
cat >"$tmp/drive.py" <<'EOF'
import base64, fcntl, json, os, subprocess, sys, time
chromium, page, profile, dom_out, png_out = sys.argv[1:6]
cmd_r, cmd_w = os.pipe()  # the browser reads commands on fd 3
ans_r, ans_w = os.pipe()  # and writes answers and events on fd 4
def child_fds():  # the pipes may be fds 3 and 4 themselves: move them out of the way first
    r, w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(ans_w, fcntl.F_DUPFD, 10)
    os.dup2(r, 3)
    os.dup2(w, 4)
browser = subprocess.Popen(
    [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
     "--no-first-run", "--no-default-browser-check", "--user-data-dir=" + profile,
     "--window-size=1000,700", "--hide-scrollbars", "--remote-debugging-pipe", page],
    close_fds=False, preexec_fn=child_fds,  # Python opens its other fds close-on-exec
    stdout=subprocess.DEVNULL, stderr=open(profile + ".log", "w"))
os.close(cmd_r)
os.close(ans_w)
pending = b""
next_id = 0
def call(method, session=None, **params):
    global pending, next_id
    next_id += 1
    msg = {"id": next_id, "method": method, "params": params}
    if session:
        msg["sessionId"] = session
    os.write(cmd_w, json.dumps(msg).encode() + b"\0")
    while True:
        while b"\0" not in pending:
            data = os.read(ans_r, 1 << 16)
            if not data:
                sys.exit("chromium closed the DevTools pipe")
            pending += data
        raw, pending = pending.split(b"\0", 1)
        ans = json.loads(raw)
        if ans.get("id") == next_id:
            if "error" in ans:
                sys.exit("%s: %s" % (method, ans["error"]))
            return ans["result"]
def evaluate(session, expr):
    res = call("Runtime.evaluate", session, expression=expr, returnByValue=True)
    return res["result"].get("value")
try:
    deadline = time.time() + 30
    targets = []
    while not targets and time.time() < deadline:
        targets = [t for t in call("Target.getTargets")["targetInfos"] if t["type"] == "page"]
        time.sleep(0.1)
    if not targets:
        sys.exit("no page target")
    session = call("Target.attachToTarget", targetId=targets[0]["targetId"],
                   flatten=True)["sessionId"]
    deadline = time.time() + 90
    while evaluate(session, "document.body && document.body.dataset.done") != "1":
        if time.time() > deadline:
            sys.exit("the page did not set data-done within 90 s")
        time.sleep(0.2)
    open(dom_out, "w").write(evaluate(session, "document.documentElement.outerHTML"))
    call("Emulation.setDeviceMetricsOverride", session, width=1000, height=700,
         deviceScaleFactor=1, mobile=False)
    shot = call("Page.captureScreenshot", session, format="png")
    open(png_out, "wb").write(base64.b64decode(shot["data"]))
    call("Browser.close")
finally:
    try:
        browser.wait(10)
    except subprocess.TimeoutExpired:
        browser.kill()
EOF
timeout 150 python3 "$tmp/drive.py" "$chromium" \
    "$url/?q=def%20fibonacci(n)%3A&max_tokens=12&temperature=0" \
    "$tmp/profile" "$tmp/dom.html" "$tmp/page.png" ||
    fail "chromium: $(tail -5 "$tmp/profile.log" 2>/dev/null)"

# The text and data-finish of the element reply-1 in the DOM, character references decoded.
python3 - "$tmp/dom.html" "$tmp/got.txt" "$tmp/got.finish" <<'EOF' || fail "no reply-1 in the DOM"
import sys
from html.parser import HTMLParser
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
class Reply(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth, self.text, self.finish, self.found = 0, [], None, False
    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if self.depth:
            self.depth += tag not in VOID
        elif attrs.get("id") == "reply-1":
            self.depth, self.found, self.finish = 1, True, attrs.get("data-finish")
    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1
    def handle_data(self, data):
        if self.depth:
            self.text.append(data)
p = Reply()
p.feed(open(sys.argv[1]).read())
if not p.found:
    sys.exit(1)
open(sys.argv[2], "w").write("".join(p.text))
open(sys.argv[3], "w").write(p.finish or "")
EOF
grep -q '<body[^>]* data-done="1"' "$tmp/dom.html" || fail "the DOM has no data-done=\"1\" on body"
cmp -s "$tmp/got.txt" "$tmp/want.txt" ||
    fail "reply-1 '$(cat "$tmp/got.txt")' is not curl's '$(cat "$tmp/want.txt")'"
[ "$(cat "$tmp/got.finish")" = "$(cat "$tmp/want.finish")" ] ||
    fail "reply-1's data-finish '$(cat "$tmp/got.finish")' is not curl's '$(cat "$tmp/want.finish")'"
echo "ok: the page streamed curl's reply into reply-1 (finish $(cat "$tmp/got.finish"))"
[ -s "$tmp/page.png" ] && [ "$(head -c 8 "$tmp/page.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ] ||
    fail "no PNG screenshot"
echo "ok: screenshot of $(stat -c %s "$tmp/page.png") bytes"
exit 0
