#!/usr/bin/env bash
# strata serve with a real HTTP client: tests/serve_check.py (its docstring lists the checks),
# on the shipped default model on the CPU.
set -uo pipefail
strata=$1
model="$2/../../models/strata-default.gguf"
[ -r "$model" ] || { echo "skip: no $model"; exit 77; }
command -v python3 >/dev/null || { echo "skip: no python3"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TMPDIR=$tmp timeout 800 python3 "$(dirname "$0")/serve_check.py" "$strata" "$model"
