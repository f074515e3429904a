#!/usr/bin/env bash
# test_sample_recompute.sh DEEPWELL — sampling with the K/V cache after training under recompute.
# The cache's prefill keeps each attention node's keys and values; under --recompute full a
# block's inner values are gone once the block's forward has read them, and the prefill once
# copied them after the whole forward, from memory later blocks had written (other samples, no
# error). Training is the same bits with and without recompute, so a tiny Llama's sample after 3
# CPU steps is the same text under --recompute none, selective and full, and the same as without
# the cache (DW_KV_CACHE=0).
set -u
bin=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
run() { # run NAME RECOMPUTE [ENV...]
  local name=$1 rc=$2
  shift 2
  env "$@" "$bin" train --model llama-tiny --data builtin --batch 2 --seq 32 --eval-every 0 --ckpt-minutes 0 \
    --device cpu --precision bf16 --steps 3 --recompute "$rc" --sample-every 3 --sample-tokens 24 --seed 11 \
    --out "$tmp/run_$name" >"$tmp/$name.out" 2>&1
  check "train --recompute $rc${*:+ $*} with a sample at step 3" 0 $?
  # the sample: the bytes from its header to the closing line
  python3 -c 'import sys; t = open(sys.argv[1], "rb").read(); i = t.find(b"--- sample after step 3")
sys.exit(1) if i < 0 else open(sys.argv[2], "wb").write(t[i:t.find(b"\n---\n", i + 1)])' \
    "$tmp/$name.out" "$tmp/$name.sample" || bad "$name: no sample in the output"
}
run none none
run selective selective
run full full
run nocache none DW_KV_CACHE=0
for name in selective full nocache; do
  if cmp -s "$tmp/none.sample" "$tmp/$name.sample"; then ok "the $name sample is none's byte for byte"
  else bad "the $name sample differs from none's: $(od -c "$tmp/$name.sample" | head -3)"; fi
done
[ -s "$tmp/none.sample" ] && ok "a sample was written" || bad "empty sample"

[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all sample recompute checks passed"
