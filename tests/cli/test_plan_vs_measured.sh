#!/usr/bin/env bash
# test_plan_vs_measured.sh DEEPWELL — bench/plan_vs_measured.py (issue 29's planner against
# measured) on a scale.jsonl made here from the planner's own predictions for random runs of
# gpt2-124m and mixtral-tiny (1, 2 or 4 GPUs, ZeRO 0 or 1): a measured step equal to the
# predicted one gives +0.0%, a measured memory 1.25 x the predicted one -20.0%, a run that did not
# finish is listed without a ratio, and a file that is not JSON lines exits 2 naming it.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
seed=${DW_TEST_SEED:-$RANDOM}
echo "seed $seed"
python3 - "$dw" "$seed" >"$tmp/scale.jsonl" <<'PY'
import json, random, subprocess, sys
dw, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
for model in ("gpt2-124m", "mixtral-tiny"):
    n, b, z = rng.choice([1, 2, 4]), rng.choice([1, 2, 4]), rng.choice([0, 1])
    if n == 1: z = 0
    doc = json.loads(subprocess.run([dw, "plan", model, "--hw", "h100-sxm", "--gpus", str(n), "--seq", "512",
                                     "--global-batch", str(b * n), "--json", "--top", "1000"],
                                    capture_output=True, text=True, check=True).stdout)
    for e in [doc["best"]] + doc["alternatives"]:
        p = e["parallel"]
        if (p["dp"], p["tp"], p["pp"], p["cp"], p["ep"]) == (n, 1, 1, 1, 1) and e["micro_batch"] == b and \
           e["grad_accum"] == 1 and e["recompute"] == "none" and e["zero"] == z and not e.get("a2a_overlap"):
            break
    else:
        raise SystemExit(f"no dp{n} mb{b} zero{z} plan for {model}")
    print(json.dumps({"model": model, "gpus": n, "batch_per_gpu": b, "flags": f"--zero {z}" if z else "", "rc": 0,
                      "tokens_per_s": b * 512 * n / e["step_time_s"],
                      "max_gpu_mem_mib": 1.25 * e["peak_memory_bytes"] / 2**20}))
print(json.dumps({"model": "gpt2-124m", "gpus": 2, "batch_per_gpu": 2, "flags": "", "rc": 2, "tokens_per_s": None,
                  "max_gpu_mem_mib": 1000}))
PY
check "the scale.jsonl made from the planner's predictions" 0 $?
python3 "$src/bench/plan_vs_measured.py" "$dw" "$tmp/scale.jsonl" --seq 512 --json >"$tmp/out" 2>&1
check "plan_vs_measured.py" 0 $?
cat "$tmp/out"
python3 - "$tmp/out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert len(rows) == 3, rows
for r in rows[:2]:
    assert abs(r["step_err"]) < 1e-6 and abs(r["mem_err"] + 0.2) < 1e-6, r
assert rows[2]["rc"] == 2 and "step_err" not in rows[2] and rows[2]["step_pred_s"] > 0, rows[2]
PY
check "  ... +0.0% step, -20.0% memory, the unfinished run without a ratio" 0 $?
echo "not json" >"$tmp/bad.jsonl"
python3 "$src/bench/plan_vs_measured.py" "$dw" "$tmp/bad.jsonl" >/dev/null 2>"$tmp/err"
check "a scale.jsonl that is not JSON lines" 2 $?
has "  ... naming it" "$tmp/err" "bad.jsonl"
[ "$fails" -eq 0 ] || exit 1
