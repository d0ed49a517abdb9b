#!/usr/bin/env bash
# strata stats-routing on a generated tiny model: the table is printed with one row per layer
# and a total, --dat writes one line per layer, bad arguments exit 2.
set -u
strata=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
check() { if ! eval "$1"; then echo "FAILED: $2"; fail=1; fi; }

"$strata" gen --preset tiny -q -o "$dir/tiny.gguf" || exit 1
printf 'The quick brown fox jumps over the lazy dog.\n\ndef main():\nHello world, hello again.\n' \
  >"$dir/prompts.txt"
out=$("$strata" stats-routing -m "$dir/tiny.gguf" --prompts "$dir/prompts.txt" --dat "$dir/r.dat")
check "[ \$? -eq 0 ]" "stats-routing exit code"
check "echo \"\$out\" | grep -q '^ *all '" "no totals row"
check "[ \$(echo \"\$out\" | grep -cE '^ +[0-9]+ ') -eq 2 ]" "expected 2 layer rows"
check "echo \"\$out\" | grep -q '3 texts'" "expected 3 texts (blank line skipped)"
check "[ \$(grep -vc '^#' \"$dir/r.dat\") -eq 2 ]" "dat file lines"
"$strata" stats-routing -m "$dir/tiny.gguf" >/dev/null 2>&1
check "[ \$? -eq 2 ]" "missing --prompts must exit 2"
grep -q "recall" <<<"$("$strata" stats-routing --help)"
check "[ \$? -eq 0 ]" "--help"
[ $fail -eq 0 ] && echo "cli_stats_routing: all checks passed"
exit $fail
