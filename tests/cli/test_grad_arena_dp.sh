#!/usr/bin/env bash
# test_grad_arena_dp.sh DEEPWELL — gradients in the activation arena (DW_GRAD_ARENA=1,
# dw_compile_opts.grad_arena) under data parallelism on CPU ranks: `mpirun -np 2` with ZeRO-0 and
# ZeRO-1 (one micro-batch per rank and step) gives the standing pool's losses, norms and checkpoint
# bytes exactly (the buckets reduce the same floats, read from the arena); a MoE model too; with
# accumulation (2 micro-batches a step) or ZeRO-2 the arena program is refused naming
# grad_arena, and without DW_GRAD_ARENA the pool stays (those runs are test_dp.sh's). The same in
# BF16 with the BF16 working copies in the arena too (DW_BF16_ARENA=1: ZeRO-1's shard step
# remakes them through dw_engine_refresh).
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
ranks_env

mkdir -p "$tmp/model" "$tmp/moe"
cat >"$tmp/model/config.json" <<'JSON'
{"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}
JSON
cat >"$tmp/moe/config.json" <<'JSON'
{"model_type": "mixtral", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
 "num_attention_heads": 2, "num_key_value_heads": 1, "num_local_experts": 4, "num_experts_per_tok": 2,
 "max_position_embeddings": 64}
JSON
cat "$0" "$(dirname "$0")/checks.sh" >"$tmp/text.txt"
tail -c 3000 "$0" >"$tmp/val.txt"
run=(train --data "$tmp/text.txt" --val "$tmp/val.txt" --seq 32 --steps 4 --lr 3e-3 --warmup 2
     --eval-every 2 --eval-batches 2 --ckpt-every 4 --keep 0 --device cpu --seed 7 --batch 2)
mpi=(mpirun -np 2)

for m in model moe; do
  for z in 0 1; do
    for a in 0 1; do
      DW_GRAD_ARENA=$a "${mpi[@]}" "$dw" "${run[@]}" --model "$tmp/$m" --zero $z --out "$tmp/$m-z$z-a$a" \
        >/dev/null 2>"$tmp/err-$m-z$z-a$a"
      check "$m, mpirun -np 2 --zero $z, DW_GRAD_ARENA=$a" 0 $?
    done
    python3 - "$tmp/$m-z$z-a0/metrics.jsonl" "$tmp/$m-z$z-a1/metrics.jsonl" <<'PY' &&
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("loss", "val_loss", "grad_norm"):
        assert (k in x) == (k in y) and x.get(k) == y.get(k), (k, x, y)
PY
      ok "  ... $m ZeRO-$z: the same losses, validation losses and norms, bit for bit" ||
      bad "  ... $m ZeRO-$z: the metrics differ"
    same=1
    for f in "$tmp/$m-z$z-a0/ckpt-4/"*.safetensors; do
      cmp -s "$f" "$tmp/$m-z$z-a1/ckpt-4/$(basename "$f")" || same=0
    done
    [ $same = 1 ] && ls "$tmp/$m-z$z-a0/ckpt-4/"*.safetensors >/dev/null 2>&1 &&
      ok "  ... $m ZeRO-$z: the same weights and moments, byte for byte" ||
      bad "  ... $m ZeRO-$z: the checkpoints differ"
  done
done

for z in 0 1; do
  DW_GRAD_ARENA=0 "${mpi[@]}" "$dw" "${run[@]}" --model "$tmp/moe" --precision bf16 --zero $z --out "$tmp/b-z$z-a0" \
    >/dev/null 2>&1 &&
    DW_GRAD_ARENA=1 DW_BF16_ARENA=1 "${mpi[@]}" "$dw" "${run[@]}" --model "$tmp/moe" --precision bf16 --zero $z \
      --out "$tmp/b-z$z-a1" >/dev/null 2>&1
  check "moe BF16, ZeRO-$z, DW_GRAD_ARENA=1 DW_BF16_ARENA=1 and the pools" 0 $?
  same=1
  for f in "$tmp/b-z$z-a0/ckpt-4/"*.safetensors; do
    cmp -s "$f" "$tmp/b-z$z-a1/ckpt-4/$(basename "$f")" || same=0
  done
  cmp -s "$tmp/b-z$z-a0/metrics.jsonl" "$tmp/b-z$z-a1/metrics.jsonl" || python3 - "$tmp/b-z$z-a0/metrics.jsonl" \
    "$tmp/b-z$z-a1/metrics.jsonl" <<'PY' || same=0
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 4 and all(x.get(k) == y.get(k) for x, y in zip(a, b) for k in ("loss", "val_loss", "grad_norm"))
PY
  [ $same = 1 ] && ok "  ... the same metrics and checkpoint bytes" || bad "  ... BF16 ZeRO-$z with the copies in the arena differs"
done

DW_GRAD_ARENA=1 "${mpi[@]}" "$dw" "${run[@]}" --model "$tmp/model" --global-batch 8 --out "$tmp/acc" >/dev/null \
  2>"$tmp/err_acc"
[ $? -ne 0 ] && ok "DW_GRAD_ARENA=1 with accumulation 2 is refused" || bad "accumulation ran on the arena program"
has "  ... naming the switch" "$tmp/err_acc" "grad_arena" "DW_GRAD_ARENA=0"
DW_GRAD_ARENA=1 "${mpi[@]}" "$dw" "${run[@]}" --model "$tmp/model" --zero 2 --out "$tmp/z2" >/dev/null 2>"$tmp/err_z2"
[ $? -ne 0 ] && ok "DW_GRAD_ARENA=1 with ZeRO-2 is refused" || bad "ZeRO-2 ran on the arena program"
has "  ... naming the switch" "$tmp/err_z2" "ZeRO-2" "grad_arena"
[ "$fails" -eq 0 ] || exit 1
