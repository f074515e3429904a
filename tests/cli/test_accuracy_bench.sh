#!/usr/bin/env bash
# test_accuracy_bench.sh DEEPWELL — bench/accuracy.sh run tiny on the CPU (2 layers of width 64,
# 8 steps, seed 1, bf16 and mxfp8 beside PyTorch BF16, two jobs at once): accuracy.jsonl holds
# one well-formed line per job and the table agrees with it; at step 0 the PyTorch model is
# Deepwell's model (the reference's initial weights through `deepwell eval --weights` give its
# initial loss to 1e-5) and both initialisations give the loss an untrained byte model has; a bad
# flag is refused (exit 2) and a failing run is reported (exit 1); SIGTERM mid-run stops the runs,
# tabulates the finished one and exits 143, leaving nothing running and no work folder.
set -u
dw=$1
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$(dirname "$0")/checks.sh" # ok, bad, check, has; $tmp
export OMP_NUM_THREADS=1 PYTHON=/usr/bin/python3
if ! $PYTHON -c "import torch, numpy" 2>/dev/null; then
  bad "$PYTHON cannot import torch and numpy (Debian: apt-get install python3-torch python3-numpy)"
  exit 1
fi
tiny=(--layers 2 --width 64 --batch 2 --seq 32 --steps 8 --warmup 2 --eval-batches 2 --device cpu)

OUT=$tmp/out WORK=$tmp/work bash "$src/bench/accuracy.sh" "$dw" "${tiny[@]}" --seeds 1 --recipes bf16,mxfp8 \
  --gpus 2 >"$tmp/table" 2>"$tmp/err"
rc=$?
check "accuracy.sh tiny on the CPU, two jobs at once" 0 $rc
[ $rc = 0 ] || cat "$tmp/err" "$tmp/table"
cmp -s "$tmp/table" "$tmp/out/accuracy.md" && ok "the printed table is accuracy.md" || bad "printed table != accuracy.md"

# The JSON lines and the table: one line per job, the fields, finite losses, training lowered the
# loss, and each table row's mean and gaps computed from the lines.
$PYTHON - "$tmp/out/accuracy.jsonl" "$tmp/out/accuracy.md" "$tmp/out/runs" <<'PY' && ok "accuracy.jsonl and accuracy.md agree" || bad "accuracy.jsonl / accuracy.md"
import json, math, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
md = open(sys.argv[2]).read().splitlines()
runs = sys.argv[3]  # each run's own line, written as it ended
assert sorted(os.listdir(runs)) == ["bf16_s1", "mxfp8_s1", "torch_bf16_s1"], os.listdir(runs)
assert sorted(json.dumps(json.load(open(f"{runs}/{n}/row.json"))) for n in os.listdir(runs)) == sorted(
    json.dumps(r) for r in rows)
assert [(r["impl"], r["recipe"], r["seed"]) for r in rows] == [
    ("pytorch", "torch_bf16", 1), ("deepwell", "bf16", 1), ("deepwell", "mxfp8", 1)], rows
for r in rows:
    for k in ("steps", "first_loss", "val_loss", "tokens_per_s", "wall_s"):
        assert isinstance(r[k], (int, float)) and math.isfinite(r[k]) and r[k] > 0, (k, r)
    assert r["steps"] == 8 and r["val_loss"] < r["first_loss"] - 0.3, r
head = [i for i, l in enumerate(md) if l.startswith("| recipe |")]
assert len(head) == 1 and md[head[0] + 1].startswith("| --- |"), md
cols = [c.strip() for c in md[head[0]].strip("|").split("|")]
table = {}
for l in md[head[0] + 2:]:
    if not l.startswith("|"):
        break
    cells = [c.strip() for c in l.strip("|").split("|")]
    assert len(cells) == len(cols), l
    table[cells[0]] = dict(zip(cols, cells))
assert list(table) == ["PyTorch BF16", "Deepwell BF16", "mxfp8"], list(table)
v = {r["recipe"]: r["val_loss"] for r in rows}
for name, k in (("PyTorch BF16", "torch_bf16"), ("Deepwell BF16", "bf16"), ("mxfp8", "mxfp8")):
    assert table[name]["val loss mean ± sd"] == f"{v[k]:.4f} ± 0.0000", table[name]
    assert table[name]["seeds"] == "1"
assert table["mxfp8"]["vs Deepwell BF16"] == f"{100 * (v['mxfp8'] / v['bf16'] - 1):+.2f}%"
assert table["mxfp8"]["vs PyTorch BF16"] == f"{100 * (v['mxfp8'] / v['torch_bf16'] - 1):+.2f}%"
assert table["Deepwell BF16"]["vs PyTorch BF16"] == f"{100 * (v['bf16'] / v['torch_bf16'] - 1):+.2f}%"
for name, ref, band in (("Deepwell BF16", "torch_bf16", 0.01), ("mxfp8", "bf16", 0.01)):
    want = "PASS" if v["mxfp8" if name == "mxfp8" else "bf16"] / v[ref] - 1 <= band else "FAIL"
    assert table[name]["result"] == want, (name, table[name])
assert any(l.startswith("Bands: ") and "3 runs, 0 failed" in l for l in md), md
PY

# Step 0. The same weights: the reference's initial weights in Deepwell give the reference's
# initial validation loss (first micro-batch, FP32) — the two models are one model. Independent
# initialisations (seed 1 of each): both near the untrained byte model's expected loss
# ln 256 + width * 0.02^2 / 2 (random logits of variance width * 0.02^2; 5.558 here): within 3%,
# since which bytes the few frequent ones are scored by differs with the draw (8 Deepwell seeds on
# this batch: 5.50 ... 5.64; at width 512 the expectation is 5.65, 1.9% above ln 256).
d=$tmp/work/data
$PYTHON - "$src" "$d" "$tmp" >"$tmp/t0" 2>"$tmp/err" <<'PY' # the reference's run, then its weights as safetensors
import runpy, sys
src, d, tmp = sys.argv[1:]
sys.argv = ["accuracy_torch.py", "--config", d + "/model/config.json", "--train", d + "/train.txt", "--val",
            d + "/val.txt", "--seed", "1", "--steps", "1", "--batch", "8", "--seq", "32", "--device", "cpu",
            "--init-out", tmp + "/init.pt"]
runpy.run_path(src + "/bench/accuracy_torch.py", run_name="__main__")
sys.path.insert(0, src + "/tests/python")
import torch
from parity import st_write
st_write(tmp + "/init.safetensors", torch.load(tmp + "/init.pt"))
PY
check "accuracy_torch.py --init-out, written as safetensors by parity.py's st_write" 0 $?
"$dw" eval "$d/model" --data "$d/val.txt" --batch 8 --seq 32 --weights "$tmp/init.safetensors" >"$tmp/same" 2>"$tmp/err"
check "deepwell eval of the reference's initial weights" 0 $?
"$dw" eval "$d/model" --data "$d/val.txt" --batch 8 --seq 32 --seed 1 >"$tmp/own" 2>"$tmp/err"
check "deepwell eval of its own seed-1 weights" 0 $?
$PYTHON - "$tmp/t0" "$tmp/same" "$tmp/own" <<'PY' && ok "step-0 losses agree" || bad "step-0 losses"
import json, math, sys
t = json.loads(open(sys.argv[1]).read().splitlines()[-1])["init_val_loss"]
same = float(open(sys.argv[2]).read().split()[1])
own = float(open(sys.argv[3]).read().split()[1])
print(f"torch {t:.6f}, deepwell same weights {same:.6f}, deepwell seed 1 {own:.6f}")
assert abs(same - t) <= 1e-5 * t, (same, t)
expect = math.log(256) + 64 * 0.02 ** 2 / 2
for x in (t, own):
    assert abs(x / expect - 1) < 0.03, (x, expect)
PY

# A bad flag: exit 2 naming it; a recipe Deepwell refuses: its run fails, exit 1, listed as failed.
bash "$src/bench/accuracy.sh" "$dw" --stepz 3 >/dev/null 2>"$tmp/err"
check "an unknown flag is refused" 2 $?
has "the refusal names the flag" "$tmp/err" "unknown flag '--stepz'"
bash "$src/bench/accuracy.sh" "$dw" --seeds 1,x >/dev/null 2>"$tmp/err"
check "a bad --seeds is refused" 2 $?
has "the refusal names --seeds" "$tmp/err" "--seeds '1,x'"
OUT=$tmp/out2 bash "$src/bench/accuracy.sh" "$dw" "${tiny[@]}" --seeds 1 --recipes fp3 --no-torch --text "$d/val.txt" \
  >/dev/null 2>"$tmp/err"
check "a run that fails makes the script fail" 1 $?
has "the failed run is in the table with its error" "$tmp/out2/accuracy.md" "0 runs, 1 failed" "failed: fp3 seed 1" "unknown recipe 'fp3'"

# Interrupted mid-run as `timeout` does it: SIGTERM to the script's whole process group (so the runs
# get it too), four jobs one at a time, once the first has its row.json and the second its log (150
# steps: it runs for seconds). No job starts after the signal, the running one is stopped, the
# finished one is tabulated, exit 143; nothing of the bench still runs, its work folder (mktemp
# under TMPDIR) is gone, and no run wrote into a removed folder.
sig=$tmp/sig
mkdir -p "$sig/tmp" && cp "$d/val.txt" "$sig/text.txt" # the path names each of the bench's processes
TMPDIR=$sig/tmp OUT=$sig/out setsid bash "$src/bench/accuracy.sh" "$dw" "${tiny[@]}" --steps 150 --seeds 1,2,3,4 \
  --recipes bf16 --no-torch --text "$sig/text.txt" >"$sig/table" 2>"$sig/err" &
pid=$!
for ((i = 0; i < 900; i++)); do
  [ -e "$sig/out/runs/bf16_s1/row.json" ] && [ -e "$sig/out/runs/bf16_s2/log" ] && break
  sleep 0.1
done
kill -TERM -- -"$pid"
wait "$pid"
check "accuracy.sh stopped by SIGTERM mid-run exits 143" 143 $?
sleep 1
if pgrep -f -- "$sig/" >/dev/null; then bad "the stopped bench still runs: $(pgrep -af -- "$sig/")"; else ok "nothing of the stopped bench still runs"; fi
[ -z "$(ls -A "$sig/tmp")" ] && ok "its work folder is removed" || bad "its work folder is left: $(ls -A "$sig/tmp")"
if grep -rq "cannot create directory" "$sig/err" "$sig/out/runs"; then bad "a run wrote into a removed folder: $(grep -r "cannot create" "$sig/err" "$sig/out/runs")"; else ok "no run wrote into a removed folder"; fi
has "the finished run is tabulated, the stopped and unstarted ones listed" "$sig/table" "| Deepwell BF16 | 1 |" \
  "1 runs, 3 failed" "failed: bf16 seed 2: interrupted by SIGTERM" "failed: bf16 seed 3: not started: SIGTERM" \
  "failed: bf16 seed 4: not started: SIGTERM"
cmp -s "$sig/table" "$sig/out/accuracy.md" && ok "the stopped bench's table is its accuracy.md" || bad "stopped: printed table != accuracy.md"

[ "$fails" = 0 ] && echo "all passed" || echo "$fails failed"
[ "$fails" = 0 ]
