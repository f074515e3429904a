#!/usr/bin/env bash
# test_refusals.sh DEEPWELL — inputs refused before harm (issue 32, finding 8): `quantize X X`
# (the same file by any path) unless --in-place; --min-lr above --lr and --sample-temp -1; a FIFO
# or other non-regular file as --data, --policy, config.json, --hw, a safetensors file or shard,
# refused at once by name instead of hanging; garbage bytes from a
# `latest` file echoed escaped; a damaged latest checkpoint names the newest good one and how to
# resume from it.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
tiny_gpt2 "$tmp/model"
common=(--model "$tmp/model" --data builtin --batch 2 --seq 16 --device cpu)
"$dw" train "${common[@]}" --steps 4 --ckpt-every 2 --out "$tmp/run" >/dev/null 2>&1
check "a run with checkpoints at 2 and 4" 0 $?

# --- quantize onto its own input ------------------------------------------------------------------
cp "$tmp/run/ckpt-4/model.safetensors" "$tmp/w.safetensors"
ln "$tmp/w.safetensors" "$tmp/hard.safetensors"
ln -s "$tmp/w.safetensors" "$tmp/sym.safetensors"
sum=$(cksum <"$tmp/w.safetensors")
for out in "$tmp/w.safetensors" "$tmp/./w.safetensors" "$tmp/hard.safetensors" "$tmp/sym.safetensors"; do
  "$dw" quantize --recipe mxfp8 "$tmp/w.safetensors" "$out" >/dev/null 2>"$tmp/err"
  check "quantize IN ${out#"$tmp"/} (the same file) is refused" 2 $?
  has "  ... says so" "$tmp/err" "are the same file" "--in-place"
done
[ "$(cksum <"$tmp/w.safetensors")" = "$sum" ] && ok "  ... the input is untouched" || bad "  ... the input changed"
"$dw" quantize --recipe mxfp8 --in-place "$tmp/w.safetensors" "$tmp/w.safetensors" >/dev/null 2>"$tmp/err"
check "quantize --in-place replaces it on purpose" 0 $?
grep -q '"deepwell.recipe": *"mxfp8"' <(head -c 20000 "$tmp/w.safetensors" | tr -d '\000') && ok "  ... quantised" ||
  bad "  ... not quantised"
"$dw" quantize --recipe mxfp8 "$tmp/run/ckpt-4/model.safetensors" "$tmp/other.safetensors" >/dev/null 2>&1
check "quantize into another file" 0 $?

# --- contradictory flags --------------------------------------------------------------------------
"$dw" train "${common[@]}" --lr 1e-3 --min-lr 2e-3 --steps 1 --out "$tmp/x1" >/dev/null 2>"$tmp/err"
check "--min-lr above --lr" 2 $?
has "  ... names both" "$tmp/err" "--min-lr 0.002 is above --lr 0.001"
"$dw" train "${common[@]}" --lr 1e-5 --steps 1 --out "$tmp/x2" >/dev/null 2>&1
check "a small --lr alone lowers the default floor with it" 0 $?
"$dw" train "${common[@]}" --sample-temp -1 --steps 1 --out "$tmp/x3" >/dev/null 2>"$tmp/err"
check "--sample-temp -1" 2 $?
has "  ... says why" "$tmp/err" "--sample-temp must be >= 0"
"$dw" sample "$tmp/run" --prompt a --temperature -1 >/dev/null 2>&1
check "sample --temperature -1" 2 $?

# --- non-regular files as data: refused at once, not a hang -----------------------------------------
mkfifo "$tmp/fifo"
timeout 20 "$dw" train "${common[@]}" --data "$tmp/fifo" --steps 1 --out "$tmp/x4" >/dev/null 2>"$tmp/err"
check "a FIFO as --data is refused (no hang)" 2 $?
has "  ... naming it" "$tmp/err" "$tmp/fifo: a FIFO (named pipe), not a regular file"
timeout 20 "$dw" train "${common[@]}" --data builtin --val "$tmp/fifo" --steps 1 --out "$tmp/x5" >/dev/null 2>"$tmp/err"
check "a FIFO as --val is refused (no hang)" 2 $?
timeout 20 "$dw" train "${common[@]}" --data /dev/null --steps 1 --out "$tmp/x6" >/dev/null 2>"$tmp/err"
check "a character device as --data is refused" 2 $?
has "  ... naming it" "$tmp/err" "/dev/null: a character device"

# --- every other file read by name: JSON (policy, config, hardware, shard index), safetensors, shards
mkdir -p "$tmp/pdir" "$tmp/fcfg" "$tmp/fst" "$tmp/fsh"
mkfifo "$tmp/fcfg/config.json"
cp "$tmp/model/config.json" "$tmp/fst/" && mkfifo "$tmp/fst/model.safetensors"
cp "$tmp/model/config.json" "$tmp/fsh/" && mkfifo "$tmp/fsh/model-00001-of-00001.safetensors"
echo '{"weight_map": {"wte.weight": "model-00001-of-00001.safetensors"}}' >"$tmp/fsh/model.safetensors.index.json"
refused() { # refused DESCRIPTION NAMED-TEXT COMMAND...: exit 2 within the timeout, naming the file
  local d=$1 t=$2; shift 2
  timeout 20 "$@" >/dev/null 2>"$tmp/err"
  check "$d is refused (no hang)" 2 $?
  has "  ... naming it" "$tmp/err" "$t"
}
refused "a FIFO as --policy" "$tmp/fifo: a FIFO (named pipe), not a regular file" \
  "$dw" train "${common[@]}" --policy "$tmp/fifo" --steps 1 --out "$tmp/x7"
refused "a directory as --policy" "$tmp/pdir: a directory, not a regular file" \
  "$dw" train "${common[@]}" --policy "$tmp/pdir" --steps 1 --out "$tmp/x8"
refused "a FIFO as config.json" "$tmp/fcfg/config.json: a FIFO (named pipe)" "$dw" capture "$tmp/fcfg"
refused "a FIFO as --hw" "$tmp/fifo: a FIFO (named pipe)" "$dw" probe --hw "$tmp/fifo"
refused "/dev/zero as --hw (endless)" "/dev/zero: a character device" "$dw" probe --hw /dev/zero
refused "a FIFO to quant-report" "$tmp/fifo: a FIFO (named pipe)" "$dw" quant-report "$tmp/fifo"
refused "a FIFO to quantize" "$tmp/fifo: a FIFO (named pipe)" \
  "$dw" quantize --recipe mxfp8 "$tmp/fifo" "$tmp/q.safetensors"
refused "a FIFO as model.safetensors" "$tmp/fst/model.safetensors: a FIFO (named pipe)" \
  "$dw" sample "$tmp/fst" --prompt a -n 2 --device cpu
refused "a FIFO as a weight shard" "$tmp/fsh/model-00001-of-00001.safetensors: a FIFO (named pipe)" \
  "$dw" sample "$tmp/fsh" --prompt a -n 2 --device cpu

# --- a damaged `latest`: escaped bytes, and the newest good checkpoint named -------------------------
cp -r "$tmp/run" "$tmp/g"
printf 'ckpt-\001\033[2J\xff' >"$tmp/g/latest"
"$dw" train --resume "$tmp/g" --steps 6 >/dev/null 2>"$tmp/err"
check "garbage in latest" 2 $?
has "  ... escaped, with the good checkpoint and how to resume" "$tmp/err" 'got "ckpt-\x01\x1b[2J\xff"' \
  "the newest good checkpoint is $tmp/g/ckpt-4" "deepwell train --resume $tmp/g/ckpt-4 --out $tmp/g"
"$dw" sample "$tmp/g" --prompt a -n 2 >/dev/null 2>"$tmp/err"
check "sample of it too" 2 $?
has "  ... escaped" "$tmp/err" 'got "ckpt-\x01\x1b[2J\xff"'
grep -q $'\033' "$tmp/err" && bad "  ... a raw escape byte reached the terminal" || ok "  ... no raw control bytes"
echo ckpt-4 >"$tmp/g/latest"
printf 'x' >>"$tmp/g/ckpt-4/model.safetensors"
"$dw" train --resume "$tmp/g" --steps 6 >/dev/null 2>"$tmp/err"
check "a damaged latest checkpoint" 2 $?
has "  ... names the newest good one and how to resume from it" "$tmp/err" "$tmp/g/ckpt-4/model.safetensors" \
  "the newest good checkpoint is $tmp/g/ckpt-2" "deepwell train --resume $tmp/g/ckpt-2 --out $tmp/g"
"$dw" train --resume "$tmp/g/ckpt-2" --out "$tmp/g" --steps 6 >/dev/null 2>&1
check "  ... and that command works" 0 $?
[ "$(cat "$tmp/g/latest")" = ckpt-6 ] && ok "  ... latest is good again" || bad "  ... latest: $(cat "$tmp/g/latest")"
echo "$fails failed"
[ $fails -eq 0 ]
