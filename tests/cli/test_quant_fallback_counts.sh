#!/usr/bin/env bash
# test_quant_fallback_counts.sh DEEPWELL — the counters' fallback rule from the command line
# (docs/precision.md, "Overflow and underflow counters"): --quant-overflow-max, --quant-underflow-max
# and --quant-counts-after reach the trainer. On a tiny mxfp4 Llama on the CPU, E2M1 flushes some
# elements of every quantised operand, so --quant-underflow-max 0 --quant-counts-after 1 sends
# every quantised layer to BF16 at step 1 by the underflow rule (stderr, metrics.jsonl's
# precision_change, precision_decisions.jsonl with "rule": "underflow", the checkpoint's
# recipes), while the defaults (overflow over 0.1%, no overflow in clean training) and
# --quant-counts-after 0 change nothing. Bad values are refused naming the flag (exit 2).
# (test_quant_counts_fallback.c checks the rule's semantics on a planted model.)
set -u
bin=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1 DW_LOG=info
model=$tmp/llama
mkdir -p "$model"
echo '{"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 128, "max_position_embeddings": 64}' >"$model/config.json"
common=(--model "$model" --data builtin --batch 2 --seq 16 --eval-every 0 --ckpt-minutes 0 --device cpu
  --precision mxfp4 --fallback none --quant-check-every 0 --steps 2 --seed 5)

"$bin" train "${common[@]}" --out "$tmp/all" --quant-underflow-max 0 --quant-counts-after 1 >"$tmp/all.out" 2>&1
check "--quant-underflow-max 0 --quant-counts-after 1" 0 $?
n=$(grep -c '"rule": "underflow"' "$tmp/all/precision_decisions.jsonl" 2>/dev/null)
[ "${n:-0}" -ge 4 ] && ok "$n layers fell back by the underflow rule" ||
  bad "decisions: $(cat "$tmp/all/precision_decisions.jsonl" 2>/dev/null)"
[ "$(grep -c '"step": 1,' "$tmp/all/precision_decisions.jsonl")" = "$n" ] && ok "  ... all at step 1" ||
  bad "steps: $(cat "$tmp/all/precision_decisions.jsonl")"
[ "$(grep -c 'falls back to bf16: underflow' "$tmp/all.out")" = "$n" ] && ok "  ... each on stderr" ||
  bad "stderr: $(grep 'falls back' "$tmp/all.out")"
grep '"step": 1,' "$tmp/all/metrics.jsonl" | grep -q '"precision_change": ".*underflow' &&
  ok "  ... metrics.jsonl's step 1 names them" || bad "metrics: $(head -2 "$tmp/all/metrics.jsonl")"
grep -q '"precision_change"' <(grep '"step": 2,' "$tmp/all/metrics.jsonl") &&
  bad "step 2 changed precision too" || ok "  ... and step 2 nothing more"
has "  ... the checkpoint lists them in bf16" "$tmp/all/ckpt-2/state.json" '"bf16"'

for quiet in "" "--quant-underflow-max 0 --quant-counts-after 0" "--quant-overflow-max 0 --quant-counts-after 1"; do
  # shellcheck disable=SC2086
  "$bin" train "${common[@]}" --out "$tmp/q" $quiet >"$tmp/q.out" 2>&1
  check "${quiet:-the defaults}: trains" 0 $?
  if [ -s "$tmp/q/precision_decisions.jsonl" ]; then bad "  ... fell back: $(cat "$tmp/q/precision_decisions.jsonl")"
  else ok "  ... no fallback"; fi
  rm -rf "$tmp/q"
done

# --- refusals ------------------------------------------------------------------------------------
base=(--model "$model" --data builtin --batch 2 --seq 16 --device cpu --out "$tmp/r" --steps 1)
for bad_flag in "--quant-overflow-max -0.5" "--quant-overflow-max 2" "--quant-overflow-max x" \
  "--quant-underflow-max 1.5" "--quant-underflow-max nan" "--quant-counts-after -1" "--quant-counts-after y"; do
  # shellcheck disable=SC2086
  "$bin" train "${base[@]}" $bad_flag >"$tmp/r.out" 2>&1
  check "$bad_flag refused" 2 $?
  flag=$(echo "$bad_flag" | awk '{print $(NF-1)}')
  has "  ... naming $flag" "$tmp/r.out" "$flag"
done
"$bin" train --help >"$tmp/help.out" 2>&1
has "--help lists the flags" "$tmp/help.out" "--quant-overflow-max F" "--quant-underflow-max F" "--quant-counts-after N"

[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all counters' fallback CLI checks passed"
