#!/usr/bin/env bash
# test_moe_fp8_loss.sh DEEPWELL — bench/moe_fp8_loss.sh tiny on the CPU: mixtral-tiny, 6 steps of
# 2 x 64 on a small text, both recipes run to their end (WAIT_END=1), result.json holds the two
# means and their relative difference as printed; with
# --fp8-wgrad a third run under the policy with the experts' wgrad in fp8_block too (its rule's
# "bf16_passes": [] recorded in the run's policy, where the plain fp8_block run records none); a
# bad flag exits 2 naming it, and --bf16-wgrad (the default now) exits 2 naming --fp8-wgrad.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
head -c 20000 "$src/README.md" >"$tmp/text.txt"
# WAIT_END=1: each run writes its end-of-run checkpoint, whose state.json records the policy checked
# below (stopped at its last step, as at scale, the run could be killed before it: session 26's
# sanitized CI was)
OUT=$tmp WAIT_END=1 bash "$src/bench/moe_fp8_loss.sh" "$dw" --model mixtral-tiny --steps 6 --batch 2 --seq 64 --warmup 2 \
  --lr 1e-3 --device cpu --text "$tmp/text.txt" --fp8-wgrad >"$tmp/out" 2>&1
check "moe_fp8_loss.sh on CPU" 0 $?
cat "$tmp/out"
python3 - "$tmp/moe_fp8_loss" <<'PY'
import json, sys
d = sys.argv[1]
r = json.load(open(f"{d}/result.json"))
for rec in ("bf16", "fp8_block", "fp8_block_wgrad_fp8"):
    rows = [json.loads(l) for l in open(f"{d}/{rec}/metrics.jsonl")]
    assert [x["step"] for x in rows] == list(range(1, 7)), rows
    mean = sum(x["loss"] for x in rows) / 6
    assert abs(mean - r[f"{rec}_mean_last"]) <= 1e-12 * mean, (rec, mean, r)
assert r["steps"] == 6 and abs(r["rel"] - (r["fp8_block_mean_last"] / r["bf16_mean_last"] - 1)) < 1e-12, r
assert abs(r["rel_wgrad_fp8"] - (r["fp8_block_wgrad_fp8_mean_last"] / r["bf16_mean_last"] - 1)) < 1e-12, r
PY
check "  ... result.json's means and difference" 0 $?
has "  ... printed" "$tmp/out" "6 steps: bf16"
has "  ... the fp8-wgrad run printed" "$tmp/out" "experts' wgrad in fp8_block too"
grep -rqE '"bf16_passes": ?\[\]' "$tmp/moe_fp8_loss/fp8_block_wgrad_fp8" 2>/dev/null
check "  ... its policy (\"bf16_passes\": []) recorded in the run" 0 $?
grep -rq '"bf16_passes"' "$tmp/moe_fp8_loss/fp8_block" 2>/dev/null
check "  ... and none in the plain fp8_block run's" 1 $?
OUT=$tmp bash "$src/bench/moe_fp8_loss.sh" "$dw" --bogus 1 >/dev/null 2>"$tmp/err"
check "a bad flag" 2 $?
has "  ... named" "$tmp/err" "unknown flag '--bogus'"
OUT=$tmp bash "$src/bench/moe_fp8_loss.sh" "$dw" --bf16-wgrad >/dev/null 2>"$tmp/err"
check "--bf16-wgrad, the default now" 2 $?
has "  ... naming --fp8-wgrad" "$tmp/err" "--bf16-wgrad is the default now" "--fp8-wgrad adds the run"
[ "$fails" -eq 0 ] || exit 1
