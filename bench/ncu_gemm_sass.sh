#!/usr/bin/env bash
# ncu_gemm_sass.sh — on the GPU machine: where the warps of one GEMM kernel wait, per SASS
# instruction. Profiles one launch at 8192^3 (after 3 warm-up calls) with Nsight Compute's sampled
# warp states (SourceCounters), then prints the launch's shape (grid, cluster, registers) and the
# SASS with each instruction's stall samples as CSV under $OUT/sass_<backend>.csv.
# Usage: BIN=DIR bash bench/ncu_gemm_sass.sh BACKEND... (BIN holds a built deepwell)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
dw=${BIN:-build-gpu}/deepwell
export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
for k in "$@"; do
  rep="$out/rep_$k"
  timeout 240 ncu --clock-control none -k regex:fp8block_kernel --launch-skip 3 --launch-count 1 \
    --section LaunchStats --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
    -o "$rep" -f $dw bench gemm --shapes square --iters 1 --recipes fp8_block --backend "$k" >"$out/ncu_$k.log" 2>&1
  echo "== $k ncu rc=$?"
  ncu -i "$rep.ncu-rep" --page details 2>&1 | grep -E "Duration|Grid Size|Cluster|Registers Per|gmma_cycles|Warp Cycles Per Issued|Issue Slots|Stall" | cut -c1-140
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$out/sass_$k.csv" 2>"$out/sass_$k.err"
  echo "   source page rc=$? lines $(wc -l <"$out/sass_$k.csv")"
  rm -f "$rep.ncu-rep" "$out/sass_$k.err" # what comes back from the machine is limited in files
done
