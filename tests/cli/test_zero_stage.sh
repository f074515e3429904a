#!/usr/bin/env bash
# test_zero_stage.sh DEEPWELL — ZeRO from engine creation and ZeRO-2's gradient staging (issue 28),
# on 2 and 4 CPU ranks of `deepwell launch`:
#  - every rank's engine is made with its shards (its log line: gradients and optimizer state of its
#    range, ZeRO-2/3 4 bytes a float of gradients, 8 of moments), the ranges tile the pool, and the
#    whole pools are never allocated (the pools in all stay below the whole ones);
#  - ZeRO-2 stages its gradients through buckets of DW_DP_BUCKET_FLOATS on parameter boundaries,
#    fewer slots than buckets: the shard plus the staging per rank below the whole gradient pool;
#  - with one micro-batch a step (the same reduction order on tcp ranks: rank order) ZeRO-2 gives
#    ZeRO-1's losses, gradient norms and checkpoints bit for bit, overlapped or not, and ZeRO-3
#    ZeRO-1's losses bit for bit (mixtral-tiny's experts too); with two micro-batches (each reduced on
#    its own, then added) within 1e-6 relative;
#  - a staged 4-rank ZeRO-2 checkpoint resumes on 2 ranks with the 4-rank losses (2e-6);
#  - `deepwell plan --json` prices each data-parallel ZeRO stage's gradients and optimizer per rank
#    as the engine allocates them (default buckets): its figures equal the largest rank's log.
set -u
dw=$1
. "$(dirname "$0")/zero_common.sh" # the tiny model and text, same_ckpt, close
# the gradient pools these checks count, and the planner's price of them: `deepwell train` keeps the
# gradients in the activation arena by default for one micro-batch a step under ZeRO 0/1
# (test_train_arena_default.sh, test_grad_arena_dp.sh)
export DW_GRAD_ARENA=0
run=(train --model "$tmp/model" --data "$tmp/text.txt" --seq 32 --steps 4 --lr 3e-3 --warmup 1 --eval-every 0
     --ckpt-every 2 --keep 0 --device cpu --seed 5 --batch 1 --clip 1)

# engine_lines LOG RANKS ZERO: every rank's creation line and staging line checked; prints the
# largest rank's gradient and optimizer bytes (shard + staging) as "grads opt"
engine_lines() {
  python3 - "$@" <<'PY'
import re, sys
log, n, z = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3])
made, staged = {}, {}
for m in re.finditer(r"rank (\d+)/(\d+)\] engine: ZeRO-(\d) from creation: gradients of floats \[(\d+), (\d+)\) \((\d+) "
                     r"bytes, (\d+) whole\), optimizer state of \[(\d+), (\d+)\) \((\d+) bytes, (\d+) whole\); (\d+) bytes", log):
    r, w, zz, glo, ghi, gb, gw, olo, ohi, ob, ow, total = map(int, m.groups())
    assert w == n and zz == z and r not in made, m.group(0)
    assert ob == 8 * (ohi - olo) and ow == 8 * gw // 4, m.group(0)
    if z >= 2: assert (glo, ghi) == (olo, ohi) and gb == 4 * (ghi - glo), m.group(0)
    else: assert (glo, ghi) == (0, gw // 4) and gb == gw, m.group(0)
    assert total < total - gb - ob + gw + ow, m.group(0)  # below the whole pools
    made[r] = (olo, ohi, gb, ob, gw)
for m in re.finditer(r"rank (\d+)/\d+\] ZeRO-\d: gradients of floats \[(\d+), (\d+)\): (\d+) bytes on this rank \+ staging of "
                     r"(\d+) slots? x (\d+) floats \((\d+) bytes\) for (\d+) buckets \((\d+) whole\)", log):
    r, lo, hi, shard, slots, floats, stage, buckets, whole = map(int, m.groups())
    assert r not in staged and shard == 4 * (hi - lo) and stage == 4 * slots * floats and slots <= buckets, m.group(0)
    staged[r] = (stage, slots, buckets, whole)
assert sorted(made) == list(range(n)), sorted(made)
ranges = [made[r][:2] for r in range(n)]
assert ranges[0][0] == 0 and all(ranges[r][1] == ranges[r + 1][0] for r in range(n - 1)), ranges
assert ranges[-1][1] * 4 == made[0][4], ranges
assert sorted(staged) == (list(range(n)) if z >= 2 else []), sorted(staged)
big = max(range(n), key=lambda r: ranges[r][1] - ranges[r][0])
stage = staged[big][0] if z >= 2 else 0
print(made[big][2] + stage, made[big][3], staged[big][1] if z >= 2 else 0, staged[big][2] if z >= 2 else 0)
PY
}
losses() { python3 -c "import json,sys; print([(x['loss'], x['grad_norm']) for x in map(json.loads, open(sys.argv[1]))])" "$1"; }

for n in 2 4; do
  for z in 1 2 3; do
    DW_DP_BUCKET_FLOATS=4096 "$dw" launch -n $n -- "${run[@]}" --zero $z --out "$tmp/r$n-z$z" >/dev/null 2>"$tmp/err$n-$z"
    check "launch -n $n --zero $z (buckets of 4096 floats)" 0 $?
    read -r grads opt slots buckets < <(engine_lines "$tmp/err$n-$z" $n $z) &&
      ok "  ... every rank's engine made with its shards: largest rank $grads bytes of gradients, $opt of moments" ||
      bad "  ... $n ranks, ZeRO-$z: the engines' allocations"
    if [ $z = 2 ]; then
      whole=$((4 * $(grep -o 'gradients of floats \[0, [0-9]*' "$tmp/err$n-1" | head -1 | grep -o '[0-9]*$')))
      [ "${slots:-0}" -ge 1 ] && [ "$slots" -lt "$buckets" ] && [ "$grads" -lt "$whole" ] &&
        ok "  ... $slots staging slots for $buckets buckets: $grads bytes of gradients on a rank, $whole whole" ||
        bad "  ... staging: slots ${slots:-?} of ${buckets:-?} buckets, $grads bytes against $whole whole"
    fi
  done
  [ "$(losses "$tmp/r$n-z1/metrics.jsonl")" = "$(losses "$tmp/r$n-z2/metrics.jsonl")" ] &&
    same_ckpt "$tmp/r$n-z1" "$tmp/r$n-z2" &&
    ok "  ... $n ranks: ZeRO-2 staged gives ZeRO-1's losses, norms, weights and moments bit for bit" ||
    bad "  ... $n ranks: ZeRO-2 staged differs from ZeRO-1"
  [ "$(losses "$tmp/r$n-z1/metrics.jsonl")" = "$(losses "$tmp/r$n-z3/metrics.jsonl")" ] &&
    ok "  ... ZeRO-3 staged: ZeRO-1's losses bit for bit" || bad "  ... $n ranks: ZeRO-3 differs from ZeRO-1"
done

moe=(train --model mixtral-tiny --data builtin --seq 32 --steps 3 --lr 3e-3 --warmup 1 --eval-every 0 --ckpt-every 0
     --device cpu --batch 1)
for z in 1 2; do # a mixture of experts: its expert weights staged as any other parameter
  DW_DP_BUCKET_FLOATS=2048 "$dw" launch -n 4 -- "${moe[@]}" --zero $z --out "$tmp/moe$z" >/dev/null 2>"$tmp/moeerr$z"
  check "mixtral-tiny on 4 ranks, ZeRO-$z" 0 $?
done
read -r grads opt slots buckets < <(engine_lines "$tmp/moeerr2" 4 2)
[ "${slots:-0}" -ge 1 ] && [ "$slots" -lt "$buckets" ] && [ "$(losses "$tmp/moe1/metrics.jsonl")" = "$(losses "$tmp/moe2/metrics.jsonl")" ] &&
  cmp -s "$tmp/moe1/ckpt-3/model.safetensors" "$tmp/moe2/ckpt-3/model.safetensors" &&
  ok "  ... $buckets buckets in $slots slots: ZeRO-1's losses, norms and weights bit for bit" || bad "  ... MoE staging"

DW_DP_BUCKET_FLOATS=4096 "$dw" launch -n 4 -- "${run[@]}" --zero 2 --no-overlap --out "$tmp/noov" >/dev/null 2>"$tmp/err"
check "4 ranks, ZeRO-2 without overlap" 0 $?
grep -q "without overlap every bucket keeps its slot" "$tmp/err" && [ "$(losses "$tmp/noov/metrics.jsonl")" = "$(losses "$tmp/r4-z2/metrics.jsonl")" ] &&
  ok "  ... a slot per bucket, the overlapped run's losses bit for bit" || bad "  ... no-overlap staging"

for z in 1 2; do # two micro-batches a step
  DW_DP_BUCKET_FLOATS=4096 "$dw" launch -n 2 -- "${run[@]}" --zero $z --global-batch 4 --out "$tmp/ga-z$z" >/dev/null 2>&1
  check "2 ranks, 2 micro-batches a step, ZeRO-$z" 0 $?
done
python3 - "$tmp/ga-z1/metrics.jsonl" "$tmp/ga-z2/metrics.jsonl" <<'PY' && ok "  ... ZeRO-2 within 1e-6 of ZeRO-1" || bad "  ... accumulated ZeRO-2"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 4
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= 1e-6 * x["loss"] and abs(x["grad_norm"] - y["grad_norm"]) <= 1e-6 * x["grad_norm"], (x, y)
PY

DW_DP_BUCKET_FLOATS=4096 "$dw" launch -n 2 -- train --resume "$tmp/r4-z2/ckpt-2" --zero 2 --out "$tmp/res" >/dev/null 2>"$tmp/err"
check "staged 4-rank ZeRO-2 step 2 resumed on 2 ranks" 0 $?
engine_lines "$tmp/err" 2 2 >/dev/null && ok "  ... into engines made with their shards" || bad "  ... resumed allocations"
close "$tmp/r4-z2/metrics.jsonl" "$tmp/res/metrics.jsonl" 2e-6 2 && ok "  ... steps 3-4 as the 4 ranks ran them (2e-6)" ||
  bad "  ... resumed losses"

# the planner prices what the engines allocate (default buckets)
for n in 2 4; do
  "$dw" plan "$tmp/model" --hw h100-sxm --gpus $n --seq 32 --global-batch $n --json --top 1000 >"$tmp/plan.json" 2>/dev/null
  check "plan --json on $n GPUs" 0 $?
  for z in 0 1 2; do
    "$dw" launch -n $n -- "${run[@]}" --steps 1 --zero $z --out "$tmp/p$n-$z" >/dev/null 2>"$tmp/perr"
    python3 - "$tmp/plan.json" $n $z "$(engine_lines "$tmp/perr" $n $z 2>/dev/null)" "$tmp/p$n-0" <<'PY' &&
import json, sys
d = json.load(open(sys.argv[1]))
n, z, got = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
e = [a for a in [d["best"]] + d["alternatives"] if a["parallel"]["dp"] == n and a["zero"] == z and a["micro_batch"] == 1
     and a["recompute"] == "none" and not a["offload"]]
assert e, "no such plan"
m = e[0]["memory"]
if z == 0:
    assert not got, got  # made whole: no creation line
else:
    assert [m["grads_bytes"], m["optimizer_bytes"]] == [int(got[0]), int(got[1])], (m, got)
PY
      ok "  ... dp$n ZeRO-$z: the plan's gradients and optimizer per GPU are the engine's" || bad "  ... dp$n ZeRO-$z priced apart from the engine"
  done
done

[ "$fails" -eq 0 ] || exit 1
