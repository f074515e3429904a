#!/usr/bin/env bash
# test_zero_mem.sh DEEPWELL — ZeRO-1/2 save memory (issue 28): on 2 and 4 CPU ranks each rank's
# engine allocates the AdamW moments of its shard alone (its log line: bytes on this rank, planned
# per rank, whole); the ranks' bytes add up to the whole pool, none exceeds the planned per-rank
# figure, and that figure is the whole over the ranks (to the 64-float alignment); ZeRO-0 logs no
# shard. Without clipping ZeRO-1 and ZeRO-2 on 4 ranks write ZeRO-0's checkpoint byte for byte
# (weights and every rank's moments), as they did with the whole pools; a 4-rank ZeRO-2 checkpoint
# resumes on 2 ranks under ZeRO-1 with the losses of the 4-rank run (2e-6, test_dp.sh's rank-count
# tolerance). `deepwell dryrun` of a 2- and 4-rank plan reports the optimizer at 1/ranks of ZeRO-0's.
set -u
dw=$1
. "$(dirname "$0")/zero_common.sh" # the tiny model and text, same_ckpt, close
run=(train --model "$tmp/model" --data "$tmp/text.txt" --seq 32 --steps 4 --lr 3e-3 --warmup 1 --eval-every 0
     --ckpt-every 2 --keep 0 --device cpu --seed 11 --batch 1 --clip 0)

# shard_bytes LOG RANKS: every rank's "bytes on this rank" line checked against the others'
shard_bytes() {
  python3 - "$1" "$2" <<'PY'
import re, sys
log, n = open(sys.argv[1]).read(), int(sys.argv[2])
got = {}
for m in re.finditer(r"rank (\d+)/(\d+)\] ZeRO-\d: optimizer state of floats \[(\d+), (\d+)\): (\d+) bytes on this rank "
                     r"\((\d+) planned per rank, (\d+) whole\)", log):
    r, w, lo, hi, have, plan, whole = map(int, m.groups())
    assert w == n and r not in got, (r, w)
    assert have == 8 * (hi - lo) and have <= plan, m.group(0)
    got[r] = (lo, hi, have, plan, whole)
assert sorted(got) == list(range(n)), sorted(got)
ranges = [got[r][:2] for r in range(n)]
assert ranges[0][0] == 0 and all(ranges[r][1] == ranges[r + 1][0] for r in range(n - 1)), ranges
whole, plan = got[0][4], got[0][3]
assert ranges[-1][1] * 8 == whole and sum(g[2] for g in got.values()) == whole
assert max(g[2] for g in got.values()) == plan and n * plan >= whole and n * plan < whole + 512 * n * n, (plan, whole)
print(f"{n} ranks: {plan} bytes of moments per rank, {whole} whole ({whole / plan:.3f}x)")
PY
}

for n in 2 4; do
  for z in 0 1 2; do
    "$dw" launch -n $n -- "${run[@]}" --zero $z --out "$tmp/r$n-z$z" >/dev/null 2>"$tmp/err$n-$z"
    check "launch -n $n --zero $z" 0 $?
  done
  for z in 1 2; do
    shard_bytes "$tmp/err$n-$z" $n && ok "  ... $n ranks, ZeRO-$z: each rank allocates its shard's moments alone" ||
      bad "  ... $n ranks, ZeRO-$z: shard allocations"
  done
  grep -q "optimizer state of floats" "$tmp/err$n-0" && bad "  ... ZeRO-0 sharded its optimizer" ||
    ok "  ... ZeRO-0 keeps the whole optimizer state"
done
for z in 1 2; do # the same arithmetic per element as ZeRO-0 (test_dp.sh), now in shard-sized pools
  same_ckpt "$tmp/r4-z0" "$tmp/r4-z$z" && ok "  ... 4 ranks, ZeRO-$z: ZeRO-0's weights and moments, byte for byte" ||
    bad "  ... 4 ranks, ZeRO-$z: the checkpoint differs from ZeRO-0's"
done

# a 4-rank ZeRO-2 checkpoint resumed on 2 ranks under ZeRO-1 (each loads its own range)
"$dw" launch -n 2 -- train --resume "$tmp/r4-z2/ckpt-2" --zero 1 --out "$tmp/res" >/dev/null 2>"$tmp/err"
check "4-rank ZeRO-2 step 2 resumed on 2 ranks, ZeRO-1" 0 $?
shard_bytes "$tmp/err" 2 >/dev/null && ok "  ... into shard-sized moments" || bad "  ... resumed allocations"
close "$tmp/r4-z2/metrics.jsonl" "$tmp/res/metrics.jsonl" 2e-6 2 && ok "  ... steps 3-4 as the 4 ranks ran them (2e-6)" ||
  bad "  ... resumed losses"

# the planner's per-GPU optimizer memory for the engine's data-parallel plans
for n in 2 4; do
  for z in 0 1; do
    echo "{\"parallel\": {\"dp\": $n, \"tp\": 1, \"pp\": 1, \"ep\": 1, \"cp\": 1}, \"micro_batch\": 1, \"zero\": $z}" >"$tmp/plan.json"
    "$dw" dryrun gpt2-124m --hw h100-sxm --gpus $n --seq 256 --global-batch $((2 * n)) --plan "$tmp/plan.json" \
      >"$tmp/dry$n-$z" 2>&1
    check "dryrun dp$n zero$z" 0 $?
  done
  python3 - "$tmp/dry$n-0" "$tmp/dry$n-1" $n <<'PY' && ok "  ... dp$n: the optimizer per GPU is ZeRO-0's / $n" || bad "  ... dp$n optimizer memory"
import re, sys
opt = [float(re.search(r"optimizer ([0-9.]+)", open(p).read()).group(1)) for p in sys.argv[1:3]]
n = int(sys.argv[3])
assert abs(opt[1] - opt[0] / n) <= 0.006, opt  # GiB printed to 2 decimals
PY
done

[ "$fails" -eq 0 ] || exit 1
