#!/usr/bin/env bash
# test_ckpt_time.sh DEEPWELL — a time-based checkpoint cadence by default (every 30 minutes of wall
# time), so no run loses more than a bounded amount of work; --ckpt-minutes M changes it
# (fractions allowed), 0 turns it off; --ckpt-every still works beside it (issue 32, finding 3).
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
tiny_gpt2 "$tmp/model"
common=(--model "$tmp/model" --data builtin --batch 4 --seq 32 --device cpu --eval-every 0 --keep 0 --steps 40)
ckpts() { (cd "$1" && ls -d ckpt-* 2>/dev/null | sort -t- -k2 -n | tr '\n' ' '); }

"$dw" train --help >"$tmp/help"; has "--help documents --ckpt-minutes and its default" "$tmp/help" "--ckpt-minutes M" "(30)"
# a tiny interval (0.0005 minutes = 30 ms): checkpoints appear between steps, not only at the end
"$dw" train "${common[@]}" --ckpt-minutes 0.0005 --out "$tmp/t" >/dev/null 2>"$tmp/err"
check "--ckpt-minutes 0.0005" 0 $?
n=$(ls -d "$tmp/t"/ckpt-* | wc -l)
[ "$n" -ge 3 ] && ok "  ... checkpoints on the clock: $(ckpts "$tmp/t")" || bad "  ... only $(ckpts "$tmp/t")"
"$dw" train --resume "$tmp/t" --steps 41 >/dev/null 2>&1; check "  ... and the newest resumes" 0 $?
# off, and the default (a run of seconds is far from 30 minutes): only the end
"$dw" train "${common[@]}" --ckpt-minutes 0 --out "$tmp/off" >/dev/null 2>&1; check "--ckpt-minutes 0" 0 $?
[ "$(ckpts "$tmp/off")" = "ckpt-40 " ] && ok "  ... only the end" || bad "  ... $(ckpts "$tmp/off")"
"$dw" train "${common[@]}" --out "$tmp/def" >/dev/null 2>&1; check "the default (30 minutes)" 0 $?
[ "$(ckpts "$tmp/def")" = "ckpt-40 " ] && ok "  ... only the end in a short run" || bad "  ... $(ckpts "$tmp/def")"
# --ckpt-every beside it: the step cadence, untouched
"$dw" train "${common[@]}" --ckpt-every 15 --out "$tmp/every" >/dev/null 2>&1; check "--ckpt-every 15" 0 $?
[ "$(ckpts "$tmp/every")" = "ckpt-15 ckpt-30 ckpt-40 " ] && ok "  ... 15, 30 and the end" || bad "  ... $(ckpts "$tmp/every")"
for bad_value in -1 abc nan 1e9; do
  "$dw" train "${common[@]}" --ckpt-minutes "$bad_value" --out "$tmp/x" >/dev/null 2>"$tmp/err"
  check "--ckpt-minutes $bad_value is refused" 2 $?
done
has "  ... naming the flag" "$tmp/err" "--ckpt-minutes"
echo "$fails failed"
[ $fails -eq 0 ]
