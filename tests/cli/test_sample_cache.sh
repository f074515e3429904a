#!/usr/bin/env bash
# test_sample_cache.sh — deepwell sample with the K/V cache gives the same tokens as the full
# recompute (DW_KV_CACHE=0): greedy, temperature and top-k with a seed, for GPT-2 (learned
# positions), Llama (RoPE, GQA), Qwen2 (qkv biases) and Qwen3 (per-head norms) model directories
# of random weights whose sequence length (24) the text outgrows, so both the cached positions and
# the recompute past the window are held to it; the debug log says the cache was used, stderr
# carries the time taken with the prefill and the decode's tokens/s apart (and which way it
# decoded), and a MoE preset (dropless: cached) samples the same tokens either way.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=2

mkdir -p "$tmp/gpt2" "$tmp/llama" "$tmp/qwen2" "$tmp/qwen3"
echo '{"model_type": "gpt2", "vocab_size": 300, "n_embd": 48, "n_layer": 2, "n_head": 3, "n_positions": 24}' \
  >"$tmp/gpt2/config.json"
llama='"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 24, "rope_theta": 500.0'
echo "{\"model_type\": \"llama\", $llama}" >"$tmp/llama/config.json"
echo "{\"model_type\": \"qwen2\", $llama}" >"$tmp/qwen2/config.json"
echo "{\"model_type\": \"qwen3\", \"head_dim\": 16, $llama}" >"$tmp/qwen3/config.json"

prompt="17 4 250 9 33"
for m in gpt2 llama qwen2 qwen3; do
  for mode in "--temperature 0" "--temperature 1 --seed 7" "--temperature 0.7 --top-k 5 --seed 3"; do
    # shellcheck disable=SC2086
    DW_LOG=debug "$dw" sample "$tmp/$m" --prompt "$prompt" -n 40 $mode --device cpu >"$tmp/kv" 2>"$tmp/kv.err"
    r1=$?
    # shellcheck disable=SC2086
    DW_KV_CACHE=0 DW_LOG=debug "$dw" sample "$tmp/$m" --prompt "$prompt" -n 40 $mode --device cpu >"$tmp/full" \
      2>"$tmp/full.err"
    r2=$?
    check "$m $mode: cached sample runs" 0 $r1
    check "$m $mode: recomputed sample runs" 0 $r2
    [ "$(wc -w <"$tmp/kv")" = 45 ] && ok "$m $mode: 5 + 40 tokens" || bad "$m $mode: $(wc -w <"$tmp/kv") tokens"
    cmp -s "$tmp/kv" "$tmp/full" && ok "$m $mode: same tokens with and without the cache" ||
      bad "$m $mode: the cache changes the tokens: $(cat "$tmp/kv") vs $(cat "$tmp/full")"
    has "$m $mode: the cache was used" "$tmp/kv.err" "KV cache up to"
    has "$m $mode: DW_KV_CACHE=0 recomputes" "$tmp/full.err" "full recompute per token"
    has "$m $mode: the time is reported" "$tmp/kv.err" "40 tokens in" "prefill of 5 prompt tokens" \
      "decode 39 tokens" "tokens/s, KV cache)"
    has "$m $mode: ... and the recompute's" "$tmp/full.err" "40 tokens in" "decode 39 tokens" \
      "tokens/s, full recompute)"
    # the decode's rate is a positive number of tokens/s
    rate=$(sed -n 's/.*decode 39 tokens [0-9.]* s (\([0-9.]*\) tokens\/s.*/\1/p' "$tmp/kv.err")
    awk -v r="${rate:-0}" 'BEGIN { exit !(r > 0) }' && ok "$m $mode: decode rate $rate tokens/s" ||
      bad "$m $mode: no decode rate in: $(cat "$tmp/kv.err")"
  done
done
# two runs with different seeds differ (the comparison above is not of constant output)
"$dw" sample "$tmp/llama" --prompt "$prompt" -n 40 --temperature 1 --seed 8 --device cpu >"$tmp/s8" 2>/dev/null
"$dw" sample "$tmp/llama" --prompt "$prompt" -n 40 --temperature 1 --seed 7 --device cpu >"$tmp/s7" 2>/dev/null
cmp -s "$tmp/s7" "$tmp/s8" && bad "seeds 7 and 8 sample the same tokens" || ok "seeds 7 and 8 differ"

DW_LOG=debug "$dw" sample qwen3-moe-tiny --prompt "1 2 3" -n 12 --temperature 0 --device cpu >"$tmp/moe" 2>"$tmp/moe.err"
check "a MoE preset samples" 0 $?
has "... with the cache (dropless)" "$tmp/moe.err" "KV cache up to"
DW_KV_CACHE=0 "$dw" sample qwen3-moe-tiny --prompt "1 2 3" -n 12 --temperature 0 --device cpu >"$tmp/moe0" 2>/dev/null
cmp -s "$tmp/moe" "$tmp/moe0" && ok "MoE: same tokens with and without the cache" ||
  bad "MoE: the cache changes the tokens: $(cat "$tmp/moe") vs $(cat "$tmp/moe0")"
exit $((fails > 0))
