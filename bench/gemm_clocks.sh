#!/usr/bin/env bash
# gemm_clocks.sh — on the GPU machine: times GEMMs short (the default 20 calls per batch)
# and sustained (ITERS calls per batch, seconds of load), sampling the SM clock, power draw and
# throttle reasons with nvidia-smi every 50 ms during each run, to tell a kernel that issues too
# slowly from one that the card's power limit slows down. One line per run: backend, recipe,
# TFLOP/s (one per shape, in `deepwell bench gemm` order), mean and min SM clock (MHz), mean and
# max power (W), throttle-reason bits seen. SHAPES (default square) as `bench gemm --shapes`.
# Usage: BIN=DIR bench/gemm_clocks.sh [RECIPE:BACKEND ...]   (BACKEND "-": the registry's choice;
# RECIPE "torch": PyTorch's anchors, bench/gemm_anchor.py). ITERS (default 400) sets the long runs.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
dw=${BIN:-build-gpu}/deepwell
iters=${ITERS:-400}
shapes=${SHAPES:-square}
export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(bf16:- fp8_tensor:- fp8_block:cublaslt_fp8_sm90 fp8_block:deepwell_fp8block_sm90_3wg
                               fp8_block:deepwell_fp8block_sm90_n192 torch:-)
printf '%-8s %-34s %-16s %6s %8s %8s %7s %7s %s\n' iters backend recipe tflops clk_mean clk_min w_mean w_max throttle
for n in 20 "$iters"; do
  for r in "${runs[@]}"; do
    recipe=${r%%:*} be=${r#*:}
    log="$out/clk_${recipe}_${be}_$n.csv"
    nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader,nounits \
      -lms 50 >"$log" 2>/dev/null &
    smi=$!
    sleep 0.3
    if [ "$recipe" = torch ]; then
      res=$(timeout 120 python3 bench/gemm_anchor.py --shapes "$shapes" --iters "$n" 2>/dev/null |
            python3 -c 'import json,sys; print(" ".join("%s/%s=%.0f" % (x["backend"], x["recipe"], x["tflops"]) for x in json.load(sys.stdin)))')
    else
      args=(--shapes "$shapes" --recipes "$recipe" --iters "$n" --json)
      [ "$be" != - ] && args+=(--backend "$be")
      res=$(timeout 120 "$dw" bench gemm "${args[@]}" 2>/dev/null |
            python3 -c 'import json,sys; print(" ".join("%.0f" % x["tflops"] for x in json.load(sys.stdin)))')
    fi
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null
    # samples under load only (power above 200 W), to leave the start-up out; the power reading lags
    # the load by about a second, so a short run may have no such sample (clock and power then 0)
    awk -F', *' -v it="$n" -v be="$be" -v rc="$recipe" -v res="$res" '
      $2 + 0 > 200 { c += $1; if (!cm || $1 < cm) cm = $1; w += $2; if ($2 > wm) wm = $2; k++; t[$3] = 1 }
      END { th = ""; for (x in t) th = th x " "; if (!k) { c = w = 0; k = 1 }
            printf "%-8s %-34s %-16s %6s %8.0f %8.0f %7.0f %7.0f %s\n", it, be, rc, res, c / k, cm, w / k, wm, th }' "$log"
  done
done
