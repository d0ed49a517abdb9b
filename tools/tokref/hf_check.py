#!/usr/bin/env python3
"""Checks reference token ids against Hugging Face `tokenizers` (the Rust implementation).

The expected files in tests/data/tokenizer/ were produced by @lenml/tokenizers (JavaScript);
strata's test compares its own encoder with them. This script closes the loop on a machine
that has the `tokenizers` Python package (no network needed): it loads the same tokenizer.json,
encodes every case with add_special_tokens=False (added tokens are still split out, as in the
reference) and compares the ids; it also decodes the expected ids and compares the text.

Usage:
  hf_check.py TOKENIZER_JSON EXPECTED_JSONL [TOKENIZER_JSON EXPECTED_JSONL ...]
e.g.
  python3 tools/tokref/hf_check.py \
      tests/data/npm/tokenizer-qwen3/models/tokenizer.json tests/data/tokenizer/qwen3-expected.jsonl

Exit status: 0 when every case matches, 1 when some differ, 2 on usage or load errors.
"""
import hashlib
import json
import sys


def load_cases(path):
    meta, cases = {}, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            obj = json.loads(line)
            if "meta" in obj:
                meta = obj["meta"]
            else:
                cases.append(obj)
    return meta, cases


def show(tok, ids, at):
    lo = max(0, at - 4)
    parts = []
    for i in range(lo, min(len(ids), at + 5)):
        piece = tok.id_to_token(ids[i])
        parts.append(("> " if i == at else "") + f"{ids[i]}:{piece!r}")
    return " ".join(parts)


def check_pair(tokenizers, tok_path, exp_path):
    with open(tok_path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    meta, cases = load_cases(exp_path)
    tok = tokenizers.Tokenizer.from_file(tok_path)
    print(f"{tok_path}: sha256 {sha}")
    print(f"{exp_path}: {len(cases)} cases, made by {meta.get('reference', '?')} "
          f"for {meta.get('tokenizer', '?')}")
    if meta.get("tokenizer_json_sha256") not in (None, sha):
        print(f"  WARNING: the expected file was made from tokenizer.json sha256 "
              f"{meta['tokenizer_json_sha256']}, not this one")
    id_fail = dec_fail = 0
    for c in cases:
        got = tok.encode(c["text"], add_special_tokens=False).ids
        want = c["ids"]
        if got != want:
            id_fail += 1
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                      min(len(got), len(want)))
            print(f"  ids differ: case {c['name']!r}: hf {len(got)} ids, expected {len(want)}; "
                  f"first difference at {at}")
            print(f"    hf:       {show(tok, got, at)}")
            print(f"    expected: {show(tok, want, at)}")
        text = c.get("normalized", c["text"])
        dec = tok.decode(want, skip_special_tokens=False)
        if dec != text:
            dec_fail += 1
            print(f"  decode differs: case {c['name']!r}: {dec!r} vs {text!r}")
    print(f"  ids: {len(cases) - id_fail}/{len(cases)} cases match; "
          f"decode: {len(cases) - dec_fail}/{len(cases)} match")
    return id_fail + dec_fail


def main(argv):
    if len(argv) < 3 or len(argv) % 2 != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import tokenizers
    except ImportError:
        print("hf_check: the Python package `tokenizers` is not installed", file=sys.stderr)
        return 2
    print(f"hf_check: tokenizers {tokenizers.__version__}, python {sys.version.split()[0]}")
    failures = 0
    for i in range(1, len(argv), 2):
        try:
            failures += check_pair(tokenizers, argv[i], argv[i + 1])
        except Exception as e:  # a file that does not load
            print(f"hf_check: {argv[i]} / {argv[i + 1]}: {e}", file=sys.stderr)
            return 2
    print("hf_check: " + ("all cases match" if failures == 0 else f"{failures} difference(s)"))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
