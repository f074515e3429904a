#!/usr/bin/env bash
# test_spike.sh DEEPWELL — loss-spike rollback from the command line (docs/precision.md, "Loss
# spikes") on a tiny Llama on the CPU. The data: a text file of one sentence repeated, with runs
# of random bytes in it; the windows that land on them spike the loss once the model has learned
# the sentence. With --spike-zscore each spike rolls back to the newest checkpoint and its batch
# is skipped: stderr and metrics.jsonl name every rollback alike, the run finishes, and a run with
# --max-rollbacks 0 stops at the first spike (exit 1) naming the flag and the checkpoint. With 2
# ranks (`deepwell launch -n 2`) both ranks log the same rollbacks (the loss they test is their
# mean) and the job finishes. Bad flag values are refused naming the flag (exit 2).
# (test_spike_train.c checks the exact semantics: the step, the skipped batch, the final weights
# equal to a run that never saw the batch.)
set -u
bin=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1 DW_LOG=info DW_COMM_TIMEOUT=60
model=$tmp/llama
mkdir -p "$model"
echo '{"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64}' >"$model/config.json"
/usr/bin/python3 - "$tmp/data.txt" <<'PY'
import random, sys
random.seed(7)
out = bytearray()
for i in range(400):
    out += b"the quick brown fox jumps over the lazy dog. "
    if i % 40 == 39:
        out += bytes(random.randrange(128, 256) for _ in range(64))
open(sys.argv[1], "wb").write(out)
PY
common=(--model "$model" --data "$tmp/data.txt" --batch 2 --seq 32 --eval-every 0 --ckpt-minutes 0 --device cpu
  --lr 3e-3 --warmup 2 --seed 3 --ckpt-every 4 --steps 40 --spike-window 8 --spike-zscore 4)

"$bin" train "${common[@]}" --out "$tmp/one" --max-rollbacks 100 >"$tmp/one.out" 2>&1
check "a run with spikes" 0 $?
n=$(grep -c "loss spike .*rolled back to" "$tmp/one.out")
[ "$n" -ge 1 ] && ok "$n rollback(s) logged" || bad "no rollback: $(grep -v '^step' "$tmp/one.out" | tail -5)"
[ "$(grep -c '"rollback"' "$tmp/one/metrics.jsonl")" = "$n" ] && ok "  ... each in metrics.jsonl" ||
  bad "metrics.jsonl rollbacks: $(grep '"rollback"' "$tmp/one/metrics.jsonl")"
[ "$(grep -c "skipping the batch at data position" "$tmp/one.out")" = "$n" ] && ok "  ... each batch skipped" ||
  bad "skips: $(grep skipping "$tmp/one.out")"
has "  ... the final checkpoint" "$tmp/one/latest" "ckpt-40"
has "  ... state.json's spike window" "$tmp/one/ckpt-40/state.json" '"spike": {' '"window": [' '"0x1.'

"$bin" train "${common[@]}" --out "$tmp/stop" --max-rollbacks 0 >"$tmp/stop.out" 2>&1
check "--max-rollbacks 0 stops at the first spike" 1 $?
has "  ... naming the flag and the checkpoint" "$tmp/stop.out" "loss spike" "after 0 rollbacks (--max-rollbacks 0)" \
  "holds the last good state"

"$bin" launch -n 2 -- train "${common[@]}" --out "$tmp/dp" --max-rollbacks 100 >"$tmp/dp.out" 2>&1
check "2 ranks with spikes" 0 $?
grep "rank 0/2.*loss spike" "$tmp/dp.out" | sed 's/.*loss spike//; s/rolled back to .*//' >"$tmp/r0"
grep "rank 1/2.*loss spike" "$tmp/dp.out" | sed 's/.*loss spike//; s/rolled back to .*//' >"$tmp/r1"
[ -s "$tmp/r0" ] && cmp -s "$tmp/r0" "$tmp/r1" && ok "both ranks roll back alike ($(grep -c . "$tmp/r0"))" ||
  bad "rank 0: $(cat "$tmp/r0") rank 1: $(cat "$tmp/r1")"
[ "$(grep -c '"rollback"' "$tmp/dp/metrics.jsonl")" = "$(grep -c . "$tmp/r0")" ] && ok "  ... written once each" ||
  bad "2-rank metrics: $(grep -c '"rollback"' "$tmp/dp/metrics.jsonl")"

# --- refusals ------------------------------------------------------------------------------------
base=(--model "$model" --data builtin --batch 2 --seq 16 --device cpu --out "$tmp/r" --steps 1)
for bad_flag in "--spike-zscore -1" "--spike-zscore 0" "--spike-zscore x" "--spike-zscore 3 --spike-window 1" \
  "--spike-zscore 3 --max-rollbacks -1" "--spike-window 8" "--max-rollbacks 2" "--fp8-amax-history -1"; do
  # shellcheck disable=SC2086
  "$bin" train "${base[@]}" $bad_flag >"$tmp/r.out" 2>&1
  check "$bad_flag refused" 2 $?
  flag=$(echo "$bad_flag" | awk '{print $(NF-1)}')
  has "  ... naming $flag" "$tmp/r.out" "$flag"
done

[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all spike CLI checks passed"
