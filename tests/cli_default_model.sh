#!/usr/bin/env bash
# The shipped default model (models/strata-default.gguf, docs/default-model.md): `strata run`
# with no -m uses it and writes Python-looking text, greedily the same twice; its routing is
# not uniform (reuse@1 well above the 8/128 = 6.25% of uniform routing, the top 10% of experts
# taking well over 10% of the activations, strata's SLRU holding 40% of the experts hitting
# well over 40%), measured with stats-routing on prompts written for this test
# (tests/data/routing-prompts.txt, not from the training corpus).
set -euo pipefail
strata=$1
data=$2
root=$(cd "$data/../.." && pwd)
model=$root/models/strata-default.gguf
[ -f "$model" ] || { echo "no $model"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"   # the default is found by its absolute path, not relative to the cwd
"$strata" run -p "def fibonacci(n):" -n 48 --temp 0 -t 2 >out1.txt 2>err1.txt
"$strata" run -p "def fibonacci(n):" -n 48 --temp 0 -t 2 >out2.txt 2>err2.txt
cmp out1.txt out2.txt || { echo "greedy output differs between runs"; exit 1; }
grep -q "generation: 48 tokens" err1.txt || { echo "no 48-token generation line:"; cat err1.txt; exit 1; }
# code-like text: a return, a parenthesis and an indented line somewhere in it
grep -qE "return|\(" out1.txt && grep -qE "^    " out1.txt || { echo "not code-like:"; cat out1.txt; exit 1; }
echo "default model, greedy:"; cat out1.txt; echo
"$strata" stats-routing -m "$model" --prompts "$data/routing-prompts.txt" --separator '<|sep|>' \
    -t 2 >sr.txt
cat sr.txt
awk '$1 == "all" {
    top10 = $3 + 0; reuse1 = $5 + 0;
    if (top10 < 20 || reuse1 < 12.5) { print "routing looks uniform: top10 " top10 "%, reuse@1 " reuse1 "%"; exit 1 }
    print "routing: top10 " top10 "%, reuse@1 " reuse1 "% (uniform: 10%, 6.25%)"; found = 1 }
    END { if (!found) { print "no totals row"; exit 1 } }' sr.txt
# the cache replay: holding 40% of the experts, strata's SLRU must beat uniform routing's ~40%
hit40=$(sed -n 's/.* \([0-9.]*\)% with 40% of experts cached.*/\1/p' sr.txt)
[ -n "$hit40" ] || { echo "no cache replay line"; exit 1; }
awk -v h="$hit40" 'BEGIN { if (h < 60) { print "SLRU at 40%: " h "% (uniform: ~40%)"; exit 1 }
    print "SLRU at 40% of experts: " h "% hits" }' 
