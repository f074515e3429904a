#!/usr/bin/env bash
# test_compile.sh DEEPWELL — `deepwell compile` end to end: the per-node report (recipe and why,
# kernel and why), pools adding up to the total, the safe fallback and rules, FP32 mode, the
# activation pool growing with the batch, the SwiGLU quantising for the down projection, refusals
# and exit codes. Needs no GPU.
set -u
dw=$1
fails=0
check() { # check DESCRIPTION EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL: $1 (exit $3, expected $2)"; fails=$((fails + 1)); else echo "ok: $1"; fi
}
has() { # has DESCRIPTION FILE TEXT
  if grep -qF -- "$3" "$2"; then echo "ok: $1"; else echo "FAIL: $1: '$3' not in:"; cat "$2"; fails=$((fails + 1)); fi
}
hasnt() {
  if grep -qF -- "$3" "$2"; then echo "FAIL: $1: '$3' unexpectedly in $2"; fails=$((fails + 1)); else echo "ok: $1"; fi
}
pool() { # pool FILE NAME -> bytes
  awk -v n="$2" '$1 == n && $3 == "B" {print $2}' "$1"
}
sums() { # sums DESCRIPTION FILE: the five pools add up to the total line
  local s=0 p
  for p in weights grads optimizer activations workspace; do s=$((s + $(pool "$2" $p))); done
  if [ "$s" = "$(pool "$2" total)" ] && [ "$s" -gt 0 ]; then echo "ok: $1"; else
    echo "FAIL: $1: pools sum to $s, total says $(pool "$2" total)"; fails=$((fails + 1)); fi
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
B=$((RANDOM % 4 + 1)); T=$((RANDOM % 200 + 8))

"$dw" compile --help >"$tmp/h" 2>&1; check "--help" 0 $?
has "help names --report" "$tmp/h" "--report"

"$dw" compile gpt2-tiny --batch $B --seq $T --report >"$tmp/r" 2>&1; check "compile gpt2-tiny --report" 0 $?
has "report lists HF modules" "$tmp/r" "transformer.h.0.attn.c_attn"
has "report names the GEMM kernel" "$tmp/r" "cublaslt_bf16"
has "report gives the policy reason" "$tmp/r" "(default)"
has "report names attention's backend entry" "$tmp/r" "dw_cuda_op_attention_fwd/bwd"
has "report has the shape" "$tmp/r" "batch $B x seq $T"
sums "gpt2 bf16 pools add up" "$tmp/r"
hasnt "bf16 runs on the engine" "$tmp/r" "NOT SUPPORTED"

"$dw" compile gpt2-tiny --batch $B --seq $T >"$tmp/s" 2>&1; check "compile without --report" 0 $?
hasnt "no per-node lines without --report" "$tmp/s" "transformer.h.0.attn.c_attn"
sums "summary pools add up" "$tmp/s"

"$dw" compile llama-tiny --precision fp8_block --fallback safe --seq $T --report >"$tmp/f" 2>&1
check "compile fp8_block --fallback safe" 0 $?
has "LM head kept in bf16 by the fallback" "$tmp/f" "lm_head"
grep -E "^ +[0-9]+ lm_head .*recipe bf16 +\(fallback safe" "$tmp/f" >/dev/null && echo "ok: lm_head reason" ||
  { echo "FAIL: lm_head not bf16 by fallback"; fails=$((fails + 1)); }
grep -E "model.layers.1.mlp.up_proj .*recipe fp8_block +\(default\)" "$tmp/f" >/dev/null && echo "ok: middle block fp8" ||
  { echo "FAIL: layers.1 up_proj not fp8_block by default"; fails=$((fails + 1)); }
hasnt "fp8_block runs on the engine" "$tmp/f" "NOT SUPPORTED"
# the default fallback keeps the LM head alone in BF16 (issue 26); --fallback none quantises it
"$dw" compile llama-tiny --precision fp8_block --seq $T --report >"$tmp/h" 2>&1; check "compile fp8_block" 0 $?
grep -E "^ +[0-9]+ lm_head .*recipe bf16 +\(fallback head \(the default\)" "$tmp/h" >/dev/null &&
  echo "ok: lm_head bf16 by default" || { echo "FAIL: lm_head not bf16 by default"; fails=$((fails + 1)); }
grep -E "model.layers.0.mlp.up_proj .*recipe fp8_block +\(default\)" "$tmp/h" >/dev/null &&
  echo "ok: first block fp8 by default" || { echo "FAIL: layers.0 up_proj not fp8_block"; fails=$((fails + 1)); }
"$dw" compile llama-tiny --precision fp8_block --fallback none --seq $T --report >"$tmp/n" 2>&1
check "compile fp8_block --fallback none" 0 $?
grep -E "^ +[0-9]+ lm_head .*recipe fp8_block +\(default\)" "$tmp/n" >/dev/null &&
  echo "ok: lm_head fp8 with --fallback none" || { echo "FAIL: lm_head not fp8_block under none"; fails=$((fails + 1)); }
has "per-GEMM quantisation or fallback at this shape" "$tmp/f" "at this shape: fprop"
has "the target is sm_90" "$tmp/f" "kernels chosen for sm_90"
"$dw" compile gpt2-tiny --precision bf16 --report >"$tmp/g" 2>&1
check "compile gpt2-tiny bf16" 0 $?
has "GELU forward fused into c_fc" "$tmp/g" "fused: forward in transformer.h.0.mlp.c_fc's GEMM epilogue (GELU_AUX)"
has "GELU backward fused into c_proj's dgrad" "$tmp/g" "fused: backward in transformer.h.0.mlp.c_proj's dgrad epilogue (DGELU)"
DW_FUSE=0 "$dw" compile gpt2-tiny --precision bf16 --report >"$tmp/g0" 2>&1
hasnt "DW_FUSE=0 fuses nothing" "$tmp/g0" "fused:"
"$dw" compile llama-tiny --precision fp8_block2d --seq $T --report >"$tmp/f2" 2>&1
check "compile fp8_block2d" 0 $?
hasnt "fp8_block2d runs on the engine" "$tmp/f2" "NOT SUPPORTED"
has "fp8_block2d: 128x128 weights, 1x128 activations" "$tmp/f2" "W and W^T in 128x128 blocks"
# the SwiGLU writes the down projection's fp8_block rows (CUDA; width 384 = 3 x 128) where that
# GEMM runs quantised: at 128 tokens (batch 2 x 64), not for the CPU target nor under mxfp8
"$dw" compile llama-tiny --precision fp8_block --batch 2 --seq 64 --report >"$tmp/sq" 2>&1
check "compile llama-tiny fp8_block at 2 x 64" 0 $?
has "the SwiGLU quantises for down_proj" "$tmp/sq" "fused: writes model.layers.3.mlp.down_proj's fp8_block rows"
# each RMSNorm writes its output's rows for the layers reading it (q, k, v; gate, up): width 256
for nl in "input_layernorm self_attn.q_proj" "post_attention_layernorm mlp.gate_proj"; do
  norm=${nl% *} layer=${nl#* }
  grep -A3 "model.layers.3.$norm " "$tmp/sq" | grep -q "fused: writes the fp8_block rows of its output for model.layers.3.$layer " &&
    echo "ok: $norm quantises for $layer and the layers beside it" ||
    { echo "FAIL: $norm's fusion for $layer not reported"; fails=$((fails + 1)); }
done
# GPT-2's layernorms write c_attn's and c_fc's rows, and the GELU after c_fc (a pass: no FP8 GELU
# epilogue on sm_90) writes c_proj's; not for the CPU target
"$dw" compile gpt2-124m --precision fp8_block --batch 2 --seq 64 --report >"$tmp/g8" 2>&1
check "compile gpt2-124m fp8_block" 0 $?
has "the GELU quantises for c_proj" "$tmp/g8" "fused: writes transformer.h.11.mlp.c_proj's fp8_block rows"
has "... in a pass after c_fc's FP8 GEMM (no GELU epilogue there)" "$tmp/g8" \
  "fused: forward run by transformer.h.11.mlp.c_fc, a pass right after its GEMM"
hasnt "... not said to be in the FP8 GEMM's epilogue" "$tmp/g8" "GEMM epilogue (GELU_AUX)"
has "ln_1 quantises for c_attn" "$tmp/g8" "fp8_block rows of its output for transformer.h.11.attn.c_attn"
"$dw" compile gpt2-124m --precision fp8_block --batch 2 --seq 64 --target cpu --report >"$tmp/g8c" 2>&1
hasnt "... not for the CPU target (GPT-2)" "$tmp/g8c" "fp8_block rows"
# and its backward writes the gate and up layers' dy and dy^T (128 tokens, width 384)
has "the SwiGLU's backward quantises for gate_proj and up_proj" "$tmp/sq" \
  "fused: backward writes model.layers.3.mlp.gate_proj's and model.layers.3.mlp.up_proj's fp8_block dy and dy^T"
"$dw" compile llama-tiny --precision fp8_block --batch 2 --seq 64 --target cpu --report >"$tmp/sq0" 2>&1
hasnt "... not for the CPU target" "$tmp/sq0" "fp8_block rows"
hasnt "... not for the CPU target (backward)" "$tmp/sq0" "fp8_block dy"
"$dw" compile llama-tiny --precision mxfp8 --batch 2 --seq 64 --report >"$tmp/sq1" 2>&1
hasnt "... nor under mxfp8" "$tmp/sq1" "fp8_block rows"
hasnt "... nor under mxfp8 (backward)" "$tmp/sq1" "fp8_block dy"
"$dw" compile llama-tiny --precision fp8_block --batch 1 --seq 64 --report >"$tmp/sq2" 2>&1
hasnt "... nor at 64 tokens (dy^T's blocks of 128 tokens)" "$tmp/sq2" "fp8_block dy"

cat >"$tmp/p.json" <<'J'
{"default": "bf16", "rules": [{"match": "*.self_attn.*", "op": "linear", "recipe": "mxfp8"}]}
J
"$dw" compile llama-tiny --policy "$tmp/p.json" --report >"$tmp/p" 2>&1; check "compile --policy" 0 $?
grep -E "self_attn.q_proj .*recipe mxfp8 +\(rule 0\)" "$tmp/p" >/dev/null && echo "ok: rule 0 applied" ||
  { echo "FAIL: rule not shown"; cat "$tmp/p"; fails=$((fails + 1)); }

"$dw" compile llama-tiny --precision fp32 --report >"$tmp/x" 2>&1; check "compile --precision fp32" 0 $?
has "fp32 mode uses the reference GEMM" "$tmp/x" "dw_cuda_op_linear_fwd/bwd (the FP32 reference GEMM)"
hasnt "fp32 mode has no BF16 copy" "$tmp/x" "BF16 working copy"
sums "fp32 pools add up" "$tmp/x"

"$dw" compile llama-tiny --seq 64 --batch 1 >"$tmp/b1" 2>&1; check "batch 1" 0 $?
"$dw" compile llama-tiny --seq 64 --batch 4 >"$tmp/b4" 2>&1; check "batch 4" 0 $?
if [ "$(pool "$tmp/b4" activations)" -gt "$(pool "$tmp/b1" activations)" ] &&
   [ "$(pool "$tmp/b4" weights)" = "$(pool "$tmp/b1" weights)" ]; then echo "ok: activations grow with the batch, weights do not"
else echo "FAIL: batch scaling"; fails=$((fails + 1)); fi

"$dw" compile gpt2-tiny --precision bogus >"$tmp/e" 2>&1; check "unknown recipe" 2 $?
has "names the bad recipe" "$tmp/e" "bogus"
"$dw" compile gpt2-tiny --precision bf16 --policy "$tmp/p.json" >"$tmp/e" 2>&1; check "--policy with --precision" 2 $?
"$dw" compile gpt2-tiny --fallback maybe >"$tmp/e" 2>&1; check "bad --fallback" 2 $?
"$dw" compile no-such-model >"$tmp/e" 2>&1; check "unknown model" 2 $?
"$dw" compile >"$tmp/e" 2>&1; check "no model" 2 $?
"$dw" compile gpt2-tiny --batch 0 >"$tmp/e" 2>&1; check "--batch 0" 2 $?
echo '{"default": "nope"}' >"$tmp/bad.json"
"$dw" compile gpt2-tiny --policy "$tmp/bad.json" >"$tmp/e" 2>&1; check "bad policy file" 2 $?

echo "$fails failed"
[ "$fails" = 0 ]
