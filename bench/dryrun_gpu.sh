#!/usr/bin/env bash
# dryrun_gpu.sh — on the GPU machine: builds `deepwell` (Jansson/cmocka from the carried .deps/),
# measures GEMM rates, profiles the engine's step, and runs `deepwell dryrun --run` (predicted vs
# measured memory and step time) for gpt2-124m and llama-1b. Logs in $OUT; summary last.
# Usage: bash bench/dryrun_gpu.sh [profile]   (profile: also `bench step --profile --json`)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
b=build-gpu
D=$b/deepwell
s=$(date +%s)
cmake -S . -B $b -G Ninja -DDW_CUDA=ON -DCMAKE_PREFIX_PATH="$deps" >"$out/configure.log" 2>&1 &&
  ninja -C $b -j "$(nproc)" deepwell >"$out/build.log" 2>&1 || { tail -40 "$out/configure.log" "$out/build.log"; exit 1; }
echo "== build $(( $(date +%s) - s )) s; commit $(git rev-parse --short HEAD 2>/dev/null || echo staged)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total,memory.used --format=csv | tee "$out/smi.txt"
timeout 60 $D bench gemm --json --shapes gpt2,llama,square --recipes bf16,fp8_block >"$out/gemm.json" 2>"$out/gemm.err"
echo "== bench gemm rc=$?"
if [ "${1:-}" = profile ]; then
  timeout 60 $D bench step gpt2-124m --batch 16 --seq 1024 --steps 10 --profile --json >"$out/step_gpt2.json" 2>&1
  echo "== bench step gpt2 rc=$?"; head -c 600 "$out/step_gpt2.json"; echo
  timeout 90 $D bench step llama-1b --batch 8 --seq 2048 --steps 5 --profile --json >"$out/step_llama.json" 2>&1
  echo "== bench step llama rc=$?"; head -c 600 "$out/step_llama.json"; echo
fi
run() { # name, dryrun args...
  local n=$1; shift
  timeout 100 $D dryrun "$@" --hw h200 --gpus 1 --gemm-rates "$out/gemm.json" --run >"$out/dryrun_$n.txt" 2>&1
  echo "== dryrun $n rc=$?"
  grep -E "^plan:|gpu-run|measured|predicted:|^(PASS|FAIL)" "$out/dryrun_$n.txt"
}
run gpt2_bf16 gpt2-124m --seq 1024 --global-batch 16
run llama_bf16 llama-1b --seq 2048 --global-batch 8
run gpt2_fp8 gpt2-124m --seq 1024 --global-batch 16 --precision fp8_block
run gpt2_ga gpt2-124m --seq 1024 --global-batch 64
run llama_fp8 llama-1b --seq 2048 --global-batch 8 --precision fp8_block
