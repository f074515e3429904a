#!/usr/bin/env bash
# test_quant_check_recompute.sh DEEPWELL — the quantisation guard measures each layer's x while it
# is in memory: recompute (selective: the norms and MLP activations; full: every block's inner
# values) drops those values once their readers in the forward have run, and the guard once read
# them after the whole check forward, from memory the arena had given to later values (other
# numbers, no error). Training is the same bits with and without recompute, so a tiny Llama in
# fp8_block, 3 CPU steps with --quant-check-every 1, writes the same quant_stats.jsonl byte for
# byte under --recompute none, selective and full; every quantised layer's x and x^T are in it.
set -u
bin=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
for rc in none selective full; do
  "$bin" train --model llama-tiny --data builtin --batch 2 --seq 32 --eval-every 0 --ckpt-minutes 0 --device cpu \
    --precision fp8_block --quant-check-every 1 --steps 3 --recompute $rc --seed 7 --out "$tmp/run_$rc" \
    >"$tmp/train_$rc.out" 2>&1
  check "train --recompute $rc with the guard every step" 0 $?
done
n=$(grep -c '"tensor": "x"' "$tmp/run_none/quant_stats.jsonl")
# llama-tiny: 4 blocks of 7 quantised linear layers (the LM head stays BF16), 3 checks
if [ "$n" = 84 ]; then ok "x measured for 28 layers at 3 checks"; else bad "x lines: $n, want 84"; fi
for rc in selective full; do
  if cmp -s "$tmp/run_none/quant_stats.jsonl" "$tmp/run_$rc/quant_stats.jsonl"; then
    ok "quant_stats.jsonl under --recompute $rc is none's byte for byte"
  else
    bad "quant_stats.jsonl under --recompute $rc differs: $(diff "$tmp/run_none/quant_stats.jsonl" \
      "$tmp/run_$rc/quant_stats.jsonl" | head -4)"
  fi
done

[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all quant check recompute checks passed"
