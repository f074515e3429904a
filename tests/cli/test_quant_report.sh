#!/usr/bin/env bash
# test_quant_report.sh DEEPWELL — `deepwell quant-report RUN` (dw_quant_run_report) over a CPU run
# with --quant-check-every 1: a tiny Llama in fp8_block except one layer in nvfp4 whose policy
# threshold (max_rel_error 0.01) it is always over, so it falls back to BF16 at step 2 and no
# other layer does. The --json report is checked against quant_stats.jsonl and
# precision_decisions.jsonl read independently in Python: every layer and tensor (x, x^T, w, w^T,
# dy, dy^T), its number of checks, first, last and largest bulk error with their steps,
# overflow/underflow sums, the quantisers' counters per layer (x, w, dy; the steps covered), the
# largest bulk error per checkpoint interval (--ckpt-every 3), the fallback and the recipe now
# (bf16, from the latest checkpoint). The table names the same. Refusals: a directory without
# quant_stats.jsonl (exit 3, naming it), --recipes with a run (exit 2). Every tensor of that run
# is measured whole; one with --quant-check-elements 64..512 samples every tensor in 1-row blocks
# and falls back the same; a negative cap is refused naming the flag (2).
set -u
bin=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
model=$tmp/llama
mkdir -p "$model"
echo '{"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 128, "max_position_embeddings": 64}' >"$model/config.json"
layer=model.layers.0.mlp.down_proj
echo '{"default": "fp8_block", "fallback": "none", "rules": [{"match": "'$layer'", "recipe": "nvfp4"}],
  "max_rel_error": {"nvfp4": 0.01}}' >"$tmp/policy.json"
"$bin" train --model "$model" --data builtin --batch 2 --seq 16 --eval-every 0 --ckpt-minutes 0 --device cpu \
  --policy "$tmp/policy.json" --quant-check-every 1 --quant-fallback-after 2 --steps 8 --ckpt-every 3 \
  --out "$tmp/run" >"$tmp/train.out" 2>&1
check "a run with quantised layers and a fallback" 0 $?

"$bin" quant-report "$tmp/run" --json >"$tmp/report.json" 2>"$tmp/report.err"
check "quant-report RUN --json" 0 $?
/usr/bin/python3 - "$tmp/run" "$tmp/report.json" "$layer" <<'PY' >"$tmp/py.out" 2>&1
import json, sys
run, rep, fell = sys.argv[1:4]
r = json.load(open(rep))
lines = [json.loads(l) for l in open(run + "/quant_stats.jsonl")]
stats = [s for s in lines if "tensor" in s]  # the checks' measurements
counts = [s for s in lines if "counts" in s]  # the quantisers' counters, per layer since the last check
need_lines = len(stats) + len(counts) == len(lines)
dec = [json.loads(l) for l in open(run + "/precision_decisions.jsonl")]
errs = []
def need(c, msg):
    if not c: errs.append(msg)
need(need_lines, "lines neither measurements nor counts")
need(r["checks"] == len(stats), "checks %s vs %d lines" % (r["checks"], len(stats)))
need(r["first_step"] == 1 and r["last_step"] == 8 and r["ckpt_every"] == 3, "steps/interval %s" % r)
need(r["checkpoint"].endswith("ckpt-8"), "checkpoint %s" % r["checkpoint"])
names = []
for s in stats:
    if s["layer"] not in names: names.append(s["layer"])
need([l["layer"] for l in r["layers"]] == names, "layers %s vs %s" % ([l["layer"] for l in r["layers"]], names))
for l in r["layers"]:
    mine = [s for s in stats if s["layer"] == l["layer"]]
    tens = []
    for s in mine:
        if s["tensor"] not in tens: tens.append(s["tensor"])
    need([t["tensor"] for t in l["tensors"]] == tens, "%s tensors" % l["layer"])
    for t in l["tensors"]:
        ss = [s for s in mine if s["tensor"] == t["tensor"]]
        mx = ss[0]
        for s in ss:
            if s["bulk_error"] > mx["bulk_error"]: mx = s
        want = {"checks": len(ss), "recipe": ss[0]["recipe"],
                "first": {"step": ss[0]["step"], "bulk_error": ss[0]["bulk_error"], "rel_error": ss[0]["rel_error"]},
                "last": {"step": ss[-1]["step"], "bulk_error": ss[-1]["bulk_error"], "rel_error": ss[-1]["rel_error"]},
                "max": {"step": mx["step"], "bulk_error": mx["bulk_error"], "rel_error": mx["rel_error"]},
                "overflow": sum(s["overflow"] for s in ss), "underflow": sum(s["underflow"] for s in ss)}
        for k, v in want.items():
            need(t[k] == v, "%s %s %s: %s vs %s" % (l["layer"], t["tensor"], k, t[k], v))
    cs = [c for c in counts if c["layer"] == l["layer"]]
    if cs:
        want = {"steps": sum(c["steps"] for c in cs if c["counts"] == "x")}
        for kind in ("x", "w", "dy"):
            want[kind] = {"overflow": sum(c["overflow"] for c in cs if c["counts"] == kind),
                          "underflow": sum(c["underflow"] for c in cs if c["counts"] == kind)}
        need(l["counts"] == want, "%s counts %s vs %s" % (l["layer"], l["counts"], want))
    else:
        need(l["counts"] is None, "%s counts %s, no lines" % (l["layer"], l["counts"]))
    for k, iv in enumerate(l["intervals"]):
        lo, hi = 3 * k + 1, min(3 * k + 3, 8)
        vals = [s["bulk_error"] for s in mine if lo <= s["step"] <= hi]
        need(iv["from"] == lo and iv["to"] == hi and iv["max_bulk_error"] == (max(vals) if vals else None),
             "%s interval %s: %s" % (l["layer"], iv, vals))
    need(len(l["intervals"]) == 3, "%s: %d intervals" % (l["layer"], len(l["intervals"])))
    fb = [d for d in dec if d["layer"] == l["layer"]]
    need(l["fallbacks"] == fb, "%s fallbacks %s vs %s" % (l["layer"], l["fallbacks"], fb))
    if l["layer"] == fell:
        need(len(fb) == 1 and fb[0]["step"] == 2 and l["now"] == "bf16" and l["recipe"] == "nvfp4",
             "the nvfp4 layer: %s" % {k: l[k] for k in ("recipe", "now", "fallbacks")})
        need(all(t["checks"] == 2 for t in l["tensors"]), "the nvfp4 layer measured after its fallback")
        need(l["counts"]["steps"] == 2, "the nvfp4 layer counted after its fallback: %s" % l["counts"])
    else:
        need(not fb and l["now"] == "fp8_block" and l["recipe"] == "x fp8_block, w fp8_block2d",
             "%s: %s %s" % (l["layer"], l["recipe"], l["now"]))
        need(all(t["checks"] == 8 for t in l["tensors"]), "%s: checks" % l["layer"])
        need(l["counts"]["steps"] == 8, "%s: counted steps %s" % (l["layer"], l["counts"]))
    need(sorted(t["tensor"] for t in l["tensors"]) == ["dy", "dy^T", "w", "w^T", "x", "x^T"], "%s: %s" % (l["layer"], l["tensors"]))
print("\n".join(errs) if errs else "OK %d layers" % len(r["layers"]))
sys.exit(1 if errs else 0)
PY
rc=$?
check "the JSON report equals the files read in Python ($(tail -1 "$tmp/py.out"))" 0 $rc
[ "$(tail -1 "$tmp/py.out")" = "OK 8 layers" ] || cat "$tmp/py.out"

"$bin" quant-report "$tmp/run" >"$tmp/report.txt" 2>&1
check "quant-report RUN" 0 $?
has "  ... the table" "$tmp/report.txt" "1 fallback(s)" "$layer" "step 2: " "relative quantisation error (bulk) over 0.01" \
  "largest bulk error per checkpoint interval (every 3 steps" "1-3" "7-8" \
  "overflow / underflow counted by the quantisers at every training step"
grep -q "^$layer .* nvfp4 .* bf16 " "$tmp/report.txt" && ok "  ... recipe and now" || bad "$(grep "^$layer" "$tmp/report.txt")"

mkdir -p "$tmp/empty"
"$bin" quant-report "$tmp/empty" >"$tmp/e.out" 2>&1
check "a directory without quant_stats.jsonl" 3 $?
has "  ... named" "$tmp/e.out" "$tmp/empty" "quant_stats.jsonl"
"$bin" quant-report "$tmp/run" --recipes nvfp4 >"$tmp/e.out" 2>&1
check "--recipes with a run directory" 2 $?
has "  ... named" "$tmp/e.out" "--recipes"

# --quant-check-elements: the run above (the default cap, 1M) measured every tensor whole; a cap
# of 64..512 elements (x is [32, 64] or [32, 128], w up to [256, 64], dy up to [32, 256]: all over
# it) samples each of them in whole block rows within the cap, and the decision is the same
cap=$((64 + RANDOM % 449))
"$bin" train --model "$model" --data builtin --batch 2 --seq 16 --eval-every 0 --ckpt-minutes 0 --device cpu \
  --policy "$tmp/policy.json" --quant-check-every 1 --quant-fallback-after 2 --steps 3 --quant-check-elements $cap \
  --out "$tmp/capped" >"$tmp/capped.out" 2>&1
check "--quant-check-elements $cap" 0 $?
/usr/bin/python3 - "$tmp/run" "$tmp/capped" "$cap" "$layer" <<'PY' >"$tmp/cap.out" 2>&1
import json, sys
whole, capped, cap, fell = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = lambda d: [json.loads(l) for l in open(d + "/quant_stats.jsonl") if '"tensor"' in l]
errs = [f"whole run: {s['layer']} {s['tensor']} measured {s['measured']} of {s['elements']}"
        for s in rows(whole) if s["measured"] != s["elements"]]
# 1-row blocks (nvfp4, fp8_block's x and dy): k = cap // C >= 1 rows of C <= 256, within the cap unless
# one row is over it; fp8_block2d (w, w^T): whole 128-row block rows (at least one: all of a
# tensor of one block row)
for s in rows(capped):
    if s["recipe"] == "fp8_block2d":
        ok = s["measured"] == s["elements"] or s["measured"] < s["elements"] and s["measured"] % (128 * 64) == 0
    else:
        ok = 0 < s["measured"] < s["elements"] and s["measured"] <= max(cap, 256)
    if not ok:
        errs.append(f"capped: {s['layer']} {s['tensor']} measured {s['measured']} of {s['elements']} (cap {cap})")
dec = [json.loads(l) for l in open(capped + "/precision_decisions.jsonl")]
if [(d["step"], d["layer"]) for d in dec] != [(2, fell)]:
    errs.append(f"capped decisions: {dec}")
print("\n".join(errs[:10]) or f"cap {cap}: every measurement as sampled")
sys.exit(1 if errs else 0)
PY
rc=$?
check "sampled measurements ($(tail -1 "$tmp/cap.out"))" 0 $rc
"$bin" train --model "$model" --data builtin --steps 1 --device cpu --quant-check-elements -5 --out "$tmp/neg" \
  >"$tmp/e.out" 2>&1
check "--quant-check-elements -5" 2 $?
has "  ... named" "$tmp/e.out" "--quant-check-elements"

[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all quant-report RUN checks passed"
