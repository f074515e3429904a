#!/usr/bin/env bash
# test_ep_fp8.sh DEEPWELL — fp8_block experts under expert parallelism on CPU ranks (issue 24): a
# Mixtral of hidden 128 and experts of 256 (multiples of 128, as fp8_block's 128x128 weight blocks
# need; 4 experts, top 2, 2 MoE layers), `mpirun -np 2 --ep 2` against `mpirun -np 2` (--ep 1), in
# two lanes. The exchanged rows stay BF16; each owner quantises the rows it receives 1x128 and reads
# its experts' slices of the weight cache, so the losses of fprop and dgrad in fp8_block are the
# same bits. Under --precision fp8_block the experts' wgrad stays BF16 (the default,
# docs/precision.md): --ep 2 gives --ep 1's step-1 loss bit for bit and its norm within 1e-6
# (measured <= 1e-11 over 107 seeds: the norm's sums in another order). After that the two differ
# by summation order only: an owner's wgrad sums both ranks' rows in one GEMM where --ep 1 sums each
# rank's and all-reduces, and each token's K expert outputs come back in another order, so masters
# and gradients move by ulps. Mostly the BF16 and FP8 casts absorb that, but a value on a rounding
# edge flips one code: over 107 seeds steps 2-3 differed in 2 (losses up to 1.7e-5, norms up to
# 7.7e-5; DW_TEST_SEED=178449640 and 468792786). Asserted: 2e-4 and 1e-3. With the wgrad in fp8_block too
# (--policy with the rule's "bf16_passes": []) the expert weight gradient differs: wgrad quantises
# dy^T and x^T in 1x128 blocks along each expert's rows, and an owner's blocks hold both ranks' rows
# of an expert where each --ep 1 rank's hold its own, so the blocks' scales differ; over 8 seeds:
# step 1's norm within 1.5e-5, steps 2-3 losses within 1.8e-4 and norms within 1.9e-3 relative
# (this run prints its own). Asserted there: step 1's loss exactly, its norm 1e-4, then 1e-3
# (losses) and 1e-2 (norms). Rank 0's samples (every expert local, the other ranks' expert caches
# quantised again first) run in that lane. The caches byte for byte: tests/unit/test_moe_fp8_ep.c,
# run here as 2 mpirun ranks (--mpi) against a one-rank engine on each.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
ranks_env

mkdir -p "$tmp/m128"
cat >"$tmp/m128/config.json" <<'JSON'
{"model_type": "mixtral", "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
 "max_position_embeddings": 256}
JSON
seed=${DW_TEST_SEED:-$((RANDOM * 32768 + RANDOM))}
echo "test seed: DW_TEST_SEED=$seed"
echo '{"default": "fp8_block", "rules": [{"op": "moe_linear", "recipe": "fp8_block", "bf16_passes": []}]}' \
  >"$tmp/fp8_wgrad.json"
run=(train --model "$tmp/m128" --data builtin --seq 32 --steps 3 --lr 3e-3 --warmup 2 --eval-every 0 --ckpt-every 0
     --keep 0 --device cpu --seed $seed --batch 2)

# the default: the experts' wgrad BF16, --ep 2 = --ep 1 bit for bit
mpirun -np 2 "$dw" "${run[@]}" --precision fp8_block --out "$tmp/dp0" >/dev/null 2>"$tmp/err0"
check "mpirun -np 2, fp8_block (wgrad BF16 by default), --ep 1" 0 $?
mpirun -np 2 "$dw" "${run[@]}" --precision fp8_block --ep 2 --out "$tmp/ep0" >/dev/null 2>"$tmp/err0"
check "mpirun -np 2, fp8_block (wgrad BF16 by default), --ep 2" 0 $?
python3 - "$tmp/dp0/metrics.jsonl" "$tmp/ep0/metrics.jsonl" <<'PY' && ok "  ... --ep 2 = --ep 1: step 1's loss exactly, its norm 1e-6; then 2e-4 / 1e-3" || bad "fp8_block (wgrad BF16) --ep 2 differs from --ep 1"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 3, (len(a), len(b))
rel = lambda x, y, k: abs(x[k] - y[k]) / abs(x[k])
print("measured:", " ".join("step %d loss %.1e norm %.1e" % (x["step"], rel(x, y, "loss"), rel(x, y, "grad_norm"))
                            for x, y in zip(a, b)))
assert a[0]["loss"] == b[0]["loss"] and rel(a[0], b[0], "grad_norm") <= 1e-6, (a[0], b[0])
for x, y in zip(a[1:], b[1:]):
    assert rel(x, y, "loss") <= 2e-4 and rel(x, y, "grad_norm") <= 1e-3, (x, y)
assert a[0]["loss"] > a[-1]["loss"]  # it trains
PY

# the wgrad in fp8_block too: a rule's "bf16_passes": []
mpirun -np 2 "$dw" "${run[@]}" --policy "$tmp/fp8_wgrad.json" --out "$tmp/dp" >/dev/null 2>"$tmp/err1"
check "mpirun -np 2, fp8_block with the fp8 wgrad, --ep 1" 0 $?
mpirun -np 2 "$dw" "${run[@]}" --policy "$tmp/fp8_wgrad.json" --ep 2 --sample-every 3 --sample-tokens 8 \
  --out "$tmp/ep" >"$tmp/out2" 2>"$tmp/err2"
check "mpirun -np 2, fp8_block with the fp8 wgrad, --ep 2 (was refused: rows exceed the fp8_block operand slots)" 0 $?
has "  ... each rank runs its half of the experts" "$tmp/err2" \
  "[deepwell info rank 0/2] expert parallel: groups of 2 ranks, rank 0 runs experts 0-1 of 4 in 2 MoE layers" \
  "[deepwell info rank 1/2] expert parallel: groups of 2 ranks, rank 1 runs experts 2-3 of 4 in 2 MoE layers"
grep -q "operand slots" "$tmp/err2" && bad "  ... an operand slot refusal" || ok "  ... no refusal"
[ -s "$tmp/out2" ] && ok "  ... rank 0 sampled with every expert" || bad "  ... no sample printed"

python3 - "$tmp/dp/metrics.jsonl" "$tmp/ep/metrics.jsonl" <<'PY' && ok "--ep 2 = --ep 1: step 1's loss exactly, its norm 1e-4; then 1e-3 / 1e-2" || bad "fp8_block with the fp8 wgrad: --ep 2 differs from --ep 1"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 3, (len(a), len(b))
rel = lambda x, y, k: abs(x[k] - y[k]) / abs(x[k])
print("measured:", " ".join("step %d loss %.1e norm %.1e" % (x["step"], rel(x, y, "loss"), rel(x, y, "grad_norm"))
                            for x, y in zip(a, b)))
assert a[0]["loss"] == b[0]["loss"], (a[0], b[0])
assert rel(a[0], b[0], "grad_norm") <= 1e-4, (a[0], b[0])
for x, y in zip(a[1:], b[1:]):
    assert rel(x, y, "loss") <= 1e-3 and rel(x, y, "grad_norm") <= 1e-2, (x, y)
assert a[0]["loss"] > a[-1]["loss"]  # it trains
PY

unit="$(dirname "$dw")/tests/test_moe_fp8_ep"
if [ -x "$unit" ]; then
  mpirun -np 2 "$unit" --mpi >"$tmp/out3" 2>"$tmp/err3"
  check "mpirun -np 2 test_moe_fp8_ep --mpi" 0 $?
  has "  ... loss, gradient and each rank's cache slices as one rank's; the others untouched, then whole" \
    "$tmp/out3" "ok: fp8_block experts under --ep 2 over mpi"
else
  bad "$unit not built"
fi

[ "$fails" -eq 0 ] || exit 1
