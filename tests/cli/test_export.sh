#!/usr/bin/env bash
# test_export.sh DEEPWELL — `deepwell export` (issue 26): tiny llama, qwen2, gpt2 and mixtral
# configs (random sizes) trained two steps on the CPU, exported, and
#   - `deepwell eval` of an F32 export gives exactly the checkpoint's loss; of a BF16 export, the
#     checkpoint's loss with its weights rounded to BF16 by torch; mixtral in both expert layouts,
#     and olmoe, qwen2-moe and qwen3-moe (presets) in both layouts by eval equality;
#   - tests/python/test_export_hf.py checks names, shapes, dtypes and values independently, and
#     the hf-fp8 codes, 128x128 scales and quantization_config; parity.py's float64 reference
#     models, reading only the exported directory, give the checkpoint's eval loss on a token shard
#     (F32 and BF16 within 1e-5), and for hf-fp8 `deepwell eval` of the export's dequantised
#     weights within 1e-5 (that loss within 1% of the checkpoint's);
#   - sharding, --hf-dir (config keys kept, tokenizer files copied), a model directory as source;
#   - refusals: a non-empty or uncreatable --out, a write failure mid-way (file size limit), an
#     unknown format, a run without checkpoints, GPT-2 in hf-fp8, another model's --hf-dir; never a
#     half-written directory left behind.
set -u
dw=$1
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$src/tests/cli/checks.sh"
export OMP_NUM_THREADS=1
py=/usr/bin/python3
chk="$src/tests/python/test_export_hf.py"
ev() { "$dw" eval "$@" --data builtin --batch 1 --seq 16 2>/dev/null | awk '{print $2}'; }
evt() { "$dw" eval "$@" --data "$tmp/tok.bin" --batch 1 --seq 16 2>/dev/null | awk '{print $2}'; } # the shard's loss
pick() { local a=("$@"); echo "${a[RANDOM % ${#a[@]}]}"; }
leftovers() { find "$tmp" -maxdepth 2 -name '.*.export-*' | wc -l; }

# ---- models: random sizes each run ----------------------------------------------------------
H=$(pick 32 48 64)
mkdir -p "$tmp/llama" "$tmp/qwen2" "$tmp/gpt2" "$tmp/mixtral"
echo "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 128, \"num_hidden_layers\": $(pick 1 2),
 \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": $(pick 200 320 384),
 \"max_position_embeddings\": 64, \"tie_word_embeddings\": false}" >"$tmp/llama/config.json"
echo "{\"model_type\": \"qwen2\", \"vocab_size\": 256, \"hidden_size\": $H, \"num_hidden_layers\": 2,
 \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": $(pick 40 72 96),
 \"max_position_embeddings\": 64, \"tie_word_embeddings\": $(pick true false)}" >"$tmp/qwen2/config.json"
echo "{\"model_type\": \"gpt2\", \"vocab_size\": 256, \"n_embd\": $H, \"n_layer\": 2, \"n_head\": 2,
 \"n_positions\": 64}" >"$tmp/gpt2/config.json"
echo "{\"model_type\": \"mixtral\", \"vocab_size\": 256, \"hidden_size\": $H, \"num_hidden_layers\": 2,
 \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": $(pick 24 48),
 \"num_local_experts\": $(pick 3 4), \"num_experts_per_tok\": 2, \"max_position_embeddings\": 64}" \
  >"$tmp/mixtral/config.json"

$py -c "import sys, random; sys.path.insert(0, '$src/tests/python'); import parity
parity.write_shard('$tmp/tok.bin', [random.randrange(256) for _ in range(17)])"
for f in llama qwen2 gpt2 mixtral; do
  "$dw" train --model "$tmp/$f" --data builtin --out "$tmp/run-$f" --steps 2 --batch 1 --seq 16 --device cpu \
    --eval-every 0 --seed $RANDOM >"$tmp/train-$f.log" 2>&1
  check "$f: trains two steps" 0 $?
done

# ---- round trips: F32 exact, BF16 equal to torch's rounding -------------------------------------
for f in llama qwen2 gpt2 mixtral; do
  ck="$tmp/run-$f/ckpt-2"
  want=$(ev "$ck")
  "$dw" export "$tmp/run-$f" --out "$tmp/$f-f32" --dtype f32 >"$tmp/out" 2>&1
  check "$f: export --dtype f32" 0 $?
  got=$(ev "$tmp/$f-f32")
  [ -n "$want" ] && [ "$want" = "$got" ] && ok "$f: eval of the F32 export = the checkpoint's ($got)" ||
    bad "$f: eval of the F32 export $got, the checkpoint's $want"
  $py "$chk" "$ck" "$tmp/$f-f32" --dtype f32 --forward "$tmp/tok.bin" "$(evt "$ck")" 1e-5 >"$tmp/py" 2>&1 &&
    ok "$f: F32 export checked by torch, its reference forward = eval of the checkpoint" ||
    bad "$f: F32 export: $(grep FAIL "$tmp/py" | head -3)"

  "$dw" export "$tmp/run-$f" --out "$tmp/$f-bf16" >"$tmp/out" 2>&1
  check "$f: export (bf16 default)" 0 $?
  $py "$chk" "$ck" "$tmp/$f-bf16" --rounded-out "$tmp/$f-rounded.safetensors" >"$tmp/py" 2>&1 &&
    ok "$f: BF16 export = torch's rounding" || bad "$f: BF16 export: $(grep FAIL "$tmp/py" | head -3)"
  want=$(ev "$ck" --weights "$tmp/$f-rounded.safetensors")
  got=$(ev "$tmp/$f-bf16")
  [ -n "$want" ] && [ "$want" = "$got" ] && ok "$f: eval of the BF16 export = the rounded checkpoint's ($got)" ||
    bad "$f: eval of the BF16 export $got, the rounded checkpoint's $want"
  $py "$chk" "$ck" "$tmp/$f-bf16" --forward "$tmp/tok.bin" "$(evt "$ck" --weights "$tmp/$f-rounded.safetensors")" 1e-5 \
    >"$tmp/py" 2>&1 && ok "$f: reference forward of the BF16 export = eval of the rounded checkpoint" ||
    bad "$f: BF16 forward: $(grep FAIL "$tmp/py" | head -3)"
done

# ---- mixture of experts: both layouts; a model directory keeps its own ---------------------------
ck="$tmp/run-mixtral/ckpt-2"
want=$(ev "$ck")
for L in per-expert fused; do
  "$dw" export "$ck" --out "$tmp/mx-$L" --dtype f32 --expert-layout $L >"$tmp/out" 2>&1
  check "mixtral: export --expert-layout $L" 0 $?
  got=$(ev "$tmp/mx-$L")
  [ -n "$want" ] && [ "$want" = "$got" ] && ok "mixtral $L: eval = the checkpoint's" || bad "mixtral $L: $got vs $want"
  $py "$chk" "$ck" "$tmp/mx-$L" --dtype f32 --layout $L --forward "$tmp/tok.bin" "$(evt "$ck")" 1e-5 >"$tmp/py" 2>&1 &&
    ok "mixtral $L: names, values and the reference forward" ||
    bad "mixtral $L: $(grep FAIL "$tmp/py" | head -3)"
done
"$dw" export "$tmp/mx-fused" --out "$tmp/mx-again" --dtype f32 >"$tmp/out" 2>&1
check "export of an exported (fused) model directory" 0 $?
cmp -s "$tmp/mx-fused/model.safetensors" "$tmp/mx-again/model.safetensors" &&
  ok "a model directory round-trips byte for byte in its own (fused) layout" || bad "mx-again differs from mx-fused"

# ---- the other mixture-of-experts families (presets): eval equality in both layouts -----------------
for m in olmoe-tiny qwen2-moe-tiny qwen3-moe-tiny; do
  "$dw" train --model $m --data builtin --out "$tmp/run-$m" --steps 1 --batch 1 --seq 16 --device cpu \
    --eval-every 0 --seed $RANDOM >"$tmp/train-$m.log" 2>&1
  check "$m: trains a step" 0 $?
  want=$(ev "$tmp/run-$m/ckpt-1")
  for L in per-expert fused; do
    "$dw" export "$tmp/run-$m" --out "$tmp/$m-$L" --dtype f32 --expert-layout $L >"$tmp/out" 2>&1
    got=$(ev "$tmp/$m-$L")
    [ -n "$want" ] && [ "$want" = "$got" ] && ok "$m $L: eval of the F32 export = the checkpoint's" ||
      bad "$m $L: eval $got, the checkpoint's $want"
  done
done

# ---- hf-fp8 ---------------------------------------------------------------------------------
"$dw" export "$tmp/run-llama" --out "$tmp/llama-fp8" --format hf-fp8 >"$tmp/out" 2>&1
check "llama: export --format hf-fp8" 0 $?
$py "$chk" "$tmp/run-llama/ckpt-2" "$tmp/llama-fp8" --fp8 --forward "$tmp/tok.bin" "$(evt "$tmp/llama-fp8")" 1e-5 \
  >"$tmp/py" 2>&1 && ok "llama hf-fp8: codes, scales, config; dequantised forward = deepwell eval of the export" ||
  bad "llama hf-fp8: $(grep FAIL "$tmp/py" | head -3)"
# the FP8 weights' effect on the loss: small, but a draw of random sizes and weights reached 1.03e-3
# (session 22's CI), so it is bounded loosely here and the forward above compares like with like
a=$(evt "$tmp/llama-fp8") b=$(evt "$tmp/run-llama/ckpt-2")
awk -v a="$a" -v b="$b" 'BEGIN { exit !(a != "" && b != "" && (a - b) ^ 2 <= (1e-2 * b) ^ 2) }' &&
  ok "llama hf-fp8: loss $a within 1% of the checkpoint's $b" || bad "llama hf-fp8: loss $a, the checkpoint's $b"
"$dw" export "$ck" --out "$tmp/mx-fp8" --format hf-fp8 --dtype f32 --expert-layout fused >"$tmp/out" 2>&1
check "mixtral: export --format hf-fp8 --expert-layout fused" 0 $?
$py "$chk" "$ck" "$tmp/mx-fp8" --fp8 --dtype f32 --layout fused --forward "$tmp/tok.bin" "$(evt "$tmp/mx-fp8")" 1e-5 >"$tmp/py" 2>&1 &&
  ok "mixtral hf-fp8 fused: 3-D expert codes and scales" || bad "mixtral hf-fp8: $(grep FAIL "$tmp/py" | head -3)"

# ---- shards -----------------------------------------------------------------------------------
"$dw" export "$tmp/run-llama" --out "$tmp/llama-shards" --dtype f32 --max-shard-size 100KB >"$tmp/out" 2>&1
check "llama: export --max-shard-size 100KB" 0 $?
n=$(ls "$tmp/llama-shards" | grep -c '^model-.*-of-.*\.safetensors$')
[ "$n" -gt 1 ] && [ -f "$tmp/llama-shards/model.safetensors.index.json" ] && ok "$n shards and an index" ||
  bad "shards: $(ls "$tmp/llama-shards")"
got=$(ev "$tmp/llama-shards")
[ "$got" = "$(ev "$tmp/run-llama/ckpt-2")" ] && ok "eval of the sharded export = the checkpoint's" || bad "sharded: $got"
$py "$chk" "$tmp/run-llama/ckpt-2" "$tmp/llama-shards" --dtype f32 >"$tmp/py" 2>&1 && ok "shards checked by torch" ||
  bad "shards: $(grep FAIL "$tmp/py" | head -3)"
"$dw" export "$tmp/run-llama" --out "$tmp/x" --max-shard-size 5XB >"$tmp/out" 2>&1
check "--max-shard-size 5XB refused" 2 $?

# ---- --hf-dir: the original's other keys kept, its tokenizer files copied -------------------------
hf="$tmp/qwen2-hf"
mkdir -p "$hf"
$py - "$tmp/qwen2/config.json" "$hf" <<'EOF'
import json, random, sys
c = json.load(open(sys.argv[1]))
c.update({"bos_token_id": random.randint(0, 9), "eos_token_id": 255, "use_cache": True, "hand_written": [1, 2]})
json.dump(c, open(sys.argv[2] + "/config.json", "w"))
json.dump({"version": "1.0", "model": {"n": random.random()}}, open(sys.argv[2] + "/tokenizer.json", "w"))
json.dump({"eos_token": "</s>"}, open(sys.argv[2] + "/tokenizer_config.json", "w"))
json.dump({"bos_token_id": c["bos_token_id"], "max_new_tokens": 7}, open(sys.argv[2] + "/generation_config.json", "w"))
EOF
"$dw" export "$tmp/run-qwen2" --out "$tmp/qwen2-full" --hf-dir "$hf" >"$tmp/out" 2>&1
check "qwen2: export --hf-dir" 0 $?
for f in tokenizer.json tokenizer_config.json generation_config.json; do
  cmp -s "$hf/$f" "$tmp/qwen2-full/$f" && ok "$f copied" || bad "$f not copied"
done
$py - "$hf/config.json" "$tmp/qwen2-full/config.json" "$tmp/run-qwen2/ckpt-2/config.json" <<'EOF' && ok "config.json: the original's keys kept, the checkpoint's over them" || bad "config.json merge"
import json, sys
hf, out, own = (json.load(open(p)) for p in sys.argv[1:])
assert all(out[k] == hf[k] for k in ("bos_token_id", "eos_token_id", "use_cache", "hand_written")), out
assert all(out[k] == v for k, v in own.items() if k != "torch_dtype"), out
assert out["torch_dtype"] == "bfloat16"
EOF

# ---- refusals, and nothing half-written ----------------------------------------------------------
mkdir -p "$tmp/full"
touch "$tmp/full/keep"
"$dw" export "$tmp/run-llama" --out "$tmp/full" >"$tmp/out" 2>&1
check "an existing non-empty --out refused" 3 $?
has "the refusal says why" "$tmp/out" "exists and is not empty"
[ "$(ls -A "$tmp/full")" = keep ] && ok "the non-empty --out untouched" || bad "--out changed: $(ls -A "$tmp/full")"
mkdir -p "$tmp/empty"
"$dw" export "$tmp/run-gpt2" --out "$tmp/empty" >"$tmp/out" 2>&1
check "an existing empty --out is filled" 0 $?
touch "$tmp/afile"
"$dw" export "$tmp/run-llama" --out "$tmp/afile/sub" >"$tmp/out" 2>&1
check "an uncreatable --out (its parent a file)" 3 $?
has "the refusal names the directory" "$tmp/out" "$tmp/afile/sub" "cannot create" "Not a directory"
(trap '' XFSZ; ulimit -f 64; "$dw" export "$tmp/run-llama" --out "$tmp/cut" --dtype f32) >"$tmp/out" 2>&1
check "a write failure mid-way (64 KiB file size limit)" 3 $?
has "the write failure is reported" "$tmp/out" "deepwell export:"
[ ! -e "$tmp/cut" ] && ok "nothing at --out after the failure" || bad "$tmp/cut exists"
"$dw" export "$tmp/run-llama" --out "$tmp/x" --format onnx >"$tmp/out" 2>&1
check "an unknown --format refused" 2 $?
has "the refusal names the flag" "$tmp/out" "--format 'onnx'"
"$dw" export "$tmp/run-llama" --out "$tmp/x" --dtype fp16 >"$tmp/out" 2>&1
check "an unknown --dtype refused" 2 $?
mkdir -p "$tmp/norun"
echo '{"step": 1}' >"$tmp/norun/metrics.jsonl"
"$dw" export "$tmp/norun" --out "$tmp/x" >"$tmp/out" 2>&1
check "a run without checkpoints refused" 2 $?
has "the refusal says so" "$tmp/out" "without checkpoints"
"$dw" export "$tmp/run-gpt2" --out "$tmp/x" --format hf-fp8 >"$tmp/out" 2>&1
check "GPT-2 in hf-fp8 refused" 1 $?
has "the refusal says why" "$tmp/out" "Conv1D"
"$dw" export "$tmp/run-llama" --out "$tmp/x" --hf-dir "$tmp/gpt2" >"$tmp/out" 2>&1
check "another model's --hf-dir refused" 2 $?
has "the refusal names both types" "$tmp/out" "'gpt2'" "'llama'"
"$dw" export "$tmp/run-llama" >"$tmp/out" 2>&1
check "missing --out" 2 $?
"$dw" export --out "$tmp/x" >"$tmp/out" 2>&1
check "missing SRC" 2 $?
cp -r "$tmp/run-llama/ckpt-2" "$tmp/broken"
printf 'X' | dd of="$tmp/broken/model.safetensors" bs=1 seek=100 conv=notrunc 2>/dev/null
"$dw" export "$tmp/broken" --out "$tmp/x" >"$tmp/out" 2>&1
check "a damaged checkpoint refused" 2 $?
has "the refusal names the file and the CRC" "$tmp/out" "model.safetensors" "CRC-32"
"$dw" export "$tmp/no-such-run" --out "$tmp/x" >"$tmp/out" 2>&1
check "a missing SRC" 3 $?
[ ! -e "$tmp/x" ] && ok "no --out after any refusal" || bad "$tmp/x exists"
[ "$(leftovers)" = 0 ] && ok "no temporary directory left behind" || bad "left behind: $(find "$tmp" -name '.*.export-*')"
"$dw" export --help | grep -q -- "--expert-layout" && ok "export --help" || bad "export --help"

[ $fails -eq 0 ] && echo "PASS" || echo "FAILED: $fails"
exit $((fails > 0))
