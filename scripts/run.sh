#!/usr/bin/env bash
# run.sh — the main job: installs what is missing, builds Deepwell, trains the default model
# (llama-tiny preset, 0.85M parameters) on the built-in arithmetic data ("3+4=7") on the GPU when
# one is usable, else on the CPU, then samples from the trained checkpoint and asks it all 25
# questions "a+b=". Extra arguments go to `deepwell train` (e.g. --steps 600). DW_RUN_DIR sets the
# run directory, DW_DEVICE the device (auto|cpu|cuda), DW_BUILD_DIR an existing build to use
# instead of installing and building (as on the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DW_BUILD_DIR:-}
if [ -z "$build" ]; then
  scripts/deps.sh build
  scripts/build.sh build -DDW_TESTS=OFF # the tests need cmocka, which only scripts/test.sh installs
  /usr/bin/python3 -m pip install --quiet --no-build-isolation --no-deps --no-index --break-system-packages \
    --root-user-action=ignore $([ "$(id -u)" -ne 0 ] && echo --user) ./python # import deepwell (docs/python.md)
  build=build
fi
dw=./$build/deepwell
device=${DW_DEVICE:-auto}
# sampling a few tokens from the tiny model is quick anywhere: on the CPU unless a device is named
sample_device=$device; [ "$sample_device" = auto ] && sample_device=cpu
out=${DW_RUN_DIR:-out/run-$(date +%Y%m%d-%H%M%S)}
echo "== training llama-tiny on the built-in addition facts (device $device); run directory: $out =="
$dw train --model llama-tiny --data builtin --device "$device" --out "$out" \
  --steps 160 --batch 8 --seq 64 --lr 3e-3 --min-lr 3e-4 --warmup 10 --eval-every 20 \
  --sample-every 80 --sample-tokens 48 --sample-temp 0.5 --ckpt-every 40 --log-every 10 "$@"
echo "== the trained model writes facts (deepwell sample $out --prompt \$'1+1=2\\n' -n 72 --temperature 0.5) =="
$dw sample "$out" --device "$sample_device" --prompt $'1+1=2\n' -n 72 --temperature 0.5 --seed 7 | sed '$d'
echo "== and answers every question a+b= (greedy) =="
right=0
answers=()
for a in 0 1 2 3 4; do
  for b in 0 1 2 3 4; do
    line=$($dw sample "$out" --device "$sample_device" --prompt $'\n'"$a+$b=" -n 1 --temperature 0 | tail -n 1)
    answers+=("$line")
    [ "$line" = "$a+$b=$((a + b))" ] && right=$((right + 1))
  done
done
echo "${answers[*]}"
echo "== $right of 25 answers are correct; training curve: $out/metrics.jsonl =="
