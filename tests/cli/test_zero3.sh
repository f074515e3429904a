#!/usr/bin/env bash
# test_zero3.sh DEEPWELL — ZeRO-3 / FSDP on CPU ranks (issue 28): each rank keeps the FP32 masters
# of its shard and gathers every parameter just before the first step of the forward (and again of
# the backward) that reads it. Bit-identical, not merely close: the gathered parameters are exact
# copies, the gradients reduce as ZeRO-2's and the shard steps as ZeRO-2's, so 2 ranks under ZeRO-3
# write ZeRO-2's checkpoints byte for byte (with clipping) and 4 ranks ZeRO-0's without clipping (as
# ZeRO-2 does: tests/cli/test_zero_mem.sh), and ZeRO-2's under --recompute full (the forwards run
# again in the backward sweep read gathered parameters) and under --recompute selective; with
# accumulation, validation and rank 0's samples the losses are ZeRO-0's within 1e-6 (ZeRO-2's tolerance in test_dp.sh: the global norm is
# summed in another order). Each rank logs its weights memory, smaller than the whole pool. Checkpoints resume
# across stages and world sizes: ZeRO-3 -> ZeRO-1, ZeRO-1 -> ZeRO-3, 4 ranks -> 2 and -> 1, with the
# losses of the run they left (2e-6). A BF16 program (each parameter's working copy made in its
# slot after the gather) writes ZeRO-2's bytes too; a quantised one is refused by name.
set -u
dw=$1
. "$(dirname "$0")/zero_common.sh" # the tiny model and text, same_ckpt, close
tail -c 3000 "$(dirname "$0")/test_dp.sh" >"$tmp/val.txt"
run=(train --model "$tmp/model" --data "$tmp/text.txt" --seq 32 --steps 4 --lr 3e-3 --warmup 1 --eval-every 0
     --ckpt-every 2 --keep 0 --device cpu --seed 11 --batch 1)


"$dw" launch -n 2 -- "${run[@]}" --zero 2 --out "$tmp/z2" >/dev/null 2>&1 &&
  "$dw" launch -n 2 -- "${run[@]}" --zero 3 --out "$tmp/z3" >/dev/null 2>"$tmp/err3"
check "launch -n 2: ZeRO-2 and ZeRO-3" 0 $?
same_ckpt "$tmp/z2" "$tmp/z3" && close "$tmp/z2/metrics.jsonl" "$tmp/z3/metrics.jsonl" 0 &&
  ok "  ... ZeRO-3 writes ZeRO-2's weights and moments byte for byte, the same losses" || bad "  ... ZeRO-3 differs from ZeRO-2"
python3 - "$tmp/err3" 2 <<'PY' && ok "  ... each rank holds its shard of the weights plus the gather block, less than the whole" || bad "  ... weights memory"
import re, sys
log, n = open(sys.argv[1]).read(), int(sys.argv[2])
got = {}
for m in re.finditer(r"rank (\d+)/\d+\] ZeRO-3: weights of floats \[(\d+), (\d+)\) plus (\d+) bytes gathered around their "
                     r"use: (\d+) bytes on this rank \((\d+) whole\)", log):
    r, lo, hi, gather, have, whole = map(int, m.groups())
    assert have == -(-4 * (hi - lo) // 256) * 256 + gather and have < whole and gather > 0, m.group(0)
    got[r] = (lo, hi)
assert sorted(got) == list(range(n)), got
print("weights per rank:", re.findall(r"rank \d+/\d+\] ZeRO-3: weights.*", log)[0])
PY

"$dw" launch -n 4 -- "${run[@]}" --clip 0 --zero 0 --out "$tmp/c0" >/dev/null 2>&1 &&
  "$dw" launch -n 4 -- "${run[@]}" --clip 0 --zero 3 --out "$tmp/c3" >/dev/null 2>&1
check "launch -n 4 --clip 0: ZeRO-0 and ZeRO-3" 0 $?
same_ckpt "$tmp/c0" "$tmp/c3" && ok "  ... ZeRO-0's weights and moments byte for byte" || bad "  ... 4-rank ZeRO-3 differs from ZeRO-0"

# full recompute: the forwards run again inside the backward sweep read gathered parameters too
"$dw" launch -n 2 -- "${run[@]}" --recompute full --zero 2 --out "$tmp/f2" >/dev/null 2>&1 &&
  "$dw" launch -n 2 -- "${run[@]}" --recompute full --zero 3 --out "$tmp/f3" >/dev/null 2>&1
check "ZeRO-2 and ZeRO-3 with --recompute full" 0 $?
same_ckpt "$tmp/f2" "$tmp/f3" && ok "  ... byte for byte" || bad "  ... ZeRO-3 with recompute differs from ZeRO-2"
# selective recompute: the norms run again in the backward read their gathered weights; the same
# bytes as ZeRO-2 without recompute
"$dw" launch -n 2 -- "${run[@]}" --recompute selective --zero 3 --out "$tmp/s3" >/dev/null 2>&1
check "ZeRO-3 with --recompute selective" 0 $?
same_ckpt "$tmp/z2" "$tmp/s3" && ok "  ... ZeRO-2's bytes without recompute" || bad "  ... ZeRO-3 with selective recompute differs"

# accumulation 2, validation every 2 steps, rank 0 samples (the weights whole for it, then sharded again)
acc=(--global-batch 4 --val "$tmp/val.txt" --eval-every 2 --eval-batches 2)
"$dw" launch -n 2 -- "${run[@]}" "${acc[@]}" --zero 0 --out "$tmp/a0" >/dev/null 2>&1 &&
  "$dw" launch -n 2 -- "${run[@]}" "${acc[@]}" --zero 3 --sample-every 2 --sample-tokens 8 --out "$tmp/a3" \
    >"$tmp/out" 2>"$tmp/err"
check "ZeRO-0 and ZeRO-3 with accumulation, validation and samples" 0 $?
close "$tmp/a0/metrics.jsonl" "$tmp/a3/metrics.jsonl" 1e-6 && ok "  ... the same losses and validation losses (1e-6)" ||
  bad "  ... ZeRO-3 with accumulation"
[ "$(grep -c '"val_loss"' "$tmp/a3/metrics.jsonl")" = 2 ] && grep -q "^--- sample after step 2 ---" "$tmp/out" &&
  grep -q "^--- sample after step 4 ---" "$tmp/out" && ok "  ... validated twice and sampled at steps 2 and 4" ||
  bad "  ... validation or samples missing: $(tail -3 "$tmp/err")"

# resumes across stages and world sizes (test_ckpt_shards.sh's tolerance across rank counts)
"$dw" launch -n 2 -- train --resume "$tmp/z3/ckpt-2" --zero 1 --out "$tmp/r31" >/dev/null 2>&1
check "a ZeRO-3 checkpoint resumed under ZeRO-1" 0 $?
close "$tmp/z3/metrics.jsonl" "$tmp/r31/metrics.jsonl" 2e-6 2 && ok "  ... steps 3-4 as before (2e-6)" || bad "  ... 3 -> 1"
"$dw" launch -n 2 -- "${run[@]}" --zero 1 --out "$tmp/z1" >/dev/null 2>&1 &&
  "$dw" launch -n 2 -- train --resume "$tmp/z1/ckpt-2" --zero 3 --out "$tmp/r13" >/dev/null 2>&1
check "a ZeRO-1 checkpoint resumed under ZeRO-3" 0 $?
close "$tmp/z1/metrics.jsonl" "$tmp/r13/metrics.jsonl" 2e-6 2 && ok "  ... steps 3-4 as before (2e-6)" || bad "  ... 1 -> 3"
"$dw" launch -n 2 -- train --resume "$tmp/c3/ckpt-2" --zero 3 --out "$tmp/r42" >/dev/null 2>&1
check "a 4-rank ZeRO-3 checkpoint resumed on 2 ranks, ZeRO-3" 0 $?
close "$tmp/c3/metrics.jsonl" "$tmp/r42/metrics.jsonl" 2e-6 2 && ok "  ... steps 3-4 as the 4 ranks ran them (2e-6)" ||
  bad "  ... 4 -> 2"
"$dw" train --resume "$tmp/c3/ckpt-2" --out "$tmp/r41" >/dev/null 2>&1
check "a 4-rank ZeRO-3 checkpoint resumed on 1 rank" 0 $?
close "$tmp/c3/metrics.jsonl" "$tmp/r41/metrics.jsonl" 2e-6 2 && ok "  ... steps 3-4 as the 4 ranks ran them (2e-6)" ||
  bad "  ... 4 -> 1"

# BF16: the working copies made in the slots (the backend's cast, as the refresh makes them whole)
"$dw" launch -n 2 -- "${run[@]}" --precision bf16 --zero 2 --out "$tmp/b2" >/dev/null 2>&1 &&
  "$dw" launch -n 2 -- "${run[@]}" --precision bf16 --zero 3 --out "$tmp/b3" >/dev/null 2>"$tmp/err"
check "ZeRO-2 and ZeRO-3 of a BF16 program" 0 $?
same_ckpt "$tmp/b2" "$tmp/b3" && ok "  ... byte for byte" || bad "  ... BF16 ZeRO-3 differs from ZeRO-2"
"$dw" launch -n 2 -- "${run[@]}" --precision fp8_block --zero 3 --out "$tmp/q3" >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && ok "ZeRO-3 of a quantised program refused" || bad "ZeRO-3 ran a quantised program"
has "  ... by name" "$tmp/err" "--zero 3 runs FP32 and BF16 programs: program 'fp8_block' quantises"

[ "$fails" -eq 0 ] || exit 1
