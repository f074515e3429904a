#!/usr/bin/env bash
# test_moe_mxfp8.sh DEEPWELL — MoE experts under an mxfp8 policy (compile/bind_grouped.c): in
# `deepwell compile --explain` mixtral-tiny and olmoe-tiny run fprop, dgrad and wgrad of every expert
# layer in the mxfp8 grouped kernel (the CPU reference on the CPU; on sm_90 the dequantising route)
# and --report says so; sm_100 keeps them BF16 naming the architecture; experts of 48 keep them
# BF16 naming the 32-multiple rule; `deepwell dryrun --explain` shows moe-e8's middle blocks'
# experts in mxfp8 and mixtral-tiny's (first and last block only) BF16 by the safe fallback, saying
# so; the CPU trains mixtral-tiny 3 steps in mxfp8 with finite losses within 1e-2 relative of BF16's.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1

explain() { # explain NAME MODEL FLAGS...: compile --explain into $tmp/NAME
  local n=$1 m=$2; shift 2
  "$dw" compile "$m" --batch 2 --seq 16 --explain "$@" >"$tmp/$n" 2>&1
}
count() { grep -c -- "$2" "$tmp/$1"; }

for m in mixtral-tiny olmoe-tiny; do
  explain "$m" "$m" --precision mxfp8 --target cpu --report; check "$m mxfp8, CPU" 0 $?
  n=$(count "$m" "selected: grouped_cpu_mxfp8 (mxfp8)")
  [ "$n" = 18 ] && ok "$m: 2 blocks x 3 expert layers x 3 passes in mxfp8" || bad "$m: $n mxfp8 selections"
  has "$m: the report and the recipe" "$tmp/$m" \
    "recipe mxfp8 (policy: default): where a pass runs in mxfp8" \
    "at this shape: fprop quantised (grouped_cpu_mxfp8); dgrad quantised (grouped_cpu_mxfp8); wgrad quantised (grouped_cpu_mxfp8)"
done
explain sm90 mixtral-tiny --precision mxfp8 --sm 90; check "mixtral-tiny mxfp8, sm_90" 0 $?
[ "$(count sm90 "selected: grouped_mxfp8_dequant_bf16 (mxfp8)")" = 18 ] && ok "sm_90: the dequantising route for every pass" ||
  bad "sm_90: $(count sm90 "selected: grouped_mxfp8_dequant_bf16") selections"
explain sm100 mixtral-tiny --precision mxfp8 --sm 100; check "mixtral-tiny mxfp8, sm_100" 0 $?
has "sm_100: BF16, the architecture named" "$tmp/sm100" \
  "BF16 fallback: grouped_mxfp8_dequant_bf16: needs sm_80..sm_99, device is sm_100"

mkdir -p "$tmp/e48"
"$dw" capture mixtral-tiny --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["config"]
c["intermediate_size"] = 48
json.dump(c, open(sys.argv[1], "w"))' "$tmp/e48/config.json"
explain e48.txt "$tmp/e48" --precision mxfp8 --target cpu; check "experts of 48, mxfp8" 0 $?
has "experts of 48: BF16 with the rule" "$tmp/e48.txt" \
  "BF16 fallback: grouped_cpu_mxfp8: K and M must be multiples of 32" "selected: grouped_cpu_reference (bf16 fallback)"

dry() { "$dw" dryrun "$1" --precision mxfp8 --hw h100-sxm --gpus 1 --seq "$2" --global-batch 4 --explain >"$tmp/$3" 2>&1; }
dry moe-e8 1024 dry8; check "dryrun moe-e8 --explain" 0 $?
[ "$(count dry8 "selected: grouped_mxfp8_dequant_bf16 (mxfp8)")" = 54 ] && ok "dryrun moe-e8: blocks 1..6 in mxfp8 (6 x 3 layers x 3 passes)" ||
  bad "dryrun moe-e8: $(count dry8 "selected: grouped_mxfp8_dequant_bf16") mxfp8 selections"
dry mixtral-tiny 64 drytiny; check "dryrun mixtral-tiny --explain" 0 $?
[ "$(count drytiny "recipe bf16 (policy: fallback safe")" = 6 ] && ok "dryrun mixtral-tiny: BF16 experts, the safe fallback named" ||
  bad "dryrun mixtral-tiny: $(head -c 600 "$tmp/drytiny")"

common=(--model mixtral-tiny --data builtin --batch 4 --seq 32 --eval-every 0 --seed 5 --device cpu --steps 3)
for p in mxfp8 bf16; do
  "$dw" train "${common[@]}" --precision $p --out "$tmp/t$p" >"$tmp/t$p.out" 2>&1; check "train 3 steps in $p on the CPU" 0 $?
done
python3 - "$tmp/tmxfp8/metrics.jsonl" "$tmp/tbf16/metrics.jsonl" <<'PY' && ok "  ... mxfp8 within 1e-2 of bf16, and not equal" || bad "mxfp8 vs bf16 losses"
import json, math, sys
a, b = ([json.loads(x)["loss"] for x in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 3 and all(math.isfinite(x) for x in a), (a, b)
assert all(abs(x - y) / y < 1e-2 for x, y in zip(a, b)) and a != b, (a, b)
PY
echo "$fails failed"
[ $fails -eq 0 ]
