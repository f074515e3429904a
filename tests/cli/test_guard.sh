#!/usr/bin/env bash
# test_guard.sh DEEPWELL — the training guardrails from the command line (docs/precision.md,
# "Guardrails") on a tiny Llama on the CPU:
#   - a weight of +inf loaded with --init-from makes every loss NaN: each step is skipped and
#     logged, metrics.jsonl marks it "skipped", and --max-skips N in a row stop the run (exit 1)
#     with a checkpoint whose weights are the loaded ones, bit for bit;
#   - a real overflow: --lr 1e30 makes step 1's update finite but huge, so every later forward
#     overflows; the skipped steps leave weights and moments byte for byte those of step 1's
#     checkpoint;
#   - under --precision nvfp4, the one layer whose weight carries an outlier channel (every 16th
#     input at 40x the RMS; loaded from a safetensors file) falls back to BF16 after
#     --quant-fallback-after checks, alone; DIR/precision_decisions.jsonl and stderr say so,
#     DIR/quant_stats.jsonl has every check, and --resume keeps the fallback (even with the checks
#     off);
#   - with 2 ranks (`deepwell launch -n 2`, CPU) both decide alike: each logs the fallback at the
#     same step, rank 0 writes it once, the run completes (no rank waits on a collective the other
#     skipped; checkpoints every step compare the weights), and the skips stop both ranks;
#   - bad flag values are refused naming the flag (exit 2).
set -u
bin=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1 DW_LOG=info DW_COMM_TIMEOUT=60
model=$tmp/llama
mkdir -p "$model"
echo '{"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 128, "max_position_embeddings": 64}' >"$model/config.json"
common=(--model "$model" --data builtin --batch 2 --seq 16 --eval-every 0 --ckpt-minutes 0 --device cpu)

# starting weights: one plain step's checkpoint, then edited copies
"$bin" train "${common[@]}" --out "$tmp/base" --steps 1 >"$tmp/base.out" 2>&1
check "a plain step" 0 $?
# edit.py IN OUT TENSOR MODE: MODE inf (one element +inf) or outlier (every 16th column of the
# [M,K] weight at +-40 x its RMS, from a random column)
cat >"$tmp/edit.py" <<'PY'
import json, struct, sys, random
import numpy as np
src, dst, name, mode = sys.argv[1:5]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
body = bytearray(raw[8 + n:])
t = head[name]
assert t["dtype"] == "F32", t
a, b = t["data_offsets"]
w = np.frombuffer(bytes(body[a:b]), dtype="<f4").reshape(t["shape"]).copy()
rng = random.Random()
if mode == "inf":
    w.flat[rng.randrange(w.size)] = np.inf
else:
    big = 40.0 * float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
    c0 = rng.randrange(16)
    for c in range(c0, w.shape[1], 16):
        w[:, c] = np.where(np.array([rng.random() < 0.5 for _ in range(w.shape[0])]), big, -big)
body[a:b] = w.astype("<f4").tobytes()
open(dst, "wb").write(raw[:8 + n] + bytes(body))
PY
/usr/bin/python3 "$tmp/edit.py" "$tmp/base/ckpt-1/model.safetensors" "$tmp/inf.safetensors" \
  model.layers.0.mlp.down_proj.weight inf
check "a weight set to +inf" 0 $?

# --- non-finite steps: skipped, then the stop --------------------------------------------------
"$bin" train "${common[@]}" --out "$tmp/nan" --steps 10 --init-from "$tmp/inf.safetensors" --max-skips 3 \
  >"$tmp/nan.out" 2>&1
check "3 non-finite steps in a row stop the run" 1 $?
has "the stop names the flag and the checkpoint" "$tmp/nan.out" "3 steps in a row skipped" "--max-skips 3" \
  "$tmp/nan/ckpt-3"
has "each skip is logged" "$tmp/nan.out" "step 1 skipped: nonfinite loss" "step 3 skipped: nonfinite loss" \
  "SKIPPED: nonfinite loss"
[ "$(grep -c '"skipped": "nonfinite loss"' "$tmp/nan/metrics.jsonl")" = 3 ] && ok "metrics.jsonl marks 3 skips" ||
  bad "metrics.jsonl: $(cat "$tmp/nan/metrics.jsonl")"
/usr/bin/python3 - "$tmp/inf.safetensors" "$tmp/nan/ckpt-3/model.safetensors" <<'PY'
import json, struct, sys
def tensors(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
bad = [k for k in a if a[k] != b[k]]
assert not bad, bad
PY
check "the checkpoint holds the loaded weights bit for bit" 0 $?

# a real overflow from training itself: step 1 moves the weights by ~1e30, step 2 on overflow
"$bin" train "${common[@]}" --out "$tmp/lr" --steps 10 --lr 1e30 --min-lr 0 --warmup 0 --schedule constant \
  --max-skips 3 --ckpt-every 1 --keep 0 >"$tmp/lr.out" 2>&1
check "--lr 1e30: steps 2-4 overflow and stop the run" 1 $?
has "  ... step 1 trained, 2 skipped" "$tmp/lr.out" "step 1/10 | loss " "step 2 skipped: nonfinite" "ckpt-4 holds"
cmp -s "$tmp/lr/ckpt-1/model.safetensors" "$tmp/lr/ckpt-4/model.safetensors" &&
  cmp -s "$tmp/lr/ckpt-1/optimizer.safetensors" "$tmp/lr/ckpt-4/optimizer.safetensors" &&
  ok "  ... weights and moments after 3 skipped steps are step 1's, byte for byte" ||
  bad "  ... the skipped steps changed the checkpoint files"

# --- an outlier layer under nvfp4 falls back alone ----------------------------------------------
layer=model.layers.0.mlp.up_proj
/usr/bin/python3 "$tmp/edit.py" "$tmp/base/ckpt-1/model.safetensors" "$tmp/outlier.safetensors" "$layer.weight" outlier
check "an outlier channel planted" 0 $?
q=(--precision nvfp4 --fallback none --quant-check-every 1 --quant-fallback-after 2)
"$bin" train "${common[@]}" "${q[@]}" --out "$tmp/q" --steps 3 --init-from "$tmp/outlier.safetensors" \
  >"$tmp/q.out" 2>&1
check "an nvfp4 run with an outlier layer" 0 $?
has "stderr names the fallback" "$tmp/q.out" "precision: step 2: $layer falls back to bf16: w nvfp4 error" \
  "precision: to bf16 after step 2: $layer w"
[ "$(grep -c . "$tmp/q/precision_decisions.jsonl")" = 1 ] && ok "one decision" ||
  bad "decisions: $(cat "$tmp/q/precision_decisions.jsonl")"
has "the decision: step, layer, tensor, reason, value" "$tmp/q/precision_decisions.jsonl" \
  "{\"step\": 2, \"layer\": \"$layer\", \"tensor\": \"w\", \"reason\": \"relative quantisation error (bulk) over 0.25" \
  '"bulk_error": ' '"recipe": "nvfp4", "to": "bf16"}'
[ "$(grep -c "\"layer\": \"$layer\", \"tensor\": \"w\"" "$tmp/q/quant_stats.jsonl")" = 2 ] &&
  [ "$(grep -c '"layer": "model.layers.0.mlp.down_proj", "tensor": "w"' "$tmp/q/quant_stats.jsonl")" = 3 ] &&
  ok "quant_stats.jsonl: the layer until its fallback, the others every step" ||
  bad "quant_stats.jsonl: $(head -c 2000 "$tmp/q/quant_stats.jsonl")"
has "state.json records the new recipe" "$tmp/q/ckpt-3/state.json" "\"$layer\": \"bf16\""
has "metrics.jsonl records it at step 2" "$tmp/q/metrics.jsonl" "\"precision_change\": \"$layer w "
"$bin" train --resume "$tmp/q" --steps 5 --quant-check-every 0 >"$tmp/q2.out" 2>&1
check "the nvfp4 run resumed (checks off)" 0 $?
has "the resumed run keeps the fallback" "$tmp/q2.out" "precision: $layer stays in bf16 (fell back at step 2"
[ "$(grep -c . "$tmp/q/precision_decisions.jsonl")" = 1 ] && ok "still one decision" ||
  bad "decisions after the resume: $(cat "$tmp/q/precision_decisions.jsonl")"
has "the resumed checkpoint's state.json" "$tmp/q/ckpt-5/state.json" "\"$layer\": \"bf16\""

# a policy's threshold above the layer's error: statistics, no fallback
echo '{"default": "nvfp4", "fallback": "none", "max_rel_error": {"nvfp4": 0.95}}' >"$tmp/loose.json"
"$bin" train "${common[@]}" --policy "$tmp/loose.json" --quant-check-every 1 --quant-fallback-after 2 --out "$tmp/loose" \
  --steps 3 --init-from "$tmp/outlier.safetensors" >"$tmp/loose.out" 2>&1
check "an nvfp4 run under a loose policy threshold" 0 $?
[ ! -s "$tmp/loose/precision_decisions.jsonl" ] && ! grep -q "falls back" "$tmp/loose.out" &&
  ok "no fallback under max_rel_error 0.95" || bad "a fallback under 0.95: $(cat "$tmp/loose.out")"
[ "$(grep -c "\"layer\": \"$layer\", \"tensor\": \"w\", \"recipe\": \"nvfp4\", .*\"threshold\": 0.95" \
  "$tmp/loose/quant_stats.jsonl")" = 3 ] && ok "the policy's threshold in quant_stats.jsonl" ||
  bad "quant_stats.jsonl: $(head -c 1500 "$tmp/loose/quant_stats.jsonl")"

# --- two ranks ----------------------------------------------------------------------------------
"$bin" launch -n 2 -- train "${common[@]}" "${q[@]}" --out "$tmp/dp" --steps 3 --ckpt-every 1 \
  --init-from "$tmp/outlier.safetensors" >"$tmp/dp.out" 2>&1
check "2 ranks, nvfp4 with the outlier layer" 0 $?
has "both ranks fall back at step 2" "$tmp/dp.out" "[deepwell warn rank 0/2] precision: step 2: $layer falls back" \
  "[deepwell warn rank 1/2] precision: step 2: $layer falls back"
[ "$(grep -c . "$tmp/dp/precision_decisions.jsonl")" = 1 ] && ok "  ... written once" ||
  bad "2-rank decisions: $(cat "$tmp/dp/precision_decisions.jsonl")"
"$bin" launch -n 2 -- train "${common[@]}" --out "$tmp/dpnan" --steps 10 --init-from "$tmp/inf.safetensors" \
  --max-skips 2 >"$tmp/dpnan.out" 2>&1
check "2 ranks, 2 non-finite steps stop the job" 1 $?
has "  ... each rank names the stop" "$tmp/dpnan.out" "train (rank 0/2): step 2: 2 steps in a row skipped" \
  "train (rank 1/2): step 2: 2 steps in a row skipped"

# --- refusals ------------------------------------------------------------------------------------
for flag in --max-skips --quant-check-every --quant-fallback-after; do
  "$bin" train "${common[@]}" --out "$tmp/r" --steps 1 $flag -1 >"$tmp/r.out" 2>&1
  check "$flag -1 refused" 2 $?
  has "$flag named" "$tmp/r.out" "$flag"
done

[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all guardrail CLI checks passed"
