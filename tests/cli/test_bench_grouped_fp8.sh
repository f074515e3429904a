#!/usr/bin/env bash
# test_bench_grouped_fp8.sh DEEPWELL — `deepwell bench grouped --recipe` on the CPU (the fp8_block
# reference kernel; GPU timings run on the lent GPU): a random custom shape's JSON cases in both
# recipes (each case's recipe, quant_ms > 0 for fp8_block and 0 for bf16, TFLOP/s = 2 rows K M / ms
# over the unpadded rows), bf16 alone by default, --explain selecting grouped_cpu_fp8_block for every
# pass, the table's recipe and "quant ms" columns, --help (naming the off switch DW_MOE_FP8=0), and
# bad input (exit 2, the flag or name in the message).
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
R=$((RANDOM % 300 + 1)) E=$((RANDOM % 6 + 1)) K=$((128 * (RANDOM % 2 + 1))) M=$((128 * (RANDOM % 2 + 1)))
shape="--shapes custom --rows $R --experts $E --k $K --m $M --iters 1"
"$dw" bench grouped --device cpu $shape --recipe bf16,fp8_block --json >"$tmp/j" 2>"$tmp/e"
check "both recipes, JSON" 0 $?
python3 - "$tmp/j" $R $E $K $M <<'PY' && ok "cases per recipe, quant_ms and TFLOP/s" || bad "JSON cases: $(cat "$tmp/e")"
import json, sys
cases = json.load(open(sys.argv[1]))
R, E, K, M = map(int, sys.argv[2:])
seen = sorted((c["recipe"], c["routing"], c["pass"]) for c in cases)
assert seen == [(q, r, p) for q in ("bf16", "fp8_block") for r in ("balanced", "zipf") for p in ("dgrad", "fprop", "wgrad")], seen
for c in cases:
    assert (c["rows"], c["experts"], c["k"], c["m"], c["dtype"]) == (R, E, K, M, "fp32"), c
    assert (c["quant_ms"] > 0) == (c["recipe"] == "fp8_block"), c
    assert c["ms"] > 0 and abs(c["tflops"] - round(2 * R * K * M / (c["ms"] * 1e9), 1)) <= 0.1, c
PY
"$dw" bench grouped --device cpu $shape --routing zipf --passes fprop --json >"$tmp/d" 2>&1
check "default recipe" 0 $?
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); assert [x["recipe"] for x in c] == ["bf16"], c' "$tmp/d" \
  && ok "bf16 alone by default" || bad "default recipe: $(cat "$tmp/d")"
"$dw" bench grouped --device cpu $shape --routing balanced --recipe fp8_block --explain >"$tmp/x" 2>&1
check "--explain fp8_block" 0 $?
has "every pass selects the fp8_block reference" "$tmp/x" "grouped fprop: rows $R, $E experts, k $K -> m $M, fp32, recipe fp8_block" \
  "grouped wgrad: rows $R, $E experts" "grouped_fp8block_sm90        prio  40  rejected: CUDA kernel, CPU target"
[ "$(grep -c 'selected: grouped_cpu_fp8_block' "$tmp/x")" = 3 ] && ok "three passes, one kernel" || bad "selections: $(cat "$tmp/x")"
has "the table's columns and rows" "$tmp/x" "recipe" "quant ms" "custom        balanced  wgrad  fp8_block"
"$dw" bench grouped --help >"$tmp/h" 2>&1; check "--help" 0 $?
has "--help names the recipes and the off switch" "$tmp/h" "--recipe LIST" fp8_block "quant ms" DW_MOE_FP8=0 "unpadded rows"
! grep -q "opt-in" "$tmp/h" && ok "--help no longer calls the kernel opt-in" || bad "--help: $(grep opt-in "$tmp/h")"
"$dw" bench grouped --device cpu $shape --recipe fp8 >"$tmp/x" 2>&1; check "unknown recipe" 2 $?
has "names it" "$tmp/x" "--recipe" "'fp8'"
"$dw" bench grouped --device cpu --shapes custom --rows 8 --experts 2 --k 100 --m 128 --recipe fp8_block >"$tmp/x" 2>&1
check "fp8_block with k not a multiple of 128" 2 $?; has "names the flag" "$tmp/x" "--k 100"
echo "$fails failed"
[ "$fails" = 0 ]
