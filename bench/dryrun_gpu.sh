#!/usr/bin/env bash
# dryrun_gpu.sh — on the GPU machine: builds `deepwell` (Jansson/cmocka from the carried .deps/),
# measures GEMM rates, profiles the engine's step (bench step --profile --json), and runs
# `deepwell dryrun --run` (predicted vs measured memory and step time) for gpt2-124m (vocabulary
# 50304 and the preset's 50257) and llama-1b. Everything lands in $OUT/dryrun.tar.gz (the device
# tool returns few files); the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}/dryrun
mkdir -p "$out"
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
b=build-gpu
D=$b/deepwell
s=$(date +%s)
cmake -S . -B $b -G Ninja -DDW_CUDA=ON -DCMAKE_PREFIX_PATH="$deps" >"$out/configure.log" 2>&1 &&
  ninja -C $b -j "$(nproc)" deepwell >"$out/build.log" 2>&1 || { tail -40 "$out/configure.log" "$out/build.log"; exit 1; }
echo "== build $(( $(date +%s) - s )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total,memory.used,power.draw --format=csv >"$out/smi.txt"
timeout 60 $D bench gemm --json --shapes gpt2,llama,square,vocab --recipes bf16,fp8_block >"$out/gemm.json" 2>"$out/gemm.err"
echo "== bench gemm rc=$?"
mkdir -p "$out/gpt2v"
timeout 60 $D bench step gpt2-124m --vocab 50304 --batch 16 --seq 1024 --steps 10 --profile --json \
  --config-out "$out/gpt2v/config.json" >"$out/step_gpt2v.json" 2>&1; echo "== bench step gpt2 V50304 rc=$?"
timeout 90 $D bench step llama-1b --batch 8 --seq 2048 --steps 5 --profile --json >"$out/step_llama.json" 2>&1
echo "== bench step llama-1b rc=$?"
summary=()
run() { # name, dryrun args...
  local n=$1; shift
  timeout 100 $D dryrun "$@" --hw h200 --gpus 1 --gemm-rates "$out/gemm.json" --run >"$out/dryrun_$n.txt" 2>&1
  local rc=$?
  summary+=("$(printf '%-12s rc=%s  %s | %s' "$n" "$rc" "$(grep -o 'measured [0-9.]* GiB, predicted [0-9.]* GiB: ratio [0-9.]*' "$out/dryrun_$n.txt" | head -1)" \
    "$(grep -o 'mean step measured [0-9.e-]* s\|predicted [0-9.e-]* s: ratio [0-9.]*' "$out/dryrun_$n.txt" | tr '\n' ' ')")")
}
run gpt2v_bf16 "$out/gpt2v" --seq 1024 --global-batch 16
run llama_bf16 llama-1b --seq 2048 --global-batch 8
run gpt2v_ga "$out/gpt2v" --seq 1024 --global-batch 64
run gpt2v_fp8 "$out/gpt2v" --seq 1024 --global-batch 16 --precision fp8_block
run llama_fp8 llama-1b --seq 2048 --global-batch 8 --precision fp8_block
run gpt2_50257 gpt2-124m --seq 1024 --global-batch 16
tar -C "$out/.." -czf "${OUT:-out}/dryrun.tar.gz" dryrun
grep -h "^plan:\|Deepwell engine" "$out"/dryrun_*.txt
printf '%s\n' "${summary[@]}"
