#!/usr/bin/env bash
# strata stats-routing on a generated tiny model: the table is printed with one row per layer
# and a total, with recall at depths 1..4 ("-" where a layer has no layer that far before it)
# and from the token's embedding (every layer: a percentage), then the depth-1 recall by the
# predicted expert's rank, --dat writes one line of 10 columns per layer, bad arguments exit 2.
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
check "echo \"\$out\" | grep -qE '^layer .* recall +recall@2 +recall@3 +recall@4 +emb +src\$'" "table header"
check "[ \$(awk '!/^#/ && NF != 11' \"$dir/r.dat\" | wc -l) -eq 0 ]" "dat lines of 11 columns"
check "[ \$(awk '!/^#/ && \$10 == \"NaN\"' \"$dir/r.dat\" | wc -l) -eq 0 ]" "dat embedding recall on every layer"
check "echo \"\$out\" | awk '/^ +[0-9]+ |^ *all / && \$13 !~ /%\$/ { bad = 1 } END { exit bad }'" "table embedding recall on every row"
check "grep -q '^# layer .* recall recall2 recall3 recall4 ' \"$dir/r.dat\"" "dat header"
# the depth-1 recall by rank: k shares whose mean is the total recall at depth 1 (each rank has
# as many predictions), within their rounding to 0.1%
check "echo \"\$out\" | awk '\$1 == \"all\" { all = \$9 + 0 } /^depth 1 by rank/ { \
  for (i = 1; i <= NF; i++) if (\$i ~ /%\$/) { s += \$i + 0; n++ } } \
  END { d = s / n - all; exit !(n == 2 && d <= 0.1 && d >= -0.1) }'" "recall by rank (k = 2)"

# six layers: layer l has a recall at depth d exactly when d <= l, in the table and in --dat
"$strata" gen --preset tiny --layers 6 -q -o "$dir/tiny6.gguf" >/dev/null || exit 1
out6=$("$strata" stats-routing -m "$dir/tiny6.gguf" --prompts "$dir/prompts.txt" \
  --dat "$dir/r6.dat")
check "[ \$? -eq 0 ]" "stats-routing (6 layers) exit code"
depths='{ for (d = 1; d <= 4; d++) { v = $(c + d); if ((d <= $1) != (v != none)) bad = 1 } }'
check "echo \"\$out6\" | awk -v c=8 -v none=- '/^ +[0-9]+ / { n++; if (NF != 14) bad = 1 } \
  /^ +[0-9]+ / $depths END { exit bad || n != 6 }'" "table recall columns by depth"
check "echo \"\$out6\" | awk '\$1 == \"all\" { found = NF == 14; \
  for (i = 9; i <= 13; i++) if (\$i == \"-\") found = 0 } END { exit !found }'" "totals at every depth"
check "awk -v c=5 -v none=NaN '!/^#/ { n++; if (NF != 11) bad = 1 } !/^#/ $depths \
  END { exit bad || n != 6 }' \"$dir/r6.dat\"" "dat recall columns by depth"
"$strata" stats-routing -m "$dir/tiny.gguf" >/dev/null 2>&1
check "[ \$? -eq 2 ]" "missing --prompts must exit 2"
grep -q "depths 1..4" <<<"$("$strata" stats-routing --help)"
check "[ \$? -eq 0 ]" "--help"
[ $fail -eq 0 ] && echo "cli_stats_routing: all checks passed"
exit $fail
