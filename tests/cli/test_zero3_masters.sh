#!/usr/bin/env bash
# test_zero3_masters.sh DEEPWELL — ZeRO-3's FP32 masters sharded from engine creation (issue 28):
# `train --zero 3` on 2 and 4 CPU ranks makes each rank's engine allocate only its shard of the
# masters (no BF16 copies), initialised from the job's seed there. Each rank's log says so: the
# ranks' ranges tile the pool, the weights pool is the shard's floats 256-aligned, and the engine's
# pools in all are ZeRO-2's less the whole weights pool plus that shard (the same rank's line of a
# ZeRO-2 run). The weights are never whole on any rank: no rank logs making them whole again, and
# each checkpoint's weights are gathered into rank 0's host memory instead. Exact: the checkpoints
# (weights and every rank's moments) are ZeRO-1's and ZeRO-2's byte for byte on 2 ranks, FP32 and
# BF16; a 4-rank ZeRO-3 checkpoint of step 2 resumed on 4 ranks writes the uninterrupted run's
# step 4 byte for byte, resumed on 2 ranks under ZeRO-3 writes what ZeRO-2 resumed there writes,
# byte for byte (the global batch of 4 makes 2 micro-batches a rank, which ZeRO-2/3 reduce one by
# one and ZeRO-1 after both: test_zero3.sh's 1e-6), and on 2 ranks and on 1 continues the 4 ranks' losses (2e-6, the rank-count
# tolerance of test_ckpt_shards.sh: the reduction order changes with the ranks). A loss-spike
# rollback loads its checkpoint into the shards: ZeRO-2's rollbacks and step 40, byte for byte. The
# gathers prefetched one event step ahead (the default) write the bytes of gathering each just
# before its step (DW_Z3_PREFETCH=0); their step times are printed as a sanity check only.
set -u
dw=$1
. "$(dirname "$0")/zero_common.sh" # the tiny model and text, same_ckpt, close
run=(train --model "$tmp/model" --data "$tmp/text.txt" --seq 32 --steps 4 --lr 3e-3 --warmup 1 --eval-every 0
     --ckpt-every 2 --keep 0 --device cpu --seed $((RANDOM % 1000 + 1)) --batch 1)

# born LOG2 LOG3 RANKS: the engines' creation lines of a ZeRO-2 and a ZeRO-3 run, rank by rank
born() {
  python3 - "$@" <<'PY'
import re, sys
z2, z3, n = open(sys.argv[1]).read(), open(sys.argv[2]).read(), int(sys.argv[3])
total = lambda log: {int(m[1]): int(m[2]) for m in re.finditer(r"rank (\d+)/\d+\] engine: ZeRO-\d from creation: .*; "
                                                                r"(\d+) bytes of pools in all", log)}
t2, t3 = total(z2), total(z3)
got = {}
for m in re.finditer(r"rank (\d+)/(\d+)\] engine: ZeRO-3 from creation: FP32 masters of floats \[(\d+), (\d+)\) "
                     r"\((\d+) bytes; the whole weights pool (\d+)\)", z3):
    r, w, lo, hi, have, whole = map(int, m.groups())
    assert w == n and r not in got, m.group(0)
    assert have == -(-4 * (hi - lo) // 256) * 256 and have < whole, m.group(0)
    assert t3[r] == t2[r] - whole + have, (r, t2[r], t3[r], whole, have)
    got[r] = (lo, hi)
assert sorted(got) == list(range(n)) == sorted(t2) == sorted(t3), (sorted(got), sorted(t2), sorted(t3))
ranges = [got[r] for r in range(n)]
assert ranges[0][0] == 0 and all(ranges[r][1] == ranges[r + 1][0] for r in range(n - 1)), ranges
assert "whole weights on this rank again" not in z3, "a rank made its weights whole"
assert len(re.findall(r"rank 0/\d+\] ZeRO-3: the checkpoint's weights gathered into rank 0's host", z3)) == 2
assert "gathered into rank 0's host" not in re.sub(r".*rank 0/\d+\].*\n", "", z3), "another rank kept a host copy"
print(f"{n} ranks: masters {ranges}, pools {t3[0]} bytes on rank 0 (ZeRO-2: {t2[0]})")
PY
}

for n in 2 4; do
  for z in 2 3; do
    "$dw" launch -n $n -- "${run[@]}" --zero $z --out "$tmp/r$n-z$z" >/dev/null 2>"$tmp/err$n-$z"
    check "launch -n $n --zero $z" 0 $?
  done
  born "$tmp/err$n-2" "$tmp/err$n-3" $n && ok "  ... $n ranks: each engine holds its shard of the masters alone" ||
    bad "  ... $n ranks: masters at creation"
done
"$dw" launch -n 2 -- "${run[@]}" --zero 1 --out "$tmp/r2-z1" >/dev/null 2>&1
check "launch -n 2 --zero 1" 0 $?
for z in 1 2; do
  same_ckpt "$tmp/r2-z$z" "$tmp/r2-z3" && ok "  ... 2 ranks: ZeRO-3 writes ZeRO-$z's checkpoint byte for byte" ||
    bad "  ... 2 ranks: ZeRO-3 differs from ZeRO-$z"
done
close "$tmp/r2-z1/metrics.jsonl" "$tmp/r2-z3/metrics.jsonl" 0 && ok "  ... and ZeRO-1's losses exactly" ||
  bad "  ... losses differ from ZeRO-1's"

# BF16: no standing BF16 copies on the ranks, the same bytes as ZeRO-2
"$dw" launch -n 2 -- "${run[@]}" --precision bf16 --zero 2 --out "$tmp/b2" >/dev/null 2>"$tmp/errb2" &&
  "$dw" launch -n 2 -- "${run[@]}" --precision bf16 --zero 3 --out "$tmp/b3" >/dev/null 2>"$tmp/errb3"
check "BF16, 2 ranks: ZeRO-2 and ZeRO-3" 0 $?
born "$tmp/errb2" "$tmp/errb3" 2 >/dev/null && ok "  ... each engine holds its shard of the FP32 masters alone" ||
  bad "  ... BF16 masters at creation"
same_ckpt "$tmp/b2" "$tmp/b3" && ok "  ... byte for byte" || bad "  ... BF16 ZeRO-3 differs from ZeRO-2"

# resumes of the 4-rank ZeRO-3 checkpoint of step 2, each rank loading its shard of the masters
"$dw" launch -n 4 -- train --resume "$tmp/r4-z3/ckpt-2" --zero 3 --out "$tmp/s44" >/dev/null 2>&1
check "4-rank ZeRO-3 step 2 resumed on 4 ranks" 0 $?
same_ckpt "$tmp/r4-z3" "$tmp/s44" && ok "  ... the uninterrupted run's step 4 byte for byte" || bad "  ... 4 -> 4 differs"
"$dw" launch -n 2 -- train --resume "$tmp/r4-z3/ckpt-2" --zero 3 --out "$tmp/s423" >/dev/null 2>"$tmp/err" &&
  "$dw" launch -n 2 -- train --resume "$tmp/r4-z3/ckpt-2" --zero 2 --out "$tmp/s422" >/dev/null 2>&1
check "resumed on 2 ranks under ZeRO-3 and ZeRO-2" 0 $?
grep -q "rank 1/2\] engine: ZeRO-3 from creation: FP32 masters" "$tmp/err" && ok "  ... into the masters' shards" ||
  bad "  ... resumed engines not sharded"
same_ckpt "$tmp/s422" "$tmp/s423" && ok "  ... ZeRO-3 writes ZeRO-2's step 4 byte for byte" || bad "  ... 4 -> 2 stages differ"
close "$tmp/r4-z3/metrics.jsonl" "$tmp/s423/metrics.jsonl" 2e-6 2 && ok "  ... steps 3-4 as the 4 ranks ran them (2e-6)" ||
  bad "  ... 4 -> 2 losses"
"$dw" train --resume "$tmp/r4-z3/ckpt-2" --out "$tmp/s41" >/dev/null 2>&1
check "resumed on 1 rank" 0 $?
close "$tmp/r4-z3/metrics.jsonl" "$tmp/s41/metrics.jsonl" 2e-6 2 && ok "  ... steps 3-4 as the 4 ranks ran them (2e-6)" ||
  bad "  ... 4 -> 1 losses"

# the prefetch (DW_Z3_PREFETCH, on by default): the same bytes as gathering each step's parameters
# just before it; the step times of both printed, a sanity check only (CPU ranks on shared cores)
DW_Z3_PREFETCH=0 "$dw" launch -n 2 -- "${run[@]}" --steps 8 --zero 3 --out "$tmp/p0" >/dev/null 2>"$tmp/errp0" &&
  "$dw" launch -n 2 -- "${run[@]}" --steps 8 --zero 3 --out "$tmp/p1" >/dev/null 2>"$tmp/errp1"
check "2 ranks, ZeRO-3 without and with the prefetch" 0 $?
grep -q "rank 1/2\] ZeRO-3: gathers of [0-9]* event steps a micro-batch, each started at the event before" "$tmp/errp1" &&
  grep -q "rank 1/2\] ZeRO-3: gathers of [0-9]* event steps a micro-batch, each just before its step (DW_Z3_PREFETCH=0)" \
    "$tmp/errp0" && ok "  ... each says how it gathers" || bad "  ... prefetch log lines"
same_ckpt "$tmp/p0" "$tmp/p1" && ok "  ... byte for byte" || bad "  ... the prefetch changed the result"
python3 - "$tmp/p0/metrics.jsonl" "$tmp/p1/metrics.jsonl" <<'PY' || bad "  ... step times"
import json, sys
ms = []
for p in sys.argv[1:]:
    e = [json.loads(l)["elapsed_s"] for l in open(p) if '"loss"' in l]
    ms.append(1e3 * (e[-1] - e[1]) / (len(e) - 2)) # steps 3.. (the first two warm up)
assert all(m > 0 for m in ms), ms
print(f"ZeRO-3 step time on 2 CPU ranks (sanity only): {ms[0]:.2f} ms without the prefetch, {ms[1]:.2f} ms with it")
PY

# a loss-spike rollback loads its checkpoint into the shards (test_spike.sh's data: runs of random
# bytes in a repeated sentence spike the loss of a tiny Llama once it learned the sentence)
mkdir -p "$tmp/llama"
echo '{"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64}' >"$tmp/llama/config.json"
for i in $(seq 400); do # every 40th sentence followed by 64 random bytes of 128..255
  printf 'the quick brown fox jumps over the lazy dog. '
  [ $((i % 40)) = 0 ] && head -c 64 /dev/urandom | tr '\000-\177' '\200-\377'
done >"$tmp/spiky.txt"
spiky=(train --model "$tmp/llama" --data "$tmp/spiky.txt" --batch 2 --seq 32 --eval-every 0 --ckpt-minutes 0 --device cpu
       --lr 3e-3 --warmup 2 --seed 3 --ckpt-every 4 --keep 0 --steps 40 --spike-window 8 --spike-zscore 4 --max-rollbacks 100)
for z in 2 3; do
  "$dw" launch -n 2 -- "${spiky[@]}" --zero $z --out "$tmp/k$z" >"$tmp/k$z.out" 2>&1
  check "2 ranks, ZeRO-$z, with loss spikes" 0 $?
  grep "rank 0/2.*loss spike" "$tmp/k$z.out" | sed 's/.*loss spike//; s/rolled back to [^ ]*//' >"$tmp/k$z.spikes"
done
[ -s "$tmp/k3.spikes" ] && cmp -s "$tmp/k2.spikes" "$tmp/k3.spikes" &&
  ok "  ... ZeRO-3 rolls back where ZeRO-2 does ($(grep -c . "$tmp/k3.spikes") rollbacks)" || bad "  ... rollbacks differ"
for z in 2 3; do cp -r "$tmp/k$z/ckpt-40" "$tmp/k$z/ckpt-4"; done # same_ckpt compares ckpt-4
same_ckpt "$tmp/k2" "$tmp/k3" && ok "  ... and writes step 40 byte for byte" || bad "  ... step 40 differs"

[ "$fails" -eq 0 ] || exit 1
