#!/usr/bin/env bash
# run_bw.sh — one device call for the bandwidth-bound op kernels (bench/RESULTS.md "Bandwidth-bound
# kernels"): builds this tree (and, when BASE names another staged tree, that one too, for the
# before numbers), runs the CUDA op tests, times the ops against a device-to-device copy
# (DW_BENCH_OPS=1 gpu_test_bw_ops) and profiles the Llama-1B and GPT-2 training steps.
# Usage (on the GPU machine, from the staged dir, .deps carried): [BASE=DIR] bash bench/run_bw.sh
set -u
out=${OUT:-out}
mkdir -p "$out"
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
build() { # DIR TARGETS...
  local d=$1; shift
  (cd "$d" && cmake -S . -B build-gpu -G Ninja -DDW_CUDA=ON -DCMAKE_PREFIX_PATH="$deps" >/dev/null &&
    ninja -C build-gpu -j "${JOBS:-16}" "$@" >build.log 2>&1) || { tail -30 "$d/build.log"; return 1; }
}
s=$(date +%s)
build . deepwell tests/gpu_test_ops_cuda tests/gpu_test_bw_ops tests/gpu_test_engine_cuda tests/gpu_test_train_cuda &
p1=$!
if [ -n "${BASE:-}" ]; then
  cp tests/gpu/test_bw_ops.c "$BASE/tests/gpu/" # the same microbenchmark over the old kernels
  ln -sfn "$PWD/.deps" "$BASE/.deps"
  build "$BASE" deepwell tests/gpu_test_bw_ops & p2=$!
  wait $p2 || echo "BUILD base failed"
fi
wait $p1 || { echo "BUILD failed"; exit 1; }
echo "BUILD $(( $(date +%s) - s )) s"
b=build-gpu
for t in gpu_test_ops_cuda gpu_test_bw_ops; do
  s=$(date +%s); timeout 150 "$b/tests/$t" >"$out/$t.log" 2>&1; rc=$?
  echo "TEST $t rc=$rc ($(( $(date +%s) - s )) s)"; [ $rc -ne 0 ] && grep -E "MISMATCH|FAIL|error" "$out/$t.log" | head -8
done
DW_BENCH_OPS=1 timeout 150 "$b/tests/gpu_test_bw_ops" >"$out/bw_new.log" 2>&1; echo "BW new rc=$?"
if [ -n "${BASE:-}" ]; then
  DW_BENCH_OPS=1 timeout 150 "$BASE/$b/tests/gpu_test_bw_ops" >"$out/bw_base.log" 2>&1; echo "BW base rc=$?"
fi
if [ "${NCU:-0}" = 1 ]; then # hardware counters of one launch of each op kernel (the check run)
  timeout 200 ncu --clock-control none -k "regex:dw_norm_|dw_xent_row|dw_rope_kernel|dw_colsum" \
    --launch-count "${NCU_COUNT:-14}" --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis "$b/tests/gpu_test_bw_ops" >"$out/ncu.txt" 2>&1
  echo "NCU rc=$?"
fi
step() { # TAG DEEPWELL ARGS...
  local tag=$1 dwb=$2; shift 2
  timeout 120 "$dwb" bench step "$@" --profile >"$out/step_$tag.txt" 2>&1; echo "STEP $tag rc=$?"
}
step llama_new $b/deepwell llama-1b --batch 8 --seq 2048 --steps 10
[ -n "${BASE:-}" ] && step llama_base "$BASE/$b/deepwell" llama-1b --batch 8 --seq 2048 --steps 10
step gpt2_new $b/deepwell gpt2-124m --vocab 50304 --batch 16 --seq 1024
[ -n "${BASE:-}" ] && step gpt2_base "$BASE/$b/deepwell" gpt2-124m --vocab 50304 --batch 16 --seq 1024
# summary: the op table(s) and the step lines; then the engine test (the slowest part)
for f in "$out"/bw_new.log "$out"/bw_base.log; do [ -f "$f" ] && { echo "== $f"; grep "^BW" "$f"; }; done
for f in "$out"/step_*.txt; do
  echo "== $f"; grep -iE "tokens/s|ms/step" "$f" | head -2
  grep -E "^  (rmsnorm|layernorm|rope|cross_entropy|swiglu|gelu|add|embedding|position) " "$f"
done
[ -f "$out/ncu.txt" ] && grep -E "^  dw_|^  void dw_|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Block Limit Reg|Block Limit Shared" "$out/ncu.txt" | sed 's/  */ /g' | cut -c1-110
if [ "${ENGINE_TEST:-1}" = 1 ]; then
  for t in gpu_test_engine_cuda gpu_test_train_cuda; do
    s=$(date +%s); timeout 120 "$b/tests/$t" >"$out/$t.log" 2>&1
    echo "TEST $t rc=$? ($(( $(date +%s) - s )) s)"
  done
fi
