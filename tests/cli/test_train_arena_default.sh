#!/usr/bin/env bash
# test_train_arena_default.sh DEEPWELL — `deepwell train` keeps the FP32 gradients (and in a BF16
# program the BF16 weight copies) in the activation arena by default wherever the run allows it
# (one micro-batch per optimizer step, ZeRO 0 or 1: dw_compile_opts_train_arenas), says so on
# stderr, and trains exactly as --no-grad-arena does: the same losses, validation losses, norms,
# skips, fallbacks and rollbacks in metrics.jsonl, the same samples and the same checkpoint bytes,
# on the trainer's paths (eval, samples, resume either way, the guard's non-finite skips and
# --max-skips stop, the quantised layers' BF16 fallbacks, a loss-spike rollback, 2 CPU ranks with
# ZeRO-1 and EP), and with fp8_block experts whose weight caches' codes go in the arena too
# (alone, across skipped steps, on 2 ranks; DW_WCACHE_ARENA=0 keeps them in the workspace). With accumulation or ZeRO-2 the run is on the pools, with no refusal;
# DW_GRAD_ARENA=0 / DW_BF16_ARENA=0 turn them off. `deepwell dryrun` prices the arenas.
# PART (default all): `trainer` runs everything but the experts' caches, `wcache` only those
# (ctest runs the two as cli_test_train_arena_default and cli_test_train_arena_wcache, so that the
# sanitized pass, which leaves the first out for its time, keeps the second: scripts/test.sh).
set -u
dw=$1
part=${2:-all}
case $part in all | trainer | wcache) ;; *) echo "test_train_arena_default.sh: PART is all, trainer or wcache, not '$part'" >&2; exit 2 ;; esac
want() { [ "$part" = all ] || [ "$part" = "$1" ]; }
. "$(dirname "$0")/checks.sh"
ranks_env

mkdir -p "$tmp/dense"
cat >"$tmp/dense/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64}
JSON
moe=mixtral-tiny # a preset: 2 layers of 4 experts, top 2
mkdir -p "$tmp/moe128" # experts of 128-multiples: fp8_block runs them quantised, their caches' codes in the arena
cat >"$tmp/moe128/config.json" <<'JSON'
{"model_type": "mixtral", "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
 "max_position_embeddings": 64}
JSON
cat "$0" "$(dirname "$0")/checks.sh" >"$tmp/text.txt"
tail -c 3000 "$0" >"$tmp/val.txt"
seed=$((RANDOM % 1000 + 1))
base=(train --data "$tmp/text.txt" --val "$tmp/val.txt" --seq 32 --warmup 2 --eval-every 2 --eval-batches 2
      --keep 0 --device cpu --seed $seed --batch 2)
ON="memory: the FP32 gradients"

# pair NAME EXPECTED_RC ARGS...: the run with the default and with --no-grad-arena, into $tmp/NAME-a
# and $tmp/NAME-b (stdout .out, stderr .err), each exiting EXPECTED_RC ("same": whatever the
# default's run exits with).
pair() {
  local n=$1 want=$2 rc; shift 2
  "$dw" "$@" --out "$tmp/$n-a" >"$tmp/$n-a.out" 2>"$tmp/$n-a.err"
  rc=$?
  [ "$want" = same ] && want=$rc && echo "  ($n: exit $rc)"
  check "$n: the default" "$want" $rc
  "$dw" "$@" --no-grad-arena --out "$tmp/$n-b" >"$tmp/$n-b.out" 2>"$tmp/$n-b.err"
  check "$n: --no-grad-arena" "$want" $?
}
# same NAME DIR_A DIR_B: metrics.jsonl the same but for the clocks, the samples on stdout, every
# checkpoint's weights and moments byte for byte, the precision decisions.
same() {
  local n=$1 a=$2 b=$3 fine=1
  python3 - "$a" "$b" <<'PY' || fine=0
import json, sys
clocks = {"tokens_per_s", "elapsed_s", "eta_s", "comm_s", "exposed_comm_s"}
a, b = ([{k: v for k, v in json.loads(l.replace(d, "RUN")).items() if k not in clocks}  # a rollback names its run
         for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:])
assert len(a) == len(b) >= 2, (len(a), len(b))
for x, y in zip(a, b):
    assert x == y, (x, y)
PY
  cmp -s "$a.out" "$b.out" || { echo "  stdout differs"; fine=0; }
  local k=0
  for f in "$a"/ckpt-*/*.safetensors; do
    [ -f "$f" ] || continue
    k=$((k + 1))
    cmp -s "$f" "$b/${f#"$a"/}" || { echo "  $f differs"; fine=0; }
  done
  [ $k -ge 2 ] || { echo "  no checkpoint files in $a"; fine=0; }
  [ ! -f "$a/precision_decisions.jsonl" ] || cmp -s "$a/precision_decisions.jsonl" "$b/precision_decisions.jsonl" ||
    { echo "  precision_decisions.jsonl differs"; fine=0; }
  [ $fine = 1 ] && ok "  ... $n: the same metrics, samples and checkpoints ($k files) byte for byte" ||
    bad "  ... $n: the arena run differs from the pools'"
}
# arenas NAME WHAT: the default run says the arenas hold WHAT; the --no-grad-arena one says nothing.
arenas() {
  has "  ... $1: the default run's arenas" "$tmp/$1-a.err" "$2"
  grep -q "$ON" "$tmp/$1-b.err" && bad "  ... $1: --no-grad-arena still in the arena" ||
    ok "  ... $1: --no-grad-arena on the pools"
}
pools() { # pools NAME: neither run in the arena
  grep -q "$ON" "$tmp/$1-a.err" "$tmp/$1-b.err" && bad "  ... $1: in the arena" || ok "  ... $1: on the pools"
}
BOTH="$ON and the BF16 weight copies in the activation arena"

if want trainer; then
# eval and samples (the fused head off), FP32 and BF16; BF16 without samples (the fused head on)
pair fp32 0 "${base[@]}" --model "$tmp/dense" --steps 4 --lr 3e-3 --ckpt-every 2 --sample-every 2 --sample-tokens 8
arenas fp32 "$ON in the activation arena (dw_compile_opts.grad_arena)"
same fp32 "$tmp/fp32-a" "$tmp/fp32-b"
pair bf16 0 "${base[@]}" --model $moe --precision bf16 --steps 4 --lr 3e-3 --ckpt-every 2 --sample-every 2 \
  --sample-tokens 8
arenas bf16 "$BOTH"
same bf16 "$tmp/bf16-a" "$tmp/bf16-b"
[ -s "$tmp/bf16-a.out" ] && ok "  ... samples were printed" || bad "  ... no samples on stdout"
pair fused 0 "${base[@]}" --model $moe --precision bf16 --steps 4 --lr 3e-3 --ckpt-every 2
arenas fused "$BOTH"
same fused "$tmp/fused-a" "$tmp/fused-b"

# resumed to step 6, each from its own checkpoint and across (a pool checkpoint into the arenas)
"$dw" train --resume "$tmp/fused-a" --steps 6 >"$tmp/res-a.out" 2>"$tmp/res-a.err" &&
  "$dw" train --resume "$tmp/fused-b" --steps 6 --no-grad-arena >"$tmp/res-b.out" 2>"$tmp/res-b.err"
check "resume to step 6, the default and --no-grad-arena" 0 $?
same "resumed" "$tmp/fused-a" "$tmp/fused-b"
cp -r "$tmp/bf16-b" "$tmp/cross" && "$dw" train --resume "$tmp/cross" --steps 6 >"$tmp/cross.out" 2>"$tmp/cross.err" &&
  grep -q "$BOTH" "$tmp/cross.err"
check "a pool run's checkpoint resumed in the arenas" 0 $?
"$dw" train --resume "$tmp/bf16-b" --steps 6 --no-grad-arena >"$tmp/bf16-b6.out" 2>/dev/null
python3 - "$tmp/cross/metrics.jsonl" "$tmp/bf16-b/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 6 and all(x["loss"] == y["loss"] and x.get("val_loss") == y.get("val_loss") for x, y in zip(a, b))
PY
check "  ... the same losses as resumed on the pools" 0 $?

# the environment: each switch off alone
DW_GRAD_ARENA=0 pair env0 0 "${base[@]}" --model $moe --precision bf16 --steps 2 --lr 3e-3 --ckpt-every 2
pools env0
DW_BF16_ARENA=0 pair envb 0 "${base[@]}" --model $moe --precision bf16 --steps 4 --lr 3e-3 --ckpt-every 2
arenas envb "$ON in the activation arena (dw_compile_opts.grad_arena)"
grep -q "BF16 weight copies" "$tmp/envb-a.err" && bad "  ... DW_BF16_ARENA=0: the copies in the arena all the same" ||
  ok "  ... DW_BF16_ARENA=0: the copies in the weights pool"
same envb "$tmp/envb-a" "$tmp/envb-b"

# accumulation (2 micro-batches a step): the pools, no refusal, the same run
pair accum 0 "${base[@]}" --model $moe --precision bf16 --steps 4 --lr 3e-3 --ckpt-every 2 --global-batch 4
pools accum
same accum "$tmp/accum-a" "$tmp/accum-b"

# the guard: non-finite steps skipped (an absurd learning rate), then --max-skips stops the run
# with a checkpoint of the last good state
pair skip 1 "${base[@]}" --model $moe --precision bf16 --steps 8 --lr 1e3 --clip 0 --ckpt-every 2 --max-skips 3
arenas skip "$BOTH"
has "  ... steps were skipped" "$tmp/skip-a/metrics.jsonl" '"skipped": "nonfinite'
has "  ... then the run stopped" "$tmp/skip-a.err" "--max-skips 3"
same skip "$tmp/skip-a" "$tmp/skip-b"
# the quantised layers fall back to BF16 (the counters' rule at its strictest: nvfp4 always, fp8_block
# as its data falls)
for p in nvfp4 fp8_block; do
  pair "$p" 0 "${base[@]}" --model $moe --precision $p --steps 6 --lr 3e-3 --ckpt-every 3 \
    --quant-check-every 1 --quant-underflow-max 0 --quant-counts-after 1
  arenas "$p" "$BOTH"
  if [ $p = nvfp4 ]; then has "  ... layers fell back to BF16" "$tmp/$p-a/precision_decisions.jsonl" '"to": "bf16"'
  else echo "  ($p: $(cat "$tmp/$p-a/precision_decisions.jsonl" 2>/dev/null | wc -l) fallbacks)"; fi
  same "$p" "$tmp/$p-a" "$tmp/$p-b"
done
fi
WC="$BOTH, with the quantised weight caches of 6 expert linear layers"
if want wcache; then
# fp8_block experts with their weight caches' codes in the BF16 copies' rooms (wcache_arena): a run,
# and steps the guard skips (the backward took the caches; the next forward's are made again)
pair wcache 0 "${base[@]}" --model "$tmp/moe128" --precision fp8_block --steps 4 --lr 3e-3 --ckpt-every 2
arenas wcache "$WC"
same wcache "$tmp/wcache-a" "$tmp/wcache-b"
pair wskip 1 "${base[@]}" --model "$tmp/moe128" --precision fp8_block --steps 8 --lr 1e3 --clip 0 --ckpt-every 2 \
  --max-skips 3
arenas wskip "$WC"
has "  ... steps were skipped" "$tmp/wskip-a/metrics.jsonl" '"skipped": "nonfinite'
same wskip "$tmp/wskip-a" "$tmp/wskip-b"
DW_WCACHE_ARENA=0 pair wcache0 0 "${base[@]}" --model "$tmp/moe128" --precision fp8_block --steps 4 --lr 3e-3 \
  --ckpt-every 2
arenas wcache0 "$BOTH (dw_compile_opts"
same wcache0 "$tmp/wcache0-a" "$tmp/wcache-a"
fi

if want trainer; then
# a loss spike rolls back to the last checkpoint (and, after --max-rollbacks, may stop the run).
# About 1 seed in 25 gives 8 falling losses and no spike: the first of seed, seed + 1, ... (five at
# most) whose run rolls back is the one compared (a later --seed overrides base's)
spike=("${base[@]}" --model $moe --precision bf16 --steps 8 --lr 3e-2 --ckpt-every 2 --spike-zscore 0.01
       --spike-window 2 --max-rollbacks 2)
for s in $seed $((seed + 1)) $((seed + 2)) $((seed + 3)) $((seed + 4)); do
  rm -rf "$tmp/spike-try"
  "$dw" "${spike[@]}" --seed $s --out "$tmp/spike-try" >/dev/null 2>&1
  grep -q '"rollback"' "$tmp/spike-try/metrics.jsonl" 2>/dev/null && break
done
pair spike same "${spike[@]}" --seed $s
has "  ... a rollback happened" "$tmp/spike-a/metrics.jsonl" '"rollback"'
same spike "$tmp/spike-a" "$tmp/spike-b"
fi

# two CPU ranks: ZeRO-1 and EP in the arenas, ZeRO-2 on the pools (no refusal) (trainer); the
# experts' caches in the arena (wcache)
ranks=()
want trainer && ranks+=("z1:--zero 1" "ep:--ep 2 --zero 1" "z2:--zero 2")
want wcache && ranks+=("dpw:--model $tmp/moe128 --precision fp8_block")
mpi=(mpirun -np 2 "$dw")
dp=(train --data "$tmp/text.txt" --val "$tmp/val.txt" --seq 32 --warmup 2 --eval-every 2 --eval-batches 2 --keep 0
    --device cpu --seed $seed --batch 2 --model $moe --precision bf16 --steps 4 --lr 3e-3 --ckpt-every 2)
for v in "${ranks[@]}"; do
  n=${v%%:*}
  read -ra extra <<<"${v#*:}"
  "${mpi[@]}" "${dp[@]}" "${extra[@]}" --out "$tmp/$n-a" >"$tmp/$n-a.out" 2>"$tmp/$n-a.err"
  check "mpirun -np 2 ${v#*:}: the default" 0 $?
  "${mpi[@]}" "${dp[@]}" "${extra[@]}" --no-grad-arena --out "$tmp/$n-b" >"$tmp/$n-b.out" 2>"$tmp/$n-b.err"
  check "mpirun -np 2 ${v#*:}: --no-grad-arena" 0 $?
  if [ "$n" = z2 ]; then pools z2; elif [ "$n" = dpw ]; then arenas dpw "$WC"; else arenas "$n" "$BOTH"; fi
  same "$n" "$tmp/$n-a" "$tmp/$n-b"
done

# the help; the planner's memory (dryrun) with the arenas as train runs the plan, and without
if want trainer; then
"$dw" train --help | grep -q -- "--no-grad-arena" && "$dw" bench step --help | grep -q -- "--no-grad-arena"
check "train and bench step --help name --no-grad-arena" 0 $?
job=(dryrun moe-e8 --hw h100-sxm --gpus 1 --seq 2048 --global-batch 8)
"$dw" "${job[@]}" >"$tmp/dry.txt" 2>&1 && DW_GRAD_ARENA=0 "$dw" "${job[@]}" >"$tmp/dry0.txt" 2>&1
check "dryrun moe-e8, the default and DW_GRAD_ARENA=0" 0 $?
has "  ... the default prices the arenas" "$tmp/dry.txt" "mb8 ga1" "grads 0.00 |" \
  "gradients and BF16 weight copies in the activation arena"
python3 - "$tmp/dry.txt" "$tmp/dry0.txt" <<'PY'
import re, sys
peak = [float(re.search(r"peak ([0-9.]+) GiB", open(p).read()).group(1)) for p in sys.argv[1:]]
print("  peak: arenas %.2f GiB, pools %.2f GiB" % tuple(peak))
assert peak[0] < peak[1] - 5, peak
PY
check "  ... the arena peak at least 5 GiB under the pools'" 0 $?
fi

[ $fails -eq 0 ] || exit 1
