#!/usr/bin/env bash
# test_moe.sh DEEPWELL — `deepwell train` of a mixture of experts with a capacity (mixtral-tiny's
# config with capacity_factor 0.5): --moe-drop probs and position train, change the first loss
# (same weights and data, other assignments kept), and the checkpoint's config.json records the
# policy; metrics.jsonl carries moe_dropped and moe_dropped_frac (factor 0.5 drops at least half of
# every layer's assignments) and the progress line shows them; a wrong --moe-drop is refused naming
# the flag; a dense model writes no moe_dropped. `deepwell plan` takes the capacity from config.json
# or --moe capacity=F (below 1 too) and refuses 0.
set -u
dw=$1
. "$(dirname "$0")/checks.sh" # ok, bad, check, has; $tmp
export OMP_NUM_THREADS=1
seed=${DW_TEST_SEED:-$(( (RANDOM << 15) | RANDOM ))}
echo "test seed: DW_TEST_SEED=$seed"

mkdir -p "$tmp/mix"
"$dw" capture mixtral-tiny --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["config"]
c["capacity_factor"] = 0.5
json.dump(c, open(sys.argv[1], "w"))' "$tmp/mix/config.json"
common=(--model "$tmp/mix" --data builtin --batch 4 --seq 32 --global-batch 8 --steps 2 --eval-every 0
        --seed $((seed % 100000)) --device cpu)

for p in probs position; do
  "$dw" train "${common[@]}" --moe-drop $p --out "$tmp/$p" >/dev/null 2>"$tmp/err_$p"
  check "mixtral-tiny with capacity 0.5 trains with --moe-drop $p" 0 $?
done
grep -q '"moe_token_drop_policy": "probs"' "$tmp/probs/ckpt-2/config.json" && ok "  ... probs recorded in config.json" ||
  bad "config.json lacks moe_token_drop_policy probs"
grep -q 'moe_token_drop_policy' "$tmp/position/ckpt-2/config.json" && bad "position wrote a drop policy" ||
  ok "  ... position (the default) writes no key"
python3 - "$tmp/probs/metrics.jsonl" "$tmp/position/metrics.jsonl" <<'PY' && ok "  ... moe_dropped logged; the policies keep different assignments" || bad "moe_dropped metrics"
import json, sys
runs = [[json.loads(x) for x in open(f)] for f in sys.argv[1:]]
for r in runs:
    assert len(r) == 2
    for m in r:
        # 8 sequences x 32 tokens x top-2 x 2 layers = 1024 assignments; capacity 0.5 keeps at most half
        assert m["moe_dropped"] >= 512 and m["moe_dropped"] == round(m["moe_dropped"]), m
        assert abs(m["moe_dropped_frac"] - m["moe_dropped"] / 1024) < 1e-12, m
assert runs[0][0]["loss"] != runs[1][0]["loss"], (runs[0][0]["loss"], runs[1][0]["loss"])
PY
grep -Eq "\| dropped [0-9]+ \([0-9.]+%\) \|" "$tmp/err_probs" && ok "  ... and shown in the progress line" ||
  bad "progress line lacks dropped: $(tail -2 "$tmp/err_probs")"

"$dw" train "${common[@]}" --moe-drop weight --out "$tmp/w" >/dev/null 2>"$tmp/err"
check "--moe-drop weight refused" 2 $?
has "  ... naming the flag" "$tmp/err" "--moe-drop must be probs or position"

# deepwell plan: the config's capacity_factor is the planner's capacity unless --moe capacity= says
plan=(--hw h100-sxm --seq 256 --global-batch 8 --json)
"$dw" plan "$tmp/mix" "${plan[@]}" >"$tmp/p1.json" 2>"$tmp/err" &&
"$dw" plan "$tmp/mix" "${plan[@]}" --moe capacity=0.25 >"$tmp/p2.json" 2>>"$tmp/err"
check "plan reads a capacity below 1 from config.json and from --moe" 0 $?
python3 - "$tmp/p1.json" "$tmp/p2.json" <<'PY' && ok "  ... 0.5 from the config, 0.25 from the flag" || bad "plan capacities"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a["job"]["moe_capacity"] == 0.5 and b["job"]["moe_capacity"] == 0.25, (a["job"], b["job"])
PY
"$dw" plan "$tmp/mix" "${plan[@]}" --moe capacity=0 >/dev/null 2>"$tmp/err"
check "plan --moe capacity=0 refused" 2 $?
has "  ... naming the range" "$tmp/err" "--moe capacity expects a number in (0, 64]"

tiny_gpt2 "$tmp/dense"
"$dw" train --model "$tmp/dense" --data builtin --batch 2 --seq 16 --steps 1 --eval-every 0 --out "$tmp/d" >/dev/null 2>&1
grep -q moe_dropped "$tmp/d/metrics.jsonl" && bad "a dense model logs moe_dropped" || ok "a dense model logs no moe_dropped"
echo "$fails failed"
[ $fails -eq 0 ]
