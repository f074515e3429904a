#!/usr/bin/env bash
# test_bench_grouped.sh DEEPWELL — `deepwell bench grouped` on the CPU (the FP32 reference; GPU
# timings run on the lent GPU): a random custom shape's JSON cases (every routing and pass, the
# largest group of each routing against an independent count, TFLOP/s = 2 rows K M / ms), --explain
# naming the grouped kernel that ran, the table, --help naming every flag, and bad input (exit 2,
# the flag or name in the message).
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
R=$((RANDOM % 500 + 8)) E=$((RANDOM % 12 + 1)) K=$((RANDOM % 30 + 1)) M=$((RANDOM % 30 + 1))
"$dw" bench grouped --device cpu --shapes custom --rows $R --experts $E --k $K --m $M --iters 1 --json \
  >"$tmp/j" 2>"$tmp/e"; check "custom shape, JSON" 0 $?
python3 - "$tmp/j" $R $E $K $M <<'PY' && ok "cases, largest groups and TFLOP/s" || bad "JSON cases"
import json, math, sys
cases = json.load(open(sys.argv[1]))
R, E, K, M = map(int, sys.argv[2:])
def counts(routing):  # the routings' definition (docs/performance.md), written again
    if routing == "balanced":
        return [R // E + (e < R % E) for e in range(E)]
    w = [(e + 1) ** -1.0 for e in range(E)]
    c = [math.floor(R * x / sum(w)) for x in w]
    c[0] += R - sum(c)
    return c
seen = sorted((c["routing"], c["pass"]) for c in cases)
assert seen == [(r, p) for r in ("balanced", "zipf") for p in ("dgrad", "fprop", "wgrad")], seen
for c in cases:
    assert (c["rows"], c["experts"], c["k"], c["m"], c["dtype"]) == (R, E, K, M, "fp32"), c
    assert c["max_rows"] == max(counts(c["routing"])), (c, counts(c["routing"]))
    assert c["ms"] > 0 and abs(c["tflops"] - round(2 * R * K * M / (c["ms"] * 1e9), 1)) <= 0.1, c
PY
"$dw" bench grouped --device cpu --shapes custom --rows $R --experts $E --k $K --m $M --iters 1 --routing zipf \
  --passes wgrad --explain >"$tmp/x" 2>&1; check "--explain" 0 $?
has "--explain: the problem, every candidate and the choice" "$tmp/x" "grouped wgrad: rows $R, $E experts, k $K -> m $M, fp32" \
  "grouped_cpu_reference        prio   0  eligible" "grouped_wgmma_sm90           prio  30  rejected: CUDA kernel, CPU target" \
  "selected: grouped_cpu_reference"
"$dw" bench grouped --device cpu --shapes custom --rows $R --experts $E --k $K --m $M --iters 1 --routing zipf \
  --passes fprop >"$tmp/t" 2>&1; check "table" 0 $?
has "table header and the one case" "$tmp/t" "max_rows" "custom        zipf      fprop"
"$dw" bench grouped --help >"$tmp/h" 2>&1; check "--help" 0 $?
has "--help names every flag" "$tmp/h" --json --explain --shapes --routing --passes --iters --zipf --seed --device --rows \
  --experts "--k K" "--m M" e8 e64 moe-e8-down moe-e64-down bench/grouped_anchor.py
"$dw" bench --help >"$tmp/b" 2>&1; has "bench lists it" "$tmp/b" "grouped"
"$dw" bench grouped --device cpu >"$tmp/x" 2>&1; check "CPU without shapes" 2 $?
has "says why" "$tmp/x" "name the shapes"
"$dw" bench grouped --device cpu --shapes custom,e9 --rows 8 --experts 2 --k 8 --m 8 >"$tmp/x" 2>&1
check "unknown shape" 2 $?; has "names it" "$tmp/x" "'e9'"
"$dw" bench grouped --device cpu --shapes custom --rows 8 --experts 2 --k 8 --m 8 --routing skewed >"$tmp/x" 2>&1
check "unknown routing" 2 $?; has "names it" "$tmp/x" "'skewed'"
"$dw" bench grouped --device cpu --shapes custom >"$tmp/x" 2>&1; check "custom without dimensions" 2 $?
"$dw" bench grouped --zipf -1 >"$tmp/x" 2>&1; check "--zipf -1" 2 $?; has "names the flag" "$tmp/x" "--zipf"
"$dw" bench grouped --experts 5000 >"$tmp/x" 2>&1; check "--experts 5000" 2 $?
"$dw" bench grouped --iters 0 >"$tmp/x" 2>&1; check "--iters 0" 2 $?
"$dw" bench grouped stray >"$tmp/x" 2>&1; check "stray argument" 2 $?
echo "$fails failed"
[ "$fails" = 0 ]
