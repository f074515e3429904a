#!/usr/bin/env bash
# test_stderr_full.sh DEEPWELL — stderr is best effort, the exit status is the outcome: training
# whose stderr is /dev/full, or a pipe closed after one line (`2>&1 | head -1`), runs to the end
# and checkpoints (it used to die of SIGPIPE, status 141, after the first progress line); a refused
# command still exits 2 and a sample still prints its text with stderr full; a stdout pipe closed
# under training samples ends in the I/O status 3 after the run finished, not in a killed run.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
mkdir -p "$tmp/m"
echo '{"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}' \
  >"$tmp/m/config.json"
head -c 6000 "$0" >"$tmp/t.txt"
run=(--model "$tmp/m" --data "$tmp/t.txt" --batch 2 --seq 32 --steps 12 --ckpt-every 6 --log-every 1 --device cpu)

"$dw" train "${run[@]}" --out "$tmp/a" >/dev/null 2>/dev/full
check "train with stderr /dev/full" 0 $?
[ "$(cat "$tmp/a/latest" 2>/dev/null)" = ckpt-12 ] && ok "... ran to its last checkpoint" || bad "latest: $(cat "$tmp/a/latest" 2>&1)"

"$dw" train "${run[@]}" --out "$tmp/b" 2>&1 >/dev/null | head -1 >/dev/null
check "train with stderr into a pipe closed after one line" 0 "${PIPESTATUS[0]}"
[ "$(cat "$tmp/b/latest" 2>/dev/null)" = ckpt-12 ] && ok "... ran to its last checkpoint" || bad "latest: $(cat "$tmp/b/latest" 2>&1)"
cmp -s "$tmp/a/ckpt-12/model.safetensors" "$tmp/b/ckpt-12/model.safetensors" && ok "... the same weights" ||
  bad "the weights differ between the two runs"

"$dw" train "${run[@]}" --sample-every 2 --sample-tokens 200 --out "$tmp/c" 2>/dev/null | head -c 1 >/dev/null
check "train with its samples' stdout closed: the I/O status" 3 "${PIPESTATUS[0]}"
[ "$(cat "$tmp/c/latest" 2>/dev/null)" = ckpt-12 ] && ok "... after running to the end" || bad "latest: $(cat "$tmp/c/latest" 2>&1)"

"$dw" train "${run[@]}" --data "$tmp/missing.txt" --out "$tmp/d" >/dev/null 2>/dev/full
r=$?
"$dw" train "${run[@]}" --data "$tmp/missing.txt" --out "$tmp/e" >/dev/null 2>/dev/null
check "a refused train with stderr /dev/full keeps its status" $? $r
[ $r -ne 0 ] && ok "... which is not 0 ($r)" || bad "a missing --data exits 0"

"$dw" sample "$tmp/a" --prompt "ab" -n 10 --temperature 0 --device cpu >"$tmp/s1" 2>/dev/full
check "sample with stderr /dev/full" 0 $?
"$dw" sample "$tmp/a" --prompt "ab" -n 10 --temperature 0 --device cpu >"$tmp/s2" 2>/dev/null
cmp -s "$tmp/s1" "$tmp/s2" && [ -s "$tmp/s1" ] && ok "... prints its text all the same" || bad "sample text differs"
exit $((fails > 0))
