#!/usr/bin/env bash
# fp8block_sweep.sh — on the GPU machine: builds from source (scripts/gpu-verify.sh build), runs the
# test (parity of every GEMM backend, Deepwell's FP8 block kernel included), then times the FP8
# block kernel's variants against cuBLASLt's block-scaled path (and cuBLAS BF16) in one process each.
# Usage: bench/fp8block_sweep.sh SHAPES [BACKENDS...]   e.g. bench/fp8block_sweep.sh square,gpt2,llama
set -uo pipefail
cd "$(dirname "$0")/.."
shapes=${1:-square}
shift || true
backends=("$@")
[ ${#backends[@]} -eq 0 ] && backends=(deepwell_fp8block_sm90 deepwell_fp8block_sm90_3wg deepwell_fp8block_sm90_mc
                                       deepwell_fp8block_sm90_3wg_mc)
bash scripts/gpu-verify.sh build || exit 1 # into build-gpu, logs under $OUT
out=${OUT:-out} b=build-gpu
export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
s=$(date +%s)
timeout ${TEST_TIMEOUT:-150} $b/tests/gpu_test_gemm_gpu >"$out/test_gemm_gpu.log" 2>&1
trc=$?
tt=$(( $(date +%s) - s ))
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
# default selection (cuBLASLt for fp8_block unless the registry ranks the own kernel higher) + BF16
{
  timeout 60 $b/deepwell bench gemm --shapes "$shapes" --recipes bf16,fp8_block 2>&1
  for k in "${backends[@]}"; do
    timeout 25 $b/deepwell bench gemm --shapes "$shapes" --recipes fp8_block --backend "$k" 2>&1 | tail -n +2
  done
  # cuBLASLt once more at the end (drift of clocks over the run)
  timeout 25 $b/deepwell bench gemm --shapes "$shapes" --recipes fp8_block --backend cublaslt_fp8_sm90 2>&1 | tail -n +2
} | tee "$out/bench.txt"
# the test's outcome last, where the reply's tail shows it
echo "gpu_test_gemm_gpu rc=$trc ($tt s)"
grep -E "FAIL|ERROR|worst|PASSED|fp8block.*rel err|rel err [0-9.e-]+ over" "$out/test_gemm_gpu.log" | cut -c1-120 | tail -45
