#!/usr/bin/env bash
# step_ab.sh — A/B of the training step between two builds on one GPU, in one device call:
# `deepwell bench step` for each configuration, the two binaries alternated ROUNDS times (so clock
# and thermal drift fall on both), the median of each side's medians and their ratio printed as one
# table (and JSON lines under $OUT). Used to hold a refactoring to "within 2% of before".
# Usage: bash bench/step_ab.sh A_DEEPWELL B_DEEPWELL [ROUNDS]
#   CONFIGS (env): newline-separated `bench step` arguments; default gpt2-124m B16 T1024 and
#   llama-1b B8 T2048, each in bf16 and fp8_block.
#   A_ENV, B_ENV (env): NAME=VALUE words set for that side only, so one binary can be A/B'd against
#   itself over a knob, e.g. B_ENV="DW_SWIGLU_QUANT=0" bash bench/step_ab.sh D D (docs/environment.md).
set -u
a=$1 b=$2 rounds=${3:-3}
out=${OUT:-out}
mkdir -p "$out"
configs=${CONFIGS:-"gpt2-124m --vocab 50304 --batch 16 --seq 1024 --precision bf16
gpt2-124m --vocab 50304 --batch 16 --seq 1024 --precision fp8_block
llama-1b --batch 8 --seq 2048 --precision bf16
llama-1b --batch 8 --seq 2048 --precision fp8_block"}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
[ -n "${A_ENV:-}${B_ENV:-}" ] && echo "A: ${A_ENV:-(no env)}  B: ${B_ENV:-(no env)}"
printf '%-62s %12s %12s %8s %10s %10s\n' "config" "A tok/s" "B tok/s" "B/A" "A GiB" "B GiB"
while IFS= read -r cfg; do
  [ -z "$cfg" ] && continue
  ta=() tb=() ma="" mb=""
  for r in $(seq "$rounds"); do
    for side in a b; do
      bin=$a side_env=${A_ENV:-}
      [ $side = b ] && bin=$b side_env=${B_ENV:-}
      # shellcheck disable=SC2086 # side_env: NAME=VALUE words
      line=$(env $side_env timeout 300 "$bin" bench step $cfg --steps 10 --json 2>>"$out/step_ab.err" | tr -d '\n')
      echo "{\"side\": \"$side\", \"round\": $r, \"config\": \"$cfg\", \"result\": ${line:-null}}" >>"$out/step_ab.jsonl"
      tps=$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])' 2>/dev/null)
      mem=$(echo "$line" | python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["device_mem_gib"])' 2>/dev/null)
      if [ $side = a ]; then ta+=("${tps:-0}"); ma=$mem; else tb+=("${tps:-0}"); mb=$mem; fi
    done
  done
  read -r med_a med_b ratio < <(python3 -c '
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]; b = [float(x) for x in sys.argv[2].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"{ma:.0f} {mb:.0f} {mb / ma if ma else 0:.4f}")' "${ta[*]}" "${tb[*]}")
  printf '%-62s %12s %12s %8s %10s %10s\n' "$cfg" "$med_a" "$med_b" "$ratio" "${ma:-?}" "${mb:-?}"
done <<<"$configs"
