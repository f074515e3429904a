#!/usr/bin/env bash
# test_capture.sh DEEPWELL — `deepwell capture` end to end: listing, JSON schema and totals,
# config.json directories, refusals and exit codes.
set -u
dw=$1
py=/usr/bin/python3
fails=0
check() { # check DESCRIPTION EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL: $1 (exit $3, expected $2)"; fails=$((fails + 1)); else echo "ok: $1"; fi
}
has() { # has DESCRIPTION FILE TEXT
  if grep -qF -- "$3" "$2"; then echo "ok: $1"; else echo "FAIL: $1: '$3' not in:"; cat "$2"; fails=$((fails + 1)); fi
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$dw" capture gpt2-tiny >"$tmp/t" 2>&1; check "capture gpt2-tiny" 0 $?
has "table names HF modules" "$tmp/t" "transformer.h.3.mlp.c_proj"
has "table has params" "$tmp/t" "params: 858880"
has "table has FLOPs" "$tmp/t" "training FLOPs per token"

# A random GQA llama config.json: the JSON totals must match the closed forms computed here.
seq=$((RANDOM % 60 + 4))
$py - "$tmp/llama" <<'PY'
import json, os, random, sys
os.makedirs(sys.argv[1])
kv = random.randint(1, 3); h = kv * random.randint(1, 3); hd = 2 * random.randint(2, 8)
cfg = dict(model_type="llama", vocab_size=random.randint(50, 400), hidden_size=random.randint(8, 64),
           num_hidden_layers=random.randint(1, 3), num_attention_heads=h, num_key_value_heads=kv,
           head_dim=hd, intermediate_size=random.randint(8, 100), max_position_embeddings=64,
           rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=random.random() < 0.5,
           hidden_act="silu")
json.dump(cfg, open(os.path.join(sys.argv[1], "config.json"), "w"))
PY
"$dw" capture "$tmp/llama" --json --seq $seq --batch 3 >"$tmp/l.json" 2>"$tmp/err"; check "capture llama dir --json" 0 $?
$py - "$tmp/llama/config.json" "$tmp/l.json" $seq <<'PY' || fails=$((fails + 1))
import json, sys
c = json.load(open(sys.argv[1])); g = json.load(open(sys.argv[2])); T = int(sys.argv[3])
d, L, V, F = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
q = c["num_attention_heads"] * c["head_dim"]; kv = c["num_key_value_heads"] * c["head_dim"]
mm = L * (2 * d * q + 2 * d * kv + 3 * d * F)
params = mm + V * d * (1 if c["tie_word_embeddings"] else 2) + L * 2 * d + d
assert g["params"] == params, (g["params"], params)
assert g["seq"] == T and g["batch"] == 3
attn = L * c["num_attention_heads"] * (T + 1) / 2 * (12 * c["head_dim"] + 10)
lower = 6 * (mm + V * d) + attn
assert lower < g["flops_per_token"] < 1.3 * lower, (g["flops_per_token"], lower)
names = [n["name"] for n in g["nodes"]]
assert "model.layers.0.self_attn.k_proj" in names and names[-1] == "loss", names
k = next(n for n in g["nodes"] if n["name"] == "model.layers.0.self_attn.k_proj")
assert k["op"] == "linear" and k["shape"] == [3, T, kv], k
assert sum(n["flops_fwd"] + n["flops_bwd"] for n in g["nodes"]) / (3 * T) - g["flops_per_token"] < 1e-6 * g["flops_per_token"]
print("ok: JSON totals match closed forms")
PY

mkdir "$tmp/mix"; echo '{"model_type":"gemma","hidden_size":64}' >"$tmp/mix/config.json"
"$dw" capture "$tmp/mix" >"$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ] && check "gemma config refused" 1 1 || check "gemma config refused" 1 0
has "gemma message" "$tmp/out" "model_type 'gemma' is not supported yet (supported: gpt2, llama, mistral, qwen2, mixtral, deepseek_v3, olmoe, qwen2_moe, qwen3_moe, qwen3, gemma2, phi3)"
has "message names the file" "$tmp/out" "mix/config.json"
"$dw" capture llama-70b >"$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ] && check "planning-only refused" 1 1 || check "planning-only refused" 1 0
has "planning-only message" "$tmp/out" "planning-only"
"$dw" capture gpt2-tiny --seq 257 >"$tmp/out" 2>&1; check "seq beyond positions" 2 $?
"$dw" capture no-such-model >"$tmp/out" 2>&1; check "unknown model" 2 $?
has "unknown model lists presets" "$tmp/out" "llama-tiny"
"$dw" capture >"$tmp/out" 2>&1; check "missing MODEL" 2 $?
"$dw" capture gpt2-tiny --bogus >"$tmp/out" 2>&1; check "unknown flag" 2 $?
"$dw" capture gpt2-tiny --seq x >"$tmp/out" 2>&1; check "bad --seq" 2 $?
"$dw" capture --help >"$tmp/out" 2>&1; check "--help" 0 $?
"$dw" capture --list-presets >"$tmp/out" 2>&1; check "--list-presets" 0 $?
[ "$(wc -l <"$tmp/out")" -ge 10 ] && has "presets listed" "$tmp/out" "deepseek-v3" || { echo "FAIL: preset list"; fails=$((fails + 1)); }

echo "$fails failed"
[ $fails -eq 0 ]
