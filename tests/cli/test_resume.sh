#!/usr/bin/env bash
# test_resume.sh DEEPWELL — `deepwell train --resume RUN` alone continues with everything the run
# recorded (data, validation, schedule, optimizer, batch shape, precision, eval and checkpoint
# cadence, seed, device) and says so; a contradicting flag is refused naming both values; --steps
# extends with the schedule's horizon kept (the steps beyond it at min-lr); records written
# before the run record still resume, with a note (issue 32, finding 2); state.json carries its own
# CRC-32, and a flipped bit is refused naming the file (finding 8).
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
mkdir -p "$tmp/model"
cat >"$tmp/model/config.json" <<'JSON'
{"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}
JSON
head -c 6000 "$0" >"$tmp/text.txt"
head -c 3000 "$0" | tail -c 2000 >"$tmp/val.txt"
cd "$tmp" # relative --data and --val: the record keeps them absolute
run=(--model "$tmp/model" --data text.txt --val ./val.txt --batch 2 --seq 32 --global-batch 4 --lr 3e-3
     --min-lr 2e-4 --warmup 2 --schedule linear --weight-decay 0.05 --clip 0.5 --beta2 0.99 --eval-every 3
     --eval-batches 2 --ckpt-every 4 --keep 0 --precision fp8_block --seed 77 --device cpu)
"$dw" train "${run[@]}" --steps 8 --out "$tmp/a" >/dev/null 2>&1
check "8 steps with every setting away from its default" 0 $?
"$dw" train "${run[@]}" --steps 4 --out "$tmp/b" >/dev/null 2>&1
check "the same run stopped at 4" 0 $?

# --resume RUN alone: the same losses, learning rates and validation as the straight run
cd /
"$dw" train --resume "$tmp/b/ckpt-4" --steps 8 --out "$tmp/b" >/dev/null 2>"$tmp/err"
check "resume with --resume, --steps and --out only (from another directory)" 0 $?
has "  ... prints what it restored" "$tmp/err" "resuming $tmp/b/ckpt-4 at step 4 of 4" \
  "data $tmp/text.txt, validation $tmp/val.txt; batch 2 x seq 32, global batch 4; seed 77" \
  "schedule linear: lr 0.003 -> min-lr 0.0002, warmup 2, ends at step 4" "weight decay 0.05, clip 0.5" \
  "betas 0.9/0.99" "precision fp8_block; device cpu; eval every 3 (2 batches); checkpoint every 4, keep 0"
python3 - "$tmp/a/metrics.jsonl" "$tmp/b/metrics.jsonl" "$tmp/b/ckpt-8/state.json" <<'PY' && ok "  ... schedule, validation and precision restored" || bad "  ... restored settings"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
s = json.load(open(sys.argv[3]))
assert [x["step"] for x in b] == list(range(1, 9)), b
# the straight run's schedule ends at 8, the resumed one's at 4 (its record): the same losses up
# to 4 (the learning rate of step 4 acts after its loss)
assert [x["loss"] for x in a[:4]] == [x["loss"] for x in b[:4]], (a[:4], b[:4])
for x in b[3:]:
    assert abs(x["lr"] - 2e-4) < 1e-15, x  # from the recorded horizon on: min-lr
assert "val_loss" in b[5] and "val_loss" in b[7] and "val_loss" not in b[6], b  # eval every 3 and at the end
assert s["precision"] == "fp8_block" and s["schedule"]["total"] == 4 and s["total_steps"] == 8, s
assert s["run"] == {"val": sys.argv[3].rsplit("/b/", 1)[0] + "/val.txt", "eval_every": 3, "eval_batches": 2,
                    "ckpt_every": 4, "keep": 0, "device": "cpu"}, s["run"]
PY
[ -d "$tmp/b/ckpt-4" ] && [ -d "$tmp/b/ckpt-8" ] && ok "  ... checkpoint cadence and --keep 0 restored" ||
  bad "  ... checkpoints: $(ls "$tmp/b")"

# --steps extends: the schedule keeps its horizon, and says how
"$dw" train --resume "$tmp/a" --steps 10 >/dev/null 2>"$tmp/err"
check "--steps 10 extends the 8-step run in its directory" 0 $?
has "  ... says how" "$tmp/err" "steps: to 10, beyond the schedule's end: it keeps its shape (ending at step 8) and steps 9-10 run at min-lr 0.0002"
python3 -c 'import json,sys; m=[json.loads(l) for l in open(sys.argv[1])]; assert len(m) == 10 and all(abs(x["lr"] - 2e-4) < 1e-15 for x in m[7:]), m[-3:]' \
  "$tmp/a/metrics.jsonl" && ok "  ... steps 9-10 at min-lr" || bad "  ... extended learning rates"

# flags that contradict the record are refused, naming both values; nothing is written
refuse() { # refuse DESCRIPTION TEXT FLAGS...
  local d=$1 t=$2; shift 2
  "$dw" train --resume "$tmp/a" --steps 12 "$@" >/dev/null 2>"$tmp/err"
  check "refused: $d" 2 $?
  has "  ... naming both values" "$tmp/err" "$t"
}
refuse "--lr" "trained with --lr 0.003; --lr 0.001 contradicts it" --lr 1e-3
refuse "--min-lr" "trained with --min-lr 0.0002; --min-lr 0.0001 contradicts it" --min-lr 1e-4
refuse "--warmup" "trained with --warmup 2; --warmup 10 contradicts it" --warmup 10
refuse "--schedule" "trained with --schedule linear; --schedule cosine contradicts it" --schedule cosine
refuse "--val" "trained with --val $tmp/val.txt; --val $tmp/text.txt contradicts it" --val "$tmp/text.txt"
refuse "--data" "trained with --data $tmp/text.txt; --data builtin contradicts it" --data builtin
refuse "--eval-every" "trained with --eval-every 3; --eval-every 50 contradicts it" --eval-every 50
refuse "--ckpt-every" "trained with --ckpt-every 4; --ckpt-every 0 contradicts it" --ckpt-every 0
refuse "--seq" "trained with --seq 32; --seq 16 contradicts it" --seq 16
refuse "--weight-decay" "trained with --weight-decay 0.05; --weight-decay 0.1 contradicts it" --weight-decay 0.1
refuse "--seed" "trained with --seed 77; --seed 1337 contradicts it" --seed 1337
refuse "--precision" "trained in precision fp8_block" --precision bf16
refuse "--model" "drop --model" --model "$tmp/model"
[ "$(wc -l <"$tmp/a/metrics.jsonl")" = 10 ] && [ "$(cat "$tmp/a/latest")" = ckpt-10 ] && ok "  ... and nothing written" ||
  bad "a refused resume wrote to the run"
# flags meant to change: --keep, sampling, logging; the same value as recorded is fine
"$dw" train --resume "$tmp/a" --steps 11 --keep 2 --lr 3e-3 --precision fp8_block --log-every 5 --sample-every 0 \
  >/dev/null 2>"$tmp/err"
check "--keep, logging and flags equal to the record are accepted" 0 $?
[ "$(ls -d "$tmp/a"/ckpt-* | wc -l)" = 2 ] && ok "  ... --keep 2 took effect" || bad "  ... checkpoints: $(ls "$tmp/a")"
# a checkpoint that is not its run's newest needs --out (resuming into its run would rewrite it)
"$dw" train --resume "$tmp/b/ckpt-4" --steps 8 >/dev/null 2>"$tmp/err"
check "an older checkpoint without --out" 2 $?
has "  ... says why" "$tmp/err" "--out is needed"
# a finished run: nothing to do, and it says so
"$dw" train --resume "$tmp/a" >/dev/null 2>"$tmp/err"
check "resuming a finished run" 0 $?
has "  ... says how to extend it" "$tmp/err" "nothing to run" "--steps N"

# a record written before runs recorded validation and cadence still resumes, with a note
cp -r "$tmp/a/ckpt-11" "$tmp/old"
python3 -c 'import json,sys; p=sys.argv[1]; s=json.load(open(p)); del s["run"], s["state_crc32"]
s["format_version"] = 1; json.dump(s, open(p, "w"), indent=2)' "$tmp/old/state.json"
"$dw" train --resume "$tmp/old" --steps 12 --out "$tmp/oldrun" --eval-every 0 >/dev/null 2>"$tmp/err"
check "an older record (no \"run\") resumes" 0 $?
has "  ... with a note" "$tmp/err" "written before runs recorded validation" "come from this command line"
has "  ... and a note that its state.json has no checksum of its own" "$tmp/err" \
  "$tmp/old/state.json: format_version 1 has no \"state_crc32\""

# state.json checks itself: its "state_crc32" is the CRC-32 of its bytes with those digits as zeros
python3 - "$tmp/a/ckpt-11/state.json" <<'PY' && ok "state.json's state_crc32 is its own CRC-32" || bad "state_crc32"
import json, re, sys, zlib
b = open(sys.argv[1], "rb").read(); s = json.loads(b)
assert s["format_version"] == 2 and list(s)[-1] == "state_crc32", s
z = re.sub(rb'"state_crc32": "[0-9a-f]{8}"', b'"state_crc32": "00000000"', b)
assert "%08x" % zlib.crc32(z) == s["state_crc32"], (s["state_crc32"], "%08x" % zlib.crc32(z))
PY
# one flipped bit anywhere (a number, a key, the checksum itself, the format version) is refused by name
n=$(wc -c <"$tmp/a/ckpt-11/state.json")
for at in value:'"lr": ' value:'"position": "0x' value:'"step": ' key:'"state_crc32"' value:'"state_crc32": "' \
          value:'"format_version": ' key:'"files"' end:$((n - 3)) end:20; do
  rm -rf "$tmp/flip" && cp -r "$tmp/a/ckpt-11" "$tmp/flip"
  python3 - "$tmp/flip/state.json" "$at" <<'PY'
import sys
p, at = sys.argv[1], sys.argv[2]; b = bytearray(open(p, "rb").read())
kind, what = at.split(":", 1)
i = int(what) if kind == "end" else b.index(what.encode()) + (len(what) if kind == "value" else 3)
b[i] ^= 0x01 if chr(b[i]) not in "0123456789" else 0x02  # a digit stays a digit where it can
open(p, "wb").write(b)
PY
  "$dw" train --resume "$tmp/flip" --steps 12 --out "$tmp/flipout" >/dev/null 2>"$tmp/err"
  check "state.json with one bit flipped at $at is refused" 2 $?
  has "  ... naming it" "$tmp/err" "$tmp/flip/state.json"
  case $at in value:'"lr": ') has "  ... by its own CRC-32" "$tmp/err" "but its \"state_crc32\" records" "corrupt" ;; esac
done
# garbage in `latest` is refused with its bytes escaped
mkdir -p "$tmp/junk" && printf 'ckpt-\001\033[2J\xff' >"$tmp/junk/latest"
"$dw" train --resume "$tmp/junk" >/dev/null 2>"$tmp/err"
check "a garbage latest file" 2 $?
has "  ... escaped" "$tmp/err" 'got "ckpt-\x01\x1b[2J\xff"'
echo "$fails failed"
[ $fails -eq 0 ]
