#!/usr/bin/env bash
# test_exit_codes.sh DEEPWELL — every command holds to one exit-status table (docs/cli.md,
# `deepwell --help`): 0 success, 1 runtime failure, 2 usage or bad input, 3 I/O failure, 128 + N
# interrupted. Standard output is checked: output into /dev/full (and a file-size limit, as a full
# disk) is an I/O failure with a message, never a silent success or the "bad input" status
# (issue 32, findings 6 and 8).
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
cmds="probe quantize quant-report capture eval plan dryrun bench compile train sample report"

"$dw" --help >"$tmp/help"; check "deepwell --help" 0 $?
has "  ... prints the exit-status table" "$tmp/help" "Exit status" "usage or bad input" "I/O failure" "128 + N"
for c in $cmds; do
  "$dw" $c --help >/dev/null; check "$c --help" 0 $?
  "$dw" $c --help >/dev/full 2>"$tmp/err"; check "$c --help into /dev/full: I/O failure" 3 $?
  has "  ... says so" "$tmp/err" "deepwell $c: cannot write standard output"
  "$dw" $c --no-such-flag >/dev/null 2>&1; check "$c with an unknown flag: usage" 2 $?
done
"$dw" --version >/dev/full 2>/dev/null; check "--version into /dev/full" 3 $?
"$dw" no-such-command >/dev/null 2>&1; check "an unknown command: usage" 2 $?

# real output into a full device: JSON, tables, generated text
"$dw" capture gpt2-tiny --json >/dev/full 2>"$tmp/err"; check "capture --json > /dev/full" 3 $?
has "  ... says the output is incomplete" "$tmp/err" "cannot write standard output" "incomplete"
"$dw" capture gpt2-tiny >/dev/full 2>/dev/null; check "capture (table) > /dev/full" 3 $?
"$dw" plan gpt2-124m --hw h200 --seq 1024 --global-batch 64 >/dev/full 2>/dev/null; check "plan > /dev/full" 3 $?
"$dw" plan gpt2-124m --hw h200 --seq 1024 --global-batch 64 --json >/dev/full 2>/dev/null; check "plan --json > /dev/full" 3 $?
"$dw" dryrun gpt2-124m --hw h200 --seq 1024 --global-batch 64 >/dev/full 2>/dev/null; check "dryrun > /dev/full" 3 $?
"$dw" probe --hw h100-sxm --json >/dev/full 2>/dev/null; check "probe --json > /dev/full" 3 $?
"$dw" sample gpt2-tiny --prompt "a" -n 4 --device cpu >/dev/full 2>/dev/null; check "sample > /dev/full" 3 $?
"$dw" capture gpt2-tiny --json >"$tmp/ok.json"; check "capture --json to a file" 0 $?
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/ok.json" && ok "  ... whole JSON" || bad "  ... JSON cut"

# missing input: I/O (3); malformed input: bad input (2)
"$dw" quant-report "$tmp/none.safetensors" >/dev/null 2>&1; check "quant-report of a missing file: I/O" 3 $?
"$dw" probe --hw "$tmp/none.json" >/dev/null 2>&1; check "probe --hw of a missing file: I/O" 3 $?
"$dw" quantize --recipe mxfp8 "$tmp/none.safetensors" "$tmp/o.safetensors" >/dev/null 2>&1
check "quantize of a missing file: I/O" 3 $?
echo '{"model_type": "gpt2", "n_layer": ' >"$tmp/bad.json"
"$dw" capture "$tmp/bad.json" >/dev/null 2>&1; check "capture of malformed JSON: bad input" 2 $?

# a full disk while writing a file (a file-size limit: writes fail with EFBIG): I/O, not usage
tiny_gpt2 "$tmp/model"
"$dw" train --model "$tmp/model" --data builtin --batch 2 --seq 16 --steps 1 --device cpu --out "$tmp/run" >/dev/null 2>&1
check "a tiny checkpoint" 0 $?
(trap '' XFSZ; ulimit -f 64; exec "$dw" quantize --recipe mxfp8 "$tmp/run/ckpt-1/model.safetensors" "$tmp/q.safetensors") \
  >/dev/null 2>"$tmp/err"
check "quantize onto a full disk: I/O failure" 3 $?
[ ! -e "$tmp/q.safetensors" ] && ok "  ... and no half-written OUT" || bad "  ... a partial OUT was left"
(trap '' XFSZ; ulimit -f 16; exec "$dw" train --resume "$tmp/run" --steps 2) >/dev/null 2>"$tmp/err"
check "train checkpointing onto a full disk: I/O failure" 3 $?
[ "$(cat "$tmp/run/latest")" = ckpt-1 ] && ok "  ... latest still names the good checkpoint" || bad "  ... latest: $(cat "$tmp/run/latest")"
# the docs agree: no sentence of docs/ or README.md gives an unreadable or missing file exit 2
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
python3 - "$src" >"$tmp/stale" <<'PY'
import glob, os, re, sys
root = sys.argv[1]
for p in sorted(glob.glob(os.path.join(root, "docs", "*.md")) + [os.path.join(root, "README.md")]):
    text = re.sub(r"\s+", " ", open(p, encoding="utf-8").read())
    for sent in re.split(r"(?<=[.;])\s", text):
        if re.search(r"unreadable|cannot be (opened|read)|missing (input )?file", sent) and \
           re.search(r"exits? (with )?(status )?2\b|exit 2\b", sent):
            print(f"{os.path.relpath(p, root)}: {sent.strip()[:200]}")
PY
[ ! -s "$tmp/stale" ] && ok "the docs give unreadable input exit 3, never 2" || bad "stale exit status in the docs: $(cat "$tmp/stale")"
echo "$fails failed"
[ $fails -eq 0 ]
