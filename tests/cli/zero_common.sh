# zero_common.sh — what the ZeRO tests on CPU ranks share (sourced after dw=DEEPWELL, not a test
# itself: ctest runs test_*.sh): checks.sh with ranks_env, a tiny GPT-2 in $tmp/model and text in
# $tmp/text.txt; same_ckpt and close compare two runs.
. "$(dirname "$0")/checks.sh"
ranks_env

tiny_gpt2 "$tmp/model"
cat "$0" "$(dirname "$0")/checks.sh" "$(dirname "$0")/test_dp.sh" >"$tmp/text.txt"

same_ckpt() { # same_ckpt DIR_A DIR_B: every file of the step-4 checkpoint but state.json, byte for byte
  local f ok=1
  for f in model.safetensors $(cd "$1/ckpt-4" && ls optimizer-*); do
    cmp -s "$1/ckpt-4/$f" "$2/ckpt-4/$f" || { ok=0; echo "differs: $f"; }
  done
  [ $ok = 1 ]
}
close() { # close A.jsonl B.jsonl TOL [FROM]: the losses (and val losses) of B equal A's from step FROM+1 on
  python3 - "$@" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
b = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
tol, skip = float(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 0
a = a[skip:]
assert len(a) == len(b) and len(b) > 0, (len(a), len(b))
for x, y in zip(a, b):
    assert x["step"] == y["step"], (x, y)
    for k in ("loss", "val_loss"):
        assert (k in x) == (k in y), (k, x, y)
        if k in x: assert abs(x[k] - y[k]) <= tol * abs(x[k]), (k, x, y)
PY
}
