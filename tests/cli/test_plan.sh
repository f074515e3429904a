#!/usr/bin/env bash
# test_plan.sh DEEPWELL — `deepwell plan` and `deepwell dryrun` end to end: JSON schema and its
# arithmetic, SVG timeline, measured GEMM rates, dryrun PASS/FAIL exit codes, bad input → exit 2.
set -u
dw=$1
fails=0
check() { # check DESCRIPTION EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL: $1 (exit $3, expected $2)"; fails=$((fails + 1)); else echo "ok: $1"; fi
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
nodes=$((1 << (RANDOM % 3)))  # 1, 2 or 4: with 3 nodes no split of 24 GPUs divides llama-8b
gb=$(( (RANDOM % 8 + 1) * 64 ))

"$dw" plan llama-8b --hw h100-sxm --nodes $nodes --seq 4096 --global-batch $gb --json --top 4 \
  >"$tmp/p.json" 2>"$tmp/err"; check "plan llama-8b --json ($nodes nodes, batch $gb)" 0 $?
python3 - "$tmp/p.json" $nodes $gb <<'PY' || fails=$((fails + 1))
import json, sys
d = json.load(open(sys.argv[1])); nodes, gb = int(sys.argv[2]), int(sys.argv[3])
b = d["best"]
for k in ["peak_memory_bytes", "step_time_s", "tokens_per_s", "mfu", "memory", "parallel", "micro_batch",
          "grad_accum", "recompute", "zero", "offload", "schedule", "virtual_stages", "time"]:
    assert k in b, k
p = b["parallel"]
assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == 8 * nodes, p
assert p["dp"] * b["micro_batch"] * b["grad_accum"] == gb, b
assert 32 % p["tp"] == 0 and 8 % p["tp"] == 0 and p["tp"] <= 8
m = b["memory"]
parts = sum(m[k] for k in ["weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
                           "workspace_bytes", "scales_bytes"])
assert abs(parts - m["total_bytes"]) <= 8, (parts, m)
assert m["total_bytes"] == b["peak_memory_bytes"] <= m["limit_bytes"] <= m["hbm_bytes"]
assert abs(b["tokens_per_s"] * b["step_time_s"] - gb * 4096) < 1e-6 * gb * 4096
assert 0 < b["mfu"] < 1
alts = d["alternatives"]
assert len(alts) <= 3
times = [b["step_time_s"]] + [a["step_time_s"] for a in alts]
assert times == sorted(times), times
assert isinstance(d["rejected"], list)
for r in d["rejected"]:
    assert r["count"] > 0 and r["reason"] and r["example"] == r["examples"][0]
    assert 1 <= len(r["examples"]) <= min(3, r["count"])
assert d["evaluated"] >= d["feasible"] >= 1 + len(alts)
print("ok: plan JSON schema and arithmetic")
PY
cp "$tmp/p.json" "$tmp/plan.json"

"$dw" plan llama-8b --hw h100-sxm --nodes $nodes --seq 4096 --global-batch $gb --json >"$tmp/p2.json"
python3 -c "import json,sys; a=json.load(open('$tmp/p.json'))['best']; b=json.load(open('$tmp/p2.json'))['best']; sys.exit(a!=b)" \
  || { echo "FAIL: plan is not deterministic"; fails=$((fails + 1)); }

"$dw" plan gpt2-124m --hw b200 --seq 1024 --global-batch 256 --precision mxfp8 >"$tmp/table"; check "plan table" 0 $?
grep -q "^best:" "$tmp/table" && grep -q "rejected" "$tmp/table" && grep -q "nothing was run" "$tmp/table" \
  || { echo "FAIL: table lacks best/rejected/notice"; fails=$((fails + 1)); }

"$dw" plan llama-70b --hw h100-sxm --nodes 4 --seq 4096 --global-batch 64 --svg "$tmp/t.svg" >/dev/null
check "plan --svg" 0 $?
python3 - "$tmp/t.svg" <<'PY' || fails=$((fails + 1))
import sys, xml.etree.ElementTree as ET
t = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
rects = t.findall(f"{ns}rect")
titles = [r.find(f"{ns}title").text for r in rects if r.find(f"{ns}title") is not None]
assert any(s.startswith("F ") for s in titles) and any(s.startswith("B ") for s in titles), titles[:4]
print("ok: SVG parses, has F and B blocks:", len(titles))
PY
ls "$tmp"/t.svg.tmp.* >/dev/null 2>&1 && { echo "FAIL: temporary SVG left behind"; fails=$((fails + 1)); }

# measured GEMM rates: a slow measured table slows the prediction
cat >"$tmp/gemm.json" <<'J'
{"results": [{"m": 8192, "n": 8192, "k": 8192, "recipe": "bf16", "tflops": 200},
             {"m": 2048, "n": 2048, "k": 2048, "recipe": "bf16", "tflops": 150}]}
J
"$dw" plan llama-8b --hw h100-sxm --seq 4096 --global-batch 64 --json >"$tmp/a.json"; check "plan (model rates)" 0 $?
"$dw" plan llama-8b --hw h100-sxm --seq 4096 --global-batch 64 --json --gemm-rates "$tmp/gemm.json" >"$tmp/b.json"
check "plan --gemm-rates" 0 $?
python3 -c "import json,sys; a=json.load(open('$tmp/a.json'))['best']['step_time_s']; b=json.load(open('$tmp/b.json'))['best']['step_time_s']; sys.exit(0 if b > 1.5*a else 1)" \
  || { echo "FAIL: measured slow GEMMs did not slow the plan"; fails=$((fails + 1)); }

# MoE
"$dw" plan mixtral-8x7b --hw h100-sxm --nodes 2 --seq 4096 --global-batch 64 --moe experts=8,top_k=2,capacity=1.25 --json >"$tmp/m.json"
check "plan mixtral --moe" 0 $?
python3 -c "import json; d=json.load(open('$tmp/m.json')); assert d['model']['experts']==8 and d['job']['moe_capacity']==1.25; assert 8 % d['best']['parallel']['ep']==0" \
  || { echo "FAIL: MoE job not reflected"; fails=$((fails + 1)); }

# nothing fits → exit 1 with the reason
"$dw" plan llama-405b --hw h100-sxm --seq 8192 --global-batch 64 >"$tmp/out" 2>"$tmp/err"; check "405B on one node does not fit" 1 $?
grep -q "memory_exceeds_hbm" "$tmp/out" || { echo "FAIL: no memory rejection listed"; fails=$((fails + 1)); }

# dryrun: the plan from above passes; a broken one fails
"$dw" dryrun llama-8b --hw h100-sxm --nodes $nodes --seq 4096 --global-batch $gb --plan "$tmp/plan.json" >"$tmp/dr" 2>&1
check "dryrun of the planned best" 0 $?
for w in "PASS  constraints" "PASS  memory" "overlap" "bubble" "SKIP  gpu-run: not requested"; do
  grep -q "$w" "$tmp/dr" || { echo "FAIL: dryrun output lacks '$w'"; fails=$((fails + 1)); }
done
grep -q "weights .* grads .* optimizer .* activations" "$tmp/dr" || { echo "FAIL: no breakdown"; fails=$((fails + 1)); }
echo '{"parallel": {"dp": 1, "tp": 16, "pp": 1, "ep": 1, "cp": 1}, "micro_batch": 1}' >"$tmp/bad.json"
"$dw" dryrun llama-8b --hw h100-sxm --nodes 2 --seq 4096 --global-batch 64 --plan "$tmp/bad.json" >"$tmp/dr" 2>&1
check "dryrun of a TP16 plan fails" 1 $?
grep -q "FAIL  constraints" "$tmp/dr" && grep -q "NVLink domain" "$tmp/dr" || { echo "FAIL: reason missing"; cat "$tmp/dr"; fails=$((fails + 1)); }
echo '{"parallel": {"dp": 8, "tp": 1, "pp": 1, "ep": 1, "cp": 1}, "micro_batch": 8, "recompute": "none", "zero": 0}' >"$tmp/big.json"
"$dw" dryrun llama-8b --hw h100-sxm --seq 4096 --global-batch 64 --plan "$tmp/big.json" >"$tmp/dr" 2>&1
check "dryrun of a plan that does not fit fails" 1 $?
grep -q "FAIL  memory" "$tmp/dr" || { echo "FAIL: memory not failed"; cat "$tmp/dr"; fails=$((fails + 1)); }
"$dw" dryrun gpt2-124m --hw h200 --seq 1024 --global-batch 64 >"$tmp/dr" 2>&1; check "dryrun without --plan" 0 $?
grep -q "planner's best" "$tmp/dr" || { echo "FAIL: dryrun did not say whose plan"; fails=$((fails + 1)); }

# bad input → 2, naming the thing
"$dw" plan llama-8b --hw h100-sxm --seq 4096 2>"$tmp/err"; check "missing --global-batch" 2 $?
grep -q -- "--global-batch" "$tmp/err" || { echo "FAIL: message does not name the flag"; fails=$((fails + 1)); }
"$dw" plan nosuchmodel --hw h100-sxm --seq 4096 --global-batch 8 2>"$tmp/err"; check "unknown model" 2 $?
grep -q "nosuchmodel" "$tmp/err" || { echo "FAIL: message does not name the model"; fails=$((fails + 1)); }
"$dw" plan llama-8b --hw a100 --seq 4096 --global-batch 8 2>/dev/null; check "unknown hw preset" 2 $?
"$dw" plan llama-8b --hw h100-sxm --seq 4096 --global-batch 8 --precision fp16 2>"$tmp/err"; check "unknown precision" 2 $?
grep -q "fp16" "$tmp/err" || { echo "FAIL: message does not name the recipe"; fails=$((fails + 1)); }
"$dw" plan llama-8b --hw h100-sxm --seq 4096 --global-batch 8 --moe experts=8,topk=2 2>"$tmp/err"; check "bad --moe" 2 $?
grep -q "topk" "$tmp/err" || { echo "FAIL: message does not name the key"; fails=$((fails + 1)); }
"$dw" plan llama-8b --hw /nonexistent.json --seq 4096 --global-batch 8 2>"$tmp/err"; check "missing hw file (I/O: exit 3)" 3 $?
"$dw" probe --preset h100-sxm --json | python3 -c "
import json, sys
d = json.load(sys.stdin)
for g in d['gpus']: g['peak']['hbm_gbps'] = None
json.dump(d, open('$tmp/nobw.json', 'w'))"
"$dw" plan llama-8b --hw "$tmp/nobw.json" --seq 4096 --global-batch 8 2>"$tmp/err"; check "hw file without HBM bandwidth" 2 $?
grep -q "hbm_gbps" "$tmp/err" || { echo "FAIL: message does not name the field"; cat "$tmp/err"; fails=$((fails + 1)); }
"$dw" plan llama-8b --hw "$tmp/b.json" --seq 4096 --global-batch 8 2>/dev/null >/dev/null; check "plan output JSON is not a hw file" 2 $?
# this machine: plans when it has GPUs, otherwise exit 2 saying why
"$dw" plan gpt2-124m --hw probe --seq 1024 --global-batch 8 >"$tmp/out" 2>"$tmp/err"; rc=$?
if [ $rc -eq 0 ]; then grep -q "^best:" "$tmp/out" || { echo "FAIL: probe plan"; fails=$((fails + 1)); }
elif [ $rc -eq 2 ]; then grep -q "no GPUs" "$tmp/err" || { echo "FAIL: probe message"; cat "$tmp/err"; fails=$((fails + 1)); }
else echo "FAIL: --hw probe exit $rc"; fails=$((fails + 1)); fi
echo '{"results": [{"m": 1}]}' >"$tmp/g.json"
"$dw" plan llama-8b --hw h100-sxm --seq 4096 --global-batch 8 --gemm-rates "$tmp/g.json" 2>"$tmp/err"; check "bad gemm file" 2 $?
grep -q "g.json" "$tmp/err" || { echo "FAIL: message does not name the file"; fails=$((fails + 1)); }
echo '{"parallel": {"dp": 8}}' >"$tmp/p3.json"
"$dw" dryrun llama-8b --hw h100-sxm --seq 4096 --global-batch 64 --plan "$tmp/p3.json" 2>"$tmp/err"; check "malformed plan file" 2 $?
grep -q "'tp'" "$tmp/err" || { echo "FAIL: message does not name the field"; cat "$tmp/err"; fails=$((fails + 1)); }
"$dw" plan --help | grep -q -- "--svg"; check "plan --help" 0 $?
"$dw" dryrun --help | grep -q -- "NOT RUN"; check "dryrun --help" 0 $?
"$dw" plan llama-8b --bogus 2>/dev/null; check "unknown flag" 2 $?

echo "$fails failed"
[ "$fails" -eq 0 ]
