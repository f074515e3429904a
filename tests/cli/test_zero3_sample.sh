#!/usr/bin/env bash
# test_zero3_sample.sh DEEPWELL — samples from ZeRO-3's shards (issue 28): `train --zero 3
# --sample-every 2` on 2 and 4 CPU ranks prints, after steps 2 and 4, the text ZeRO-0's run of the
# same seed prints, byte for byte (FP32, and BF16 on 4 ranks): 64 tokens after an 8-token prompt
# at seq 32, so the sample runs past the program's window. ZeRO-0's rank 0 decodes with the K/V
# cache; under ZeRO-3 every rank recomputes each token's forward, which gathers every parameter
# into its gather slot as it reaches it. The weights are never whole on any rank: each rank's
# closing line says its weights pool was at most the shard plus the gather block (the size its
# sharding line gives, below the whole weights pool) and made whole 0 times. Also a mixture of
# experts (qwen3-moe-tiny) with a prompt and validation on 2 ranks, its samples ZeRO-0's.
set -u
dw=$1
. "$(dirname "$0")/zero_common.sh" # the tiny model and text
run=(train --model "$tmp/model" --data "$tmp/text.txt" --seq 32 --steps 4 --lr 3e-3 --warmup 1 --eval-every 0
     --ckpt-every 0 --keep 0 --device cpu --seed $((RANDOM % 1000 + 1)) --batch 1 --sample-every 2)

# shard LOG RANKS: every rank's weights pool at its largest = its sharded pool < the whole, made whole 0 times
shard() {
  python3 - "$@" <<'PY'
import re, sys
log, n = open(sys.argv[1]).read(), int(sys.argv[2])
pool = {int(m[1]): int(m[2]) for m in re.finditer(r"rank (\d+)/\d+\] ZeRO-3: weights of floats \[\d+, \d+\) plus \d+ "
                                                  r"bytes gathered around their use: (\d+) bytes on this rank", log)}
peak = {}
for m in re.finditer(r"rank (\d+)/\d+\] ZeRO-3: this rank's weights pool at most (\d+) bytes \(the whole weights "
                     r"(\d+)\), made whole (\d+) times", log):
    r, most, whole, made = map(int, m.groups())
    assert made == 0, m.group(0)
    assert most == pool[r] < whole, (m.group(0), pool.get(r))
    peak[r] = most
assert sorted(peak) == sorted(pool) == list(range(n)), (sorted(peak), sorted(pool))
assert "whole weights on this rank again" not in log, "a rank made its weights whole"
gen = re.findall(r"rank (\d+)/\d+\] generate: 64 tokens after 8, full recompute per token, the ZeRO-3 shard's", log)
assert sorted(gen) == sorted([str(r) for r in range(n)] * 2), gen # every rank, both samples
print(f"{n} ranks: weights pool at most {peak[0]} bytes on rank 0 (whole: {whole})")
PY
}

for n in 2 4; do
  for z in 0 3; do
    DW_LOG=debug "$dw" launch -n $n -- "${run[@]}" --zero $z --out "$tmp/r$n-z$z" >"$tmp/out$n-$z" 2>"$tmp/err$n-$z"
    check "launch -n $n --zero $z --sample-every 2" 0 $?
  done
  [ "$(grep -c -- '^--- sample after step' "$tmp/out$n-3")" = 2 ] && ok "  ... two samples" ||
    bad "  ... samples: $(cat "$tmp/out$n-3")"
  cmp -s "$tmp/out$n-0" "$tmp/out$n-3" && ok "  ... $n ranks: ZeRO-3's samples are ZeRO-0's byte for byte" ||
    bad "  ... $n ranks: samples differ: $(diff "$tmp/out$n-0" "$tmp/out$n-3")"
  grep -q "rank 0/$n\] generate: 64 tokens after 8, KV cache" "$tmp/err$n-0" && ok "  ... ZeRO-0 with the K/V cache" ||
    bad "  ... ZeRO-0 did not use the cache"
  shard "$tmp/err$n-3" $n && ok "  ... $n ranks: no rank's weights ever whole" || bad "  ... $n ranks: weights made whole"
done
# the two samples of a run differ (the comparison above is not of constant text)
awk '/^--- sample after step 2 ---$/ { f = 1; next } /^---$/ { f = 0 } f' "$tmp/out2-3" >"$tmp/s2"
awk '/^--- sample after step 4 ---$/ { f = 1; next } /^---$/ { f = 0 } f' "$tmp/out2-3" >"$tmp/s4"
[ -s "$tmp/s2" ] && ! cmp -s "$tmp/s2" "$tmp/s4" && ok "the samples after steps 2 and 4 differ" || bad "constant samples"

for z in 0 3; do
  DW_LOG=debug "$dw" launch -n 4 -- "${run[@]}" --precision bf16 --zero $z --out "$tmp/b$z" >"$tmp/bout$z" 2>"$tmp/berr$z"
  check "BF16, 4 ranks, --zero $z" 0 $?
done
[ -s "$tmp/bout3" ] && cmp -s "$tmp/bout0" "$tmp/bout3" && ok "  ... ZeRO-3's samples are ZeRO-0's byte for byte" ||
  bad "  ... BF16 samples differ: $(diff "$tmp/bout0" "$tmp/bout3")"
shard "$tmp/berr3" 4 && ok "  ... no rank's weights ever whole" || bad "  ... BF16 weights made whole"

# a mixture of experts with RoPE and per-head norms, a prompt and validation between the samples
moe=(train --model qwen3-moe-tiny --data "$tmp/text.txt" --seq 32 --steps 4 --lr 3e-3 --warmup 1 --eval-every 2
     --ckpt-every 0 --keep 0 --device cpu --seed $((RANDOM % 1000 + 1)) --batch 1 --sample-every 2 --sample-prompt "the")
for z in 0 3; do
  DW_LOG=debug "$dw" launch -n 2 -- "${moe[@]}" --zero $z --out "$tmp/m$z" >"$tmp/mout$z" 2>"$tmp/merr$z"
  check "qwen3-moe-tiny, 2 ranks, --zero $z, a prompt" 0 $?
done
[ "$(grep -c -- '^--- sample after step' "$tmp/mout3")" = 2 ] && cmp -s "$tmp/mout0" "$tmp/mout3" &&
  ok "  ... ZeRO-3's samples are ZeRO-0's byte for byte" || bad "  ... MoE samples differ: $(diff "$tmp/mout0" "$tmp/mout3")"
grep "rank [01]/2\] ZeRO-3: this rank's weights pool at most" "$tmp/merr3" | grep -c "made whole 0 times" | grep -qx 2 &&
  ok "  ... no rank's weights ever whole" || bad "  ... MoE weights made whole"

[ "$fails" -eq 0 ] || exit 1
