#!/usr/bin/env bash
# test_capture_eval.sh DEEPWELL — `deepwell eval` end to end: raw bytes and llm.c shards (both
# token widths) give the same loss for the same tokens, --weights with an all-zero model gives
# exactly ln(V), and bad input exits 2 with a message (a missing file 3). eval reads --data with
# train's reader: a bad-magic .bin is refused the same way (issue 32, finding 8); a run directory
# is evaluated as its newest checkpoint.
set -u
dw=$1
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
py=/usr/bin/python3
fails=0
check() { # check DESCRIPTION EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL: $1 (exit $3, expected $2)"; cat "$tmp/err" 2>/dev/null; fails=$((fails + 1)); else echo "ok: $1"; fi
}
has() { # has DESCRIPTION FILE TEXT
  if grep -qF -- "$3" "$2"; then echo "ok: $1"; else echo "FAIL: $1: '$3' not in:"; cat "$2"; fails=$((fails + 1)); fi
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
loss() { sed -n 's/^loss \([0-9.]*\).*/\1/p' "$1"; }

head -c 4000 /dev/urandom >"$tmp/raw"
$py - "$tmp" <<'PY'
import sys, numpy as np
d = sys.argv[1]
b = np.frombuffer(open(d + "/raw", "rb").read(), dtype=np.uint8)
for magic, ver, dt, name in [(20240520, 1, np.uint16, "s16.bin"), (20240801, 7, np.uint32, "s32.bin")]:
    h = np.zeros(256, np.int32); h[0], h[1], h[2] = magic, ver, len(b)
    open(d + "/" + name, "wb").write(h.tobytes() + b.astype(dt).tobytes())
PY
for m in gpt2-tiny llama-tiny qwen2-tiny; do
  "$dw" eval $m --data "$tmp/raw" --batch 2 --seq 32 >"$tmp/o_raw" 2>"$tmp/err"; check "eval $m raw bytes" 0 $?
  "$dw" eval $m --data "$tmp/s16.bin" --batch 2 --seq 32 >"$tmp/o16" 2>"$tmp/err"; check "eval $m uint16 shard" 0 $?
  "$dw" eval $m --data "$tmp/s32.bin" --batch 2 --seq 32 >"$tmp/o32" 2>"$tmp/err"; check "eval $m uint32 shard" 0 $?
  has "$m: initialised notice" "$tmp/err" "initialised from seed 1337"
  a=$(loss "$tmp/o_raw"); b=$(loss "$tmp/o16"); c=$(loss "$tmp/o32")
  if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ]; then echo "ok: $m same loss $a from all three"; else echo "FAIL: $m losses '$a' '$b' '$c'"; fails=$((fails + 1)); fi
  # near-uniform predictions at init (std 0.02): close to ln 256 = 5.545
  $py -c "import sys; l=float('$a'); sys.exit(0 if abs(l - 5.545) < 0.3 else 1)" && echo "ok: $m init loss $a ~ ln 256" || { echo "FAIL: $m init loss $a"; fails=$((fails + 1)); }
done

# All-zero weights: logits are all zero, so the loss is exactly ln(V) whatever the tokens.
mkdir "$tmp/zero"
$py - "$tmp/zero" "$src/tests/python" <<'PY'
import json, sys, torch
sys.path.insert(0, sys.argv[2])
from parity import st_write, param_shapes
c = dict(model_type="gpt2", vocab_size=256, n_embd=16, n_layer=2, n_head=2, n_inner=32, n_positions=64,
         layer_norm_epsilon=1e-5, activation_function="gelu_new")
c["tie_word_embeddings"] = True
json.dump(c, open(sys.argv[1] + "/config.json", "w"))
st_write(sys.argv[1] + "/zeros.safetensors", {k: torch.zeros(s) for k, s in param_shapes(c).items()})
import os; os.makedirs(sys.argv[1] + "/../small"); c["vocab_size"] = 200
json.dump(c, open(sys.argv[1] + "/../small/config.json", "w"))
PY
"$dw" eval "$tmp/zero" --data "$tmp/raw" --batch 3 --seq 20 --weights "$tmp/zero/zeros.safetensors" >"$tmp/o" 2>"$tmp/err"; check "eval --weights" 0 $?
$py -c "import math,sys; l=float('$(loss "$tmp/o")'); sys.exit(0 if abs(l - math.log(256)) < 1e-6 else 1)" && echo "ok: zero model loss = ln 256" || { echo "FAIL: zero model loss $(cat "$tmp/o")"; fails=$((fails + 1)); }

head -c 50 /dev/urandom >"$tmp/short"
"$dw" eval gpt2-tiny --data "$tmp/short" --batch 2 --seq 32 >"$tmp/o" 2>"$tmp/err"; check "data too short" 2 $?
has "short data message" "$tmp/err" "1 window(s) of --seq 32 + 1 tokens; --batch 2 needs 2"
"$dw" eval "$tmp/small" --data "$tmp/s16.bin" --batch 4 --seq 60 >"$tmp/o" 2>"$tmp/err"; check "token beyond vocab" 2 $?
has "vocab message" "$tmp/err" "is >= the model's vocab_size 200"
"$dw" eval gpt2-tiny --batch 2 >"$tmp/o" 2>"$tmp/err"; check "missing --data" 2 $?
"$dw" eval --data "$tmp/raw" >"$tmp/o" 2>"$tmp/err"; check "missing MODEL" 2 $?
"$dw" eval gpt2-tiny --data "$tmp/raw" --batch 0 >"$tmp/o" 2>"$tmp/err"; check "bad --batch" 2 $?
"$dw" eval gpt2-tiny --data "$tmp/raw" --seq 257 >"$tmp/o" 2>"$tmp/err"; check "seq beyond positions" 2 $?
"$dw" eval gpt2-tiny --data "$tmp/nope" >"$tmp/o" 2>"$tmp/err"; check "missing data file: I/O" 3 $?
has "  ... named" "$tmp/err" "$tmp/nope: no file matches"

# one reader with train: a .bin without a shard's magic is refused the same way by both, not read
# as raw bytes; a FIFO is refused by name; a glob and builtin work as they do for train
cp "$tmp/raw" "$tmp/junk.bin"
"$dw" eval gpt2-tiny --data "$tmp/junk.bin" --batch 2 --seq 32 >"$tmp/o" 2>"$tmp/err"; check "eval: a bad-magic .bin" 2 $?
grep -o "junk.bin: byte offset 0: bad magic.*" "$tmp/err" >"$tmp/eval_msg"
has "  ... refused as a shard" "$tmp/eval_msg" "bad magic"
"$dw" train --model gpt2-tiny --data "$tmp/junk.bin" --batch 2 --seq 32 --steps 1 --device cpu --out "$tmp/tr" \
  >/dev/null 2>"$tmp/err"; check "train: the same .bin" 2 $?
grep -o "junk.bin: byte offset 0: bad magic.*" "$tmp/err" >"$tmp/train_msg"
cmp -s "$tmp/eval_msg" "$tmp/train_msg" && echo "ok:   ... with the same message" ||
  { echo "FAIL: eval and train say different things: $(cat "$tmp/eval_msg") / $(cat "$tmp/train_msg")"; fails=$((fails + 1)); }
mkfifo "$tmp/fifo"
timeout 20 "$dw" eval gpt2-tiny --data "$tmp/fifo" --batch 2 --seq 32 >"$tmp/o" 2>"$tmp/err"; check "eval: a FIFO (no hang)" 2 $?
has "  ... named" "$tmp/err" "$tmp/fifo: a FIFO (named pipe)"
"$dw" eval gpt2-tiny --data "$tmp/s*.bin" --batch 2 --seq 32 >"$tmp/o" 2>"$tmp/err"; check "eval: a glob of shards" 0 $?
"$dw" eval gpt2-tiny --data builtin --batch 2 --seq 32 >"$tmp/o" 2>"$tmp/err"; check "eval: builtin" 0 $?
"$dw" eval gpt2-tiny --data "$tmp/raw" --weights "$tmp/zero/zeros.safetensors" >"$tmp/o" 2>"$tmp/err"; check "weights of another shape" 2 $?
has "shape message names the tensor" "$tmp/err" "transformer.wte.weight"
"$dw" eval llama-8b --data "$tmp/raw" >"$tmp/o" 2>"$tmp/err"; rc=$?
[ $rc -ne 0 ] && has "planning-only refused" "$tmp/err" "planning-only" || { echo "FAIL: llama-8b eval exit $rc"; fails=$((fails + 1)); }
"$dw" eval --help >"$tmp/o" 2>&1; check "--help" 0 $?

# a run directory is read as its newest checkpoint (`latest`), with that checkpoint's weights
OMP_NUM_THREADS=1 "$dw" train --model llama-tiny --data "$tmp/raw" --batch 2 --seq 32 --steps 2 --warmup 1 \
  --eval-every 0 --ckpt-every 1 --keep 0 --device cpu --out "$tmp/run" >/dev/null 2>"$tmp/err"; check "train a run" 0 $?
"$dw" eval "$tmp/run" --data "$tmp/raw" --batch 2 --seq 32 >"$tmp/o_run" 2>"$tmp/err"; check "eval RUN" 0 $?
"$dw" eval "$tmp/run/ckpt-2" --data "$tmp/raw" --batch 2 --seq 32 >"$tmp/o_c2" 2>"$tmp/err"; check "eval RUN/ckpt-2" 0 $?
"$dw" eval "$tmp/run/ckpt-1" --data "$tmp/raw" --batch 2 --seq 32 >"$tmp/o_c1" 2>"$tmp/err"; check "eval RUN/ckpt-1" 0 $?
a=$(loss "$tmp/o_run"); b=$(loss "$tmp/o_c2"); c=$(loss "$tmp/o_c1")
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ]; then echo "ok: eval RUN = its newest checkpoint ($a; ckpt-1 $c)"
else echo "FAIL: eval RUN '$a', ckpt-2 '$b', ckpt-1 '$c'"; fails=$((fails + 1)); fi

echo "$fails failed"
[ $fails -eq 0 ]
