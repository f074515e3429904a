#!/usr/bin/env bash
# test_resume_sampling.sh DEEPWELL — `deepwell train --resume RUN` keeps the run's sampling flags
# (--sample-every/-tokens/-temp/-prompt, recorded in RUN/sampling.json) unless given again: the
# resumed run samples at the recorded cadence, length, temperature and prompt, and its greedy
# sample equals the uninterrupted run's at the same step; a given flag wins and is marked given; a
# damaged sampling.json is refused naming it.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
mkdir -p "$tmp/model"
echo '{"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}' \
  >"$tmp/model/config.json"
head -c 6000 "$0" >"$tmp/text.txt"
run=(--model "$tmp/model" --data "$tmp/text.txt" --batch 2 --seq 32 --lr 3e-3 --schedule constant --ckpt-every 2
     --keep 0 --seed 5 --device cpu --sample-every 3 --sample-tokens 7 --sample-temp 0 --sample-prompt "ab")
sample_at() { # sample_at FILE STEP: the sample printed after STEP
  awk -v s="--- sample after step $2 ---" '$0 == s {getline; print; exit}' "$1"
}

"$dw" train "${run[@]}" --steps 6 --out "$tmp/full" >"$tmp/full.out" 2>/dev/null
check "uninterrupted run" 0 $?
"$dw" train "${run[@]}" --steps 2 --out "$tmp/a" >/dev/null 2>&1
check "first part" 0 $?
[ -f "$tmp/a/sampling.json" ] && ok "sampling.json written" || bad "no $tmp/a/sampling.json"
has "sampling.json holds the flags" "$tmp/a/sampling.json" '"sample_every": 3' '"sample_tokens": 7' \
  '"sample_prompt": "ab"'

"$dw" train --resume "$tmp/a" --steps 6 >"$tmp/res.out" 2>"$tmp/res.err"
check "resume alone" 0 $?
has "the summary names the sampling" "$tmp/res.err" "samples every 3 steps: 7 tokens at temperature 0, prompt ab"
s_full=$(sample_at "$tmp/full.out" 6) s_res=$(sample_at "$tmp/res.out" 6)
[ -n "$s_res" ] && ok "the resumed run samples at step 6" || bad "no sample after step 6: $(head -c 300 "$tmp/res.out")"
[ "${#s_res}" = 9 ] && ok "prompt + 7 tokens" || bad "sample '$s_res' is not 2 + 7 bytes"
[ "${s_res:0:2}" = ab ] && ok "the recorded prompt" || bad "sample '$s_res' does not start with ab"
[ "$s_full" = "$s_res" ] && ok "greedy sample = the uninterrupted run's" || bad "'$s_res' vs '$s_full'"
grep -q "sample after step 3" "$tmp/res.out" && ok "cadence 3 kept" || bad "no sample at step 3"

"$dw" train --resume "$tmp/a" --steps 8 --sample-tokens 3 >"$tmp/g.out" 2>"$tmp/g.err"
check "resume with --sample-tokens 3" 0 $?
s=$(sample_at "$tmp/g.out" 8)
[ "${#s}" = 5 ] && ok "the given length wins" || bad "sample '$s' is not 2 + 3 bytes"
has "... and is marked given" "$tmp/g.err" "3 tokens at temperature 0, prompt ab (given)"

echo '{"sample_every": -1, "sample_tokens": 7, "sample_temp": 0, "sample_prompt": null}' >"$tmp/a/sampling.json"
"$dw" train --resume "$tmp/a" --steps 10 >/dev/null 2>"$tmp/bad.err"
r=$?
[ $r -ne 0 ] && ok "a damaged sampling.json is refused (exit $r)" || bad "a damaged sampling.json was accepted"
has "... naming it" "$tmp/bad.err" "a/sampling.json"
exit $((fails > 0))
