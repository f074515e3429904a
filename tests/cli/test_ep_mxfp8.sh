#!/usr/bin/env bash
# test_ep_mxfp8.sh DEEPWELL — mxfp8 experts under expert parallelism on CPU ranks (issue 24):
# mixtral-tiny (hidden 64, experts of 128: multiples of 32) under --precision mxfp8, `mpirun -np 2
# --ep 2` against `mpirun -np 2` (--ep 1). Each owner quantises the BF16 rows it receives 1x32
# along their rows, reads its experts' slices of the weight cache (runtime/moe_fp8.c: mxfp8 slices
# of E M K/32 scale bytes), and its wgrad's 32-blocks along an expert's rows hold both ranks' rows
# where each --ep 1 rank's hold its own. Asserted: no operand-slot refusal, the experts split,
# step 1's loss exactly and its norm within 1e-4, then losses 1e-3 and norms 1e-2 relative (as
# test_ep_fp8.sh; one run measured the losses bit for bit and the norms within 2e-12).
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
ranks_env
seed=$((RANDOM * 32768 + RANDOM))
echo "seed $seed"
run=(train --model mixtral-tiny --data builtin --seq 32 --steps 3 --lr 3e-3 --warmup 2 --eval-every 0 --ckpt-every 0
     --keep 0 --device cpu --seed $seed --batch 2 --precision mxfp8)
mpirun -np 2 "$dw" "${run[@]}" --out "$tmp/dp" >/dev/null 2>"$tmp/err1"
check "mpirun -np 2, mxfp8, --ep 1" 0 $?
mpirun -np 2 "$dw" "${run[@]}" --ep 2 --out "$tmp/ep" >/dev/null 2>"$tmp/err2"
check "mpirun -np 2, mxfp8, --ep 2" 0 $?
has "  ... each rank runs its half of the experts" "$tmp/err2" \
  "[deepwell info rank 0/2] expert parallel: groups of 2 ranks, rank 0 runs experts 0-1 of 4 in 2 MoE layers" \
  "[deepwell info rank 1/2] expert parallel: groups of 2 ranks, rank 1 runs experts 2-3 of 4 in 2 MoE layers"
grep -q "operand slots" "$tmp/err2" && bad "  ... an operand slot refusal" || ok "  ... no refusal"
"$dw" compile mixtral-tiny --batch 2 --seq 32 --precision mxfp8 --target cpu --explain 2>&1 |
  grep -c "selected: grouped_cpu_mxfp8 (mxfp8)" | grep -qx 18 && ok "  ... the experts' passes are mxfp8" ||
  bad "  ... the experts are not bound mxfp8"
python3 - "$tmp/dp/metrics.jsonl" "$tmp/ep/metrics.jsonl" <<'PY' && ok "  ... --ep 2 within the bounds of --ep 1" || bad "  ... --ep 2 against --ep 1"
import json, sys
a, b = ([json.loads(x) for x in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 3, (a, b)
rel = lambda x, y: abs(x - y) / abs(y)
print("  measured: losses", [rel(x["loss"], y["loss"]) for x, y in zip(b, a)],
      "norms", [rel(x["grad_norm"], y["grad_norm"]) for x, y in zip(b, a)])
assert b[0]["loss"] == a[0]["loss"] and rel(b[0]["grad_norm"], a[0]["grad_norm"]) <= 1e-4
assert all(rel(x["loss"], y["loss"]) <= 1e-3 and rel(x["grad_norm"], y["grad_norm"]) <= 1e-2 for x, y in zip(b, a))
PY
echo "$fails failed"
[ $fails -eq 0 ]
