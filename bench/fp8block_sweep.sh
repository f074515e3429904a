#!/usr/bin/env bash
# fp8block_sweep.sh — on the GPU machine: builds from source (scripts/gpu-verify.sh build), runs the
# test (parity of every GEMM backend, Deepwell's FP8 block kernel included), then times the FP8
# block kernel's variants against cuBLASLt's block-scaled path (and cuBLAS BF16) in one process each.
# Usage: bench/fp8block_sweep.sh SHAPES [BACKENDS...]   e.g. bench/fp8block_sweep.sh square,gpt2,llama
# BIN=DIR uses binaries built elsewhere (DIR/deepwell, DIR/gpu_test_gemm_gpu) instead of building;
# RECIPES (default fp8_block) may add fp8_block_1x128 (1x128 B scales, the engine's fp8_block).
set -uo pipefail
cd "$(dirname "$0")/.."
shapes=${1:-square}
shift || true
backends=("$@")
[ ${#backends[@]} -eq 0 ] && backends=(deepwell_fp8block_sm90 deepwell_fp8block_sm90_3wg deepwell_fp8block_sm90_mc
                                       deepwell_fp8block_sm90_3wg_mc)
out=${OUT:-out}
mkdir -p "$out"
if [ -n "${BIN:-}" ]; then
  dw=$BIN/deepwell test=$BIN/gpu_test_gemm_gpu
else
  bash scripts/gpu-verify.sh build || exit 1 # into build-gpu, logs under $OUT
  dw=build-gpu/deepwell test=build-gpu/tests/gpu_test_gemm_gpu
fi
recipes=${RECIPES:-fp8_block}
export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
s=$(date +%s)
timeout ${TEST_TIMEOUT:-90} stdbuf -oL $test >"$out/test_gemm_gpu.log" 2>&1
trc=$?
tt=$(( $(date +%s) - s ))
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
# default selection (cuBLASLt for fp8_block unless the registry ranks the own kernel higher) + BF16
{
  timeout 60 $dw bench gemm --shapes "$shapes" --recipes bf16,$recipes 2>&1
  for k in "${backends[@]}"; do
    timeout ${BENCH_TIMEOUT:-30} $dw bench gemm --shapes "$shapes" --recipes $recipes --backend "$k" 2>&1 | tail -n +2
  done
  # cuBLASLt once more at the end (drift of clocks over the run)
  timeout 30 $dw bench gemm --shapes "$shapes" --recipes $recipes --backend cublaslt_fp8_sm90 2>&1 | tail -n +2
} >"$out/bench.txt"
# one row per shape, one column per backend (TFLOP/s; a backend timed twice gets a second column)
awk '$4 == "bf16" || $4 ~ /^fp8_block/ {
       key = $1 "x" $2 "x" $3 ($4 == "fp8_block_1x128" ? "/1x128" : ""); col = $5;
       if ($4 == "bf16") key = $1 "x" $2 "x" $3; while ((key SUBSEP col) in v) col = col "+";
       if (!(col in seen)) { seen[col] = 1; cols[++nc] = col }
       if (!(key in kseen)) { kseen[key] = 1; keys[++nk] = key }
       v[key, col] = $7 }
     END { printf "%-18s", "shape"; for (c = 1; c <= nc; c++) printf " %s", cols[c]; print "";
           for (k = 1; k <= nk; k++) { printf "%-18s", keys[k];
             for (c = 1; c <= nc; c++) printf " %*s", length(cols[c]), ((keys[k], cols[c]) in v) ? v[keys[k], cols[c]] : "-";
             print "" } }' "$out/bench.txt"
# the test's outcome last, where the reply's tail shows it
echo "gpu_test_gemm_gpu rc=$trc ($tt s)"
grep -E "FAIL|ERROR|worst|PASSED|fp8block.*rel err|rel err [0-9.e-]+ over" "$out/test_gemm_gpu.log" | cut -c1-130 | tail -45
